// gz-bench train: training throughput of the LibTorch front ends (single, dp, ddp, horovod) on the
// built-in cnn and bert-small models with synthetic inputs. Prints samples/s on rank 0.
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "bench_memory.h"
#include "gz/core/deadline.h"
#include "gz/core/env.h"
#include "gz/core/error.h"
#include "gz/core/timeline.h"
#include "gz/torch/async_model_averager.h"
#include "gz/torch/compression.h"
#include "gz/torch/fused_adamw.h"
#include "gz/torch/local_sgd.h"
#include "gz/torch/process_group.h"
#include "gz/train/models/model.h"
#include "gz/train/parallel_strategy.h"
#include "train/strategy/fsdp_strategy.h"

namespace {

struct TrainBenchOptions {
  std::string model = "cnn";
  gz::train::ParallelMode mode = gz::train::ParallelMode::ddp;
  std::string backend = "auto";
  int64_t batch = 32;
  int steps = 50;
  int warmup = 5;
  int threads = 1;
  int64_t seq = 128;
  std::string kernels = "fused";
  std::string hook = "allreduce";
  int64_t cycle_us = -1;  // horovod negotiation cycle; -1 = DistributedOptimizerOptions' default
  bool row_sparse = true;
  double bucket_mb = -1;  // -1: the library's defaults
  double first_bucket_mb = -1;
  int zero = 0;                        // ddp mode: ZeRO stage (0 = plain DDP)
  bool prefetch = true;                // --zero 3: gz::FullyShardOptions::prefetch
  bool memory = false;                 // print what gradients, optimizer state and the process hold
  gz::CompressionOptions compression;  // --powersgd-rank, --topk-ratio, --int8-chunk, --start-step
  std::string averaging = "none";      // none, local_sgd, async
  int64_t period = 8;
  int64_t staleness = 4;
};

// Bytes this process's network namespace sent so far (every interface but loopback): what really
// went over the simulated hosts' links, headers included.
long long wire_tx_bytes() {
  std::ifstream f("/proc/net/dev");
  std::string line;
  long long total = 0;
  for (int i = 0; std::getline(f, line); ++i) {
    if (i < 2) continue;  // two header lines
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    name.erase(0, name.find_first_not_of(' '));
    if (name == "lo") continue;
    std::istringstream in(line.substr(colon + 1));
    long long v[9] = {};
    for (auto& x : v) in >> x;  // rx: bytes packets errs drop fifo frame compressed multicast; tx: bytes
    total += v[8];
  }
  return total;
}

int usage() {
  std::fprintf(
      stderr,
      "usage: gzrun --nproc-per-node N gz-bench train [options]\n"
      "  --model cnn|bert-small|bert-base (default cnn; bert-base: 12 layers, hidden 768,\n"
      "                           12 heads, FFN 3072, the bert-small architecture at BERT-base size)\n"
      "  --mode single|dp|ddp|horovod (default ddp; single and dp run in one process,\n"
      "                           dp = 2 CPU replicas in threads of one process)\n"
      "  --batch B                samples per rank (per replica in dp mode), default 32\n"
      "  --steps S                timed steps (default 50)\n"
      "  --warmup W               untimed steps first (default 5)\n"
      "  --threads T              LibTorch intra-op threads per rank (default 1)\n"
      "  --seq L                  bert sequence length (default 128)\n"
      "  --backend NAME           communicator backend (default auto)\n"
      "  --kernels fused|torch    fused: gz::FusedAdamW, fused_dropout, max_pool2d_relu (default);\n"
      "                           torch: LibTorch's AdamW, dropout, max_pool2d and relu\n"
      "  --hook allreduce|none|fp16|bf16|powersgd|int8|topk\n"
      "                           ddp: the comm hook; horovod: the compression (allreduce = none).\n"
      "                           none skips the gradient all-reduce (a diagnostic: what DDP costs\n"
      "                           apart from communication)\n"
      "  --powersgd-rank R --topk-ratio F --int8-chunk N --start-step N   compression knobs\n"
      "  --averaging none|local_sgd|async   ddp mode: model averaging instead of gradient all-reduce\n"
      "  --period H               local_sgd: average every H steps (default 8)\n"
      "  --staleness S            async: staleness bound in steps (default 4)\n"
      "  --cycle-us US            horovod mode: negotiation cycle time (default: the library's)\n"
      "  --row-sparse on|off      ddp/horovod: mostly-zero gradient rows (the token embedding's)\n"
      "                           travel as rows (default on, as in the library)\n"
      "  --bucket-mb MB           ddp: bucket cap (horovod: replay bucket cap); default the library's\n"
      "  --first-bucket-mb MB     ddp: first bucket's cap; default the library's\n"
      "  --zero 0|1|2|3           ddp mode: ZeRO stage (1: optimizer state sharded, 2: gradients too,\n"
      "                           3: parameters too, gz::fully_shard)\n"
      "  --no-prefetch            --zero 3: gather each unit only when it runs (no overlap with the\n"
      "                           unit before it); printed as prefetch=on|off (n/a below stage 3)\n"
      "  --memory                 print MEMORY lines: optimizer state and gradient bytes per rank\n"
      "                           (tensors), RSS, anonymous and shared memory growth, peak RSS\n");
  return 2;
}

TrainBenchOptions parse(int argc, char** argv) {
  TrainBenchOptions o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) GZ_THROW(gz::InvalidArgument, "gz-bench train: ", a, " needs a value");
      return argv[++i];
    };
    if (a == "--model")
      o.model = next();
    else if (a == "--mode")
      o.mode = gz::train::parse_parallel_mode(next());
    else if (a == "--backend")
      o.backend = next();
    else if (a == "--batch")
      o.batch = gz::parse_int(next(), "--batch");
    else if (a == "--steps")
      o.steps = static_cast<int>(gz::parse_int(next(), "--steps"));
    else if (a == "--warmup")
      o.warmup = static_cast<int>(gz::parse_int(next(), "--warmup"));
    else if (a == "--threads")
      o.threads = static_cast<int>(gz::parse_int(next(), "--threads"));
    else if (a == "--seq")
      o.seq = gz::parse_int(next(), "--seq");
    else if (a == "--kernels")
      o.kernels = next();
    else if (a == "--hook")
      o.hook = next();
    else if (a == "--cycle-us")
      o.cycle_us = gz::parse_int(next(), "--cycle-us");
    else if (a == "--row-sparse") {
      auto v = next();
      if (v != "on" && v != "off")
        GZ_THROW(gz::InvalidArgument, "gz-bench train: --row-sparse on|off, got ", v);
      o.row_sparse = v == "on";
    } else if (a == "--bucket-mb")
      o.bucket_mb = std::stod(next());
    else if (a == "--first-bucket-mb")
      o.first_bucket_mb = std::stod(next());
    else if (a == "--zero")
      o.zero = static_cast<int>(gz::parse_int(next(), "--zero"));
    else if (a == "--no-prefetch")
      o.prefetch = false;
    else if (a == "--memory")
      o.memory = true;
    else if (a == "--powersgd-rank")
      o.compression.powersgd_rank = gz::parse_int(next(), "--powersgd-rank");
    else if (a == "--topk-ratio")
      o.compression.topk_ratio = gz::parse_double(next(), "--topk-ratio");
    else if (a == "--int8-chunk")
      o.compression.int8_chunk = gz::parse_int(next(), "--int8-chunk");
    else if (a == "--start-step")
      o.compression.start_step = gz::parse_int(next(), "--start-step");
    else if (a == "--averaging")
      o.averaging = next();
    else if (a == "--period")
      o.period = gz::parse_int(next(), "--period");
    else if (a == "--staleness")
      o.staleness = gz::parse_int(next(), "--staleness");
    else if (a == "--help" || a == "-h")
      std::exit(usage());
    else
      GZ_THROW(gz::InvalidArgument, "gz-bench train: unknown option ", a);
  }
  if (o.model != "cnn" && o.model != "bert-small" && o.model != "bert-base")
    GZ_THROW(gz::InvalidArgument, "gz-bench train: --model must be cnn, bert-small or bert-base, got ",
             o.model);
  if (o.kernels != "fused" && o.kernels != "torch")
    GZ_THROW(gz::InvalidArgument, "gz-bench train: --kernels must be fused or torch, got ", o.kernels);
  if (o.hook != "none") o.compression.method = gz::parse_compression(o.hook == "allreduce" ? "none" : o.hook);
  if (o.averaging != "none" && o.averaging != "local_sgd" && o.averaging != "async")
    GZ_THROW(gz::InvalidArgument, "gz-bench train: --averaging must be none, local_sgd or async, got ",
             o.averaging);
  if (o.averaging != "none" && (o.mode != gz::train::ParallelMode::ddp || o.hook != "allreduce"))
    GZ_THROW(gz::InvalidArgument, "gz-bench train: --averaging needs --mode ddp and --hook allreduce");
  GZ_CHECK_ARG(o.zero >= 0 && o.zero <= 3 && (o.zero == 0 || o.mode == gz::train::ParallelMode::ddp),
               "--zero 0|1|2|3 (ddp mode only)");
  GZ_CHECK_ARG(
      o.zero == 0 || (o.hook == "allreduce" && o.averaging == "none"),
      "--zero runs with --hook allreduce and --averaging none (ZeRO has its own reduce-scatter hook)");
  GZ_CHECK_ARG(o.prefetch || o.zero == 3, "--no-prefetch needs --zero 3 (fully_shard's prefetch)");
  GZ_CHECK_ARG(o.batch > 0 && o.steps > 0 && o.warmup >= 0 && o.threads > 0 && o.seq > 0,
               "batch/steps/threads");
  return o;
}

}  // namespace

int bench_train(int argc, char** argv) {
  auto o = parse(argc, argv);
  torch::set_num_threads(o.threads);
  torch::manual_seed(42);
  const bool distributed = gz::train::needs_group(o.mode);
  int rank = 0, world = 1;
  if (distributed) {
    gz::ProcessGroupOptions po;
    po.backend = o.backend;
    gz::init(po);
    rank = gz::rank();
    world = gz::size();
  } else {
    auto env = gz::Env::from_process();
    if (env.get_int("WORLD_SIZE", 1) > 1 && env.get_int("RANK", 0) != 0) return 0;  // one process only
  }

  gz::train::ModelOptions mo;
  if (o.model == "cnn") {
    mo.net_type = "cnn";
    mo.num_classes = 10;
    mo.in_channels = 1;
    mo.input_size = 28;
  } else {
    mo.net_type = "bert_small";
    mo.num_classes = 2;
    mo.input_size = o.seq;
    if (o.model == "bert-base") {  // BERT-base sizes on the same encoder (vocab 30522, dropout 0.1)
      mo.hidden = 768;
      mo.layers = 12;
      mo.heads = 12;
      mo.ffn = 3072;
    }
  }
  mo.fused_kernels = o.kernels == "fused";
  auto model = gz::train::create_model(mo);
  model->train();
  std::shared_ptr<torch::optim::Optimizer> opt;
  if (o.model == "cnn")
    opt = std::make_shared<torch::optim::SGD>(model->parameters(),
                                              torch::optim::SGDOptions(0.01).momentum(0.9));
  else if (o.kernels == "fused")
    opt = std::make_shared<gz::FusedAdamW>(model->parameters(), torch::optim::AdamWOptions(1e-4));
  else
    opt = std::make_shared<torch::optim::AdamW>(model->parameters(), torch::optim::AdamWOptions(1e-4));

  const int replicas = o.mode == gz::train::ParallelMode::dp ? 2 : 1;
  const int64_t local_batch = o.batch * replicas;
  torch::Tensor x, y;
  if (o.model == "cnn") {
    x = torch::randn({local_batch, 1, 28, 28});
    y = torch::randint(0, 10, {local_batch}, torch::kLong);
  } else {
    x = torch::randint(1, mo.vocab_size, {local_batch, o.seq}, torch::kLong);
    y = torch::randint(0, 2, {local_batch}, torch::kLong);
  }

  const auto mem_base = gz::bench::read_proc_memory();  // model, optimizer and data exist; no state yet
  // The mode's strategy, chosen once; the averagers (ddp mode) come on top of it.
  gz::train::StrategyOptions so;
  so.mode = o.mode;
  so.group = distributed ? gz::default_group() : nullptr;
  auto stats = std::make_shared<gz::CommStats>();  // bytes handed to collectives by hooks/averagers
  if (o.hook == "none")
    so.ddp.comm_hook = [](gz::comm::Communicator&, gz::GradBucket&) {};
  else if (o.averaging != "none")
    so.ddp.comm_hook = gz::post_local_sgd_hook(0);
  else
    so.ddp.comm_hook = gz::make_comm_hook(o.compression, stats);
  so.ddp.row_sparse.enabled = o.row_sparse;
  if (o.bucket_mb > 0) so.ddp.bucket_bytes = static_cast<size_t>(o.bucket_mb * (1 << 20));
  if (o.first_bucket_mb > 0) so.ddp.first_bucket_bytes = static_cast<size_t>(o.first_bucket_mb * (1 << 20));
  so.zero_stage = o.zero;
  so.zero.stats = stats;  // ZeRO's reduce-scatters and all-gathers are its gradient traffic
  so.fsdp.prefetch = o.prefetch;
  if (o.cycle_us >= 0) so.horovod.cycle_time = std::chrono::microseconds(o.cycle_us);
  so.horovod.row_sparse.enabled = o.row_sparse;
  if (o.bucket_mb > 0) so.horovod.replay_bucket_bytes = static_cast<size_t>(o.bucket_mb * (1 << 20));
  so.horovod.compression = o.compression.method;
  so.horovod.compression_options = o.compression;
  so.horovod.stats = stats;
  so.dp_devices.assign(static_cast<size_t>(replicas), torch::Device(torch::kCPU));
  auto strategy = gz::train::make_strategy(so, model, opt);
  // What the strategy really runs with (not the flag): a benchmark records what it measured.
  auto* z3 = gz::train::fsdp_hooks(*strategy);
  const char* prefetch = z3 ? (z3->fsdp().options().prefetch ? "on" : "off") : "n/a";
  std::unique_ptr<gz::PeriodicModelAverager> local_sgd;
  std::unique_ptr<gz::AsyncModelAverager> async_avg;
  if (o.averaging == "local_sgd") {
    gz::LocalSGDOptions lo;
    lo.period = o.period;
    lo.stats = stats;
    local_sgd = std::make_unique<gz::PeriodicModelAverager>(*model, nullptr, lo);
  } else if (o.averaging == "async") {
    gz::AsyncAveragingOptions ao;
    ao.max_staleness = o.staleness;
    ao.stats = stats;
    async_avg = std::make_unique<gz::AsyncModelAverager>(*model, nullptr, ao);
  }

  // GZ_TIMELINE=PREFIX: forward, backward and optimizer spans per step next to DDP's and the
  // Horovod mode's own events (bench/timeline_summary.py reads them).
  gz::Timeline* tl = gz::Timeline::process();
  auto step = [&] {
    auto t0 = gz::Clock::now();
    strategy->zero_grad();
    strategy->begin_micro_step(true);
    torch::Tensor out = strategy->forward(x);
    auto loss = torch::nn::functional::cross_entropy(out, y);
    auto t1 = gz::Clock::now();
    loss.backward();
    strategy->end_micro_step();
    auto t2 = gz::Clock::now();
    strategy->step();
    if (local_sgd) local_sgd->step();
    if (async_avg) async_avg->step();
    if (tl) {
      auto t3 = gz::Clock::now();
      tl->span("step", "forward", t0, t1);
      tl->span("step", "backward", t1, t2);
      tl->span("step", o.mode == gz::train::ParallelMode::horovod ? "synchronize+optimizer" : "optimizer", t2,
               t3);
    }
  };
  for (int i = 0; i < o.warmup; ++i) step();
  if (async_avg) async_avg->synchronize();
  if (distributed) gz::default_group()->barrier();
  if (o.memory) gz::bench::reset_peak_rss();
  const uint64_t bytes0 = stats->bytes.load();
  const long long wire0 = wire_tx_bytes();
  gz::Stopwatch sw;
  for (int i = 0; i < o.steps; ++i) step();
  // Async: the rounds still in flight belong to the timed steps.
  if (async_avg) async_avg->synchronize();
  strategy->synchronize();  // ZeRO: the last step's parameter all-gathers belong to the timed steps
  double secs = sw.seconds();
  const double bytes_per_step = static_cast<double>(stats->bytes.load() - bytes0) / o.steps;
  const double wire_per_step = static_cast<double>(wire_tx_bytes() - wire0) / o.steps;
  if (distributed) {
    // The slowest rank sets the pace.
    gz::default_group()->allreduce(&secs, 1, gz::DType::f64, gz::comm::ReduceOp::max);
  }
  if (o.memory && distributed) {
    // After the last step, as the next one would find them: DDP's gradients stay in their buckets
    // (zero_grad() zeroes them), ZeRO stage 2 holds only its gradient blocks.
    const auto grads = gz::bench::gradient_bytes(*model, strategy->gradient_blocks());  // ZeRO's blocks
    // Stage 3: the parameters hold no memory between steps; the shards do.
    const auto params = gz::bench::parameter_bytes(*model, strategy->parameter_shards());
    gz::bench::report_memory(*gz::default_group(), o.zero ? "zero" + std::to_string(o.zero) : "ddp",
                             gz::optimizer_state_bytes(strategy->optimizer()), grads, mem_base, params);
  }
  const double samples = static_cast<double>(local_batch) * world * o.steps;
  int64_t nparams = 0;  // gradient elements per step
  for (const auto& p : model->parameters()) nparams += p.numel();
  // Bytes the last step reduced: dense_bytes all-reduced, rows_bytes = all ranks' rows (index + row)
  // of the row-sparse gradients (each rank receives the others' share of it).
  const gz::train::ExchangeBytes exchanged = strategy->last_exchange();
  const int64_t dense_bytes = exchanged.dense_bytes, rows_bytes = exchanged.rows_bytes;
  if (rank == 0) {
    std::printf(
        "gz-bench train: model=%s mode=%s ranks=%d replicas=%d batch=%lld threads=%d steps=%d kernels=%s "
        "hook=%s backend=%s params=%lld row_sparse=%s dense_bytes=%lld rows_bytes=%lld prefetch=%s\n",
        o.model.c_str(), gz::train::to_string(o.mode), world, replicas, static_cast<long long>(o.batch),
        o.threads, o.steps, o.kernels.c_str(), o.hook.c_str(),
        distributed ? gz::default_group()->backend().c_str() : "none", static_cast<long long>(nparams),
        o.row_sparse ? "on" : "off", static_cast<long long>(dense_bytes), static_cast<long long>(rows_bytes),
        prefetch);
    const std::string mode =
        std::string(gz::train::to_string(o.mode)) + (o.zero ? "_zero" + std::to_string(o.zero) : "");
    std::printf(
        "RESULT impl=gz model=%s mode=%s ranks=%d samples_per_s=%.2f step_ms=%.3f hook=%s averaging=%s "
        "bytes_per_step=%.0f wire_bytes_per_step=%.0f prefetch=%s\n",
        o.model.c_str(), mode.c_str(), world * replicas, samples / secs, 1000.0 * secs / o.steps,
        o.hook.c_str(), o.averaging.c_str(), bytes_per_step, wire_per_step, prefetch);
    std::fflush(stdout);
  }
  async_avg.reset();
  local_sgd.reset();
  strategy.reset();
  opt.reset();
  if (distributed) gz::shutdown();
  return 0;
}
