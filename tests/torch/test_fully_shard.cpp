// fully_shard (ZeRO stage 3): 100 steps equal plain DDP's losses at 1-4 ranks (plain, gradient
// accumulation with and without no_sync, clipping; each also under bf16 autocast over fp32 master
// shards), each rank holds a quarter of DDP's parameter,
// gradient and optimizer memory at 4 ranks, a failed pass leaves no trace, the module is whole
// after the wrapper, units by size, misuse refused.
#include <torch/optim/adamw.h>

#include <limits>
#include <optional>
#include <tuple>
#include <unordered_set>

#include "gz/core/error.h"
#include "gz/torch/autocast.h"
#include "gz/torch/comm_hooks.h"
#include "gz/torch/ddp.h"
#include "gz/torch/fully_shard.h"
#include "gz/torch/zero_redundancy_optimizer.h"
#include "torch/support/torch_test_util.h"
#include "torch/torch_compat.h"

namespace {
using namespace gz;
using namespace gz::test;

const bool kOneThread = [] {
  torch::set_num_threads(1);
  return true;
}();

constexpr int64_t kB = 4;  // rows per rank per micro-step

// Residual block of two linear layers: a unit with four parameters, cut across by the shards.
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t w) {
    a = register_module("a", torch::nn::Linear(w, w));
    b = register_module("b", torch::nn::Linear(w, w));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    if (fail_forward) throw std::runtime_error("injected forward failure");
    auto h = torch::tanh(a->forward(x));
    if (skip_b) return x + h;  // b gets no gradient in this pass
    // Between b's gradients and a's: the unit is half way through its backward.
    if (fail_backward && h.requires_grad())
      h.register_hook([](const torch::Tensor&) -> torch::Tensor {
        throw std::runtime_error("injected backward failure");
      });
    auto y = x + b->forward(h);
    return poison ? y * std::numeric_limits<float>::quiet_NaN() : y;
  }
  torch::nn::Linear a{nullptr}, b{nullptr};
  bool fail_forward = false, fail_backward = false;  // fault injection
  bool skip_b = false;                               // find_unused_parameters tests
  bool poison = false;  // its output NaN (and any gradient pushed through it): the rank drops it
};
TORCH_MODULE(Block);

// in (root) -> blocks (units, run through gz::run_unit) -> head (root).
struct StackImpl : torch::nn::Module {
  StackImpl(int64_t width, int blocks) {
    torch::manual_seed(99);
    in = register_module("in", torch::nn::Linear(8, width));
    body = register_module("body", torch::nn::ModuleList());
    for (int i = 0; i < blocks; ++i) body->push_back(Block(width));
    head = register_module("head", torch::nn::Linear(width, 4));
  }
  torch::Tensor forward(const torch::Tensor& input) {
    auto x = skip_in ? torch::zeros({input.size(0), in->weight.size(0)}) : torch::tanh(in->forward(input));
    for (size_t i = 0; i < body->size(); ++i) {
      auto* blk = body->ptr(i)->as<BlockImpl>();
      const bool f64 = blk->a->weight.scalar_type() == torch::kDouble;  // a unit of another dtype
      auto run = [&] { return blk->forward(f64 ? x.to(torch::kDouble) : x); };
      auto y = static_cast<int>(i) == direct ? run() : run_unit(*blk, run);
      if (f64) y = y.to(x.scalar_type());
      if (i >= dropped.size() || !dropped[i]) x = y;  // a dropped block's output feeds nothing
    }
    return head->forward(x);
  }
  std::vector<std::shared_ptr<torch::nn::Module>> units() const {
    std::vector<std::shared_ptr<torch::nn::Module>> out;
    for (size_t i = 0; i < body->size(); ++i) out.push_back(body->ptr(i));
    return out;
  }
  torch::nn::Linear in{nullptr}, head{nullptr};
  torch::nn::ModuleList body{nullptr};
  std::vector<bool> dropped;  // per block (find_unused_parameters tests)
  bool skip_in = false;       // the root's first layer gets no gradient (the same)
  int direct = -1;            // a block forward() runs without gz::run_unit()
};
TORCH_MODULE(Stack);

struct Config {
  int micro = 1;
  bool no_sync = false;
  double clip = 0;
  bool bf16 = false;            // forward under CPU autocast to bfloat16 (parameters and optimizer stay fp32)
  bool clip_in_double = false;  // DDP clips with stage 3's rule (clip_in_double), not LibTorch's
  int64_t width = 24;
  int blocks = 3;
  int f64_block = -1;        // this block's parameters in double (units of two dtypes)
  bool bf16_reduce = false;  // DDP: bf16_compress_hook; stage 3: reduce_dtype bf16
  int direct_block = -1;     // Stack::direct
};

struct TrainRun {
  std::vector<double> losses;         // rank 0's, every micro-step
  std::vector<torch::Tensor> params;  // rank 0's at the end
  int64_t live_bytes = 0;             // rank 0's parameters + gradients + optimizer state
  FullyShardMemory mem;               // FSDP only
};

// The optimizer's state-map key of `p` (a string in LibTorch 1.x, the TensorImpl in 2.x).
template <typename Opt>
auto zero_key(Opt& opt, const torch::Tensor& p) {
  return torch_compat::state_key(opt.state(), p);
}

torch::optim::AdamWOptions adamw() { return torch::optim::AdamWOptions(3e-3).weight_decay(0.01); }

// Bytes of the distinct storages behind `ts` (and their .grad): what the tensors really hold.
int64_t storage_bytes(const std::vector<torch::Tensor>& ts) {
  std::unordered_set<const void*> seen;
  int64_t bytes = 0;
  for (const auto& t : ts)
    for (const auto& x : {t, t.grad()})
      if (x.defined() && seen.insert(x.storage().unsafeGetStorageImpl()).second)
        bytes += static_cast<int64_t>(x.storage().nbytes());
  return bytes;
}

template <typename Forward, typename Clip>
void train(
    torch::optim::Optimizer& opt, const Config& c, const Data& d, int steps, int r, TrainRun& run,
    Forward forward, Clip clip, const std::function<std::optional<std::shared_ptr<void>>()>& no_sync,
    const std::function<void()>& after_step = [] {}) {
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    for (int k = 0; k < c.micro; ++k) {
      const int i = s * c.micro + k;
      std::optional<std::shared_ptr<void>> guard;
      if (c.no_sync && k + 1 < c.micro) guard = no_sync();
      // The loss in fp32, outside autocast, as the trainer computes it.
      auto loss = torch::mse_loss(forward(shard(d.x[i], r, kB)).to(torch::kFloat), shard(d.y[i], r, kB));
      loss.backward();
      if (r == 0) run.losses.push_back(loss.template item<double>());
    }
    if (c.clip > 0) clip(c.clip);
    opt.step();
    after_step();
  }
}

// train() through the wrapper's forward: no clipping, no no_sync() (plain steps).
void train_sharded(
    torch::optim::Optimizer& opt, const Config& c, const Data& d, int steps, int r, TrainRun& run,
    FullyShardedDataParallel& fsdp, StackImpl& m, const std::function<void()>& after_step = [] {}) {
  train(
      opt, c, d, steps, r, run,
      [&](const torch::Tensor& x) { return fsdp.forward([&] { return m.forward(x); }); }, [](double) {},
      [] { return std::optional<std::shared_ptr<void>>(); }, after_step);
}

// FullyShardedDataParallel::clip_grad_norm_'s arithmetic over whole gradients: squares summed in
// double, one coefficient. LibTorch's clip_grad_norm_ takes the norm in float, which rounds the
// coefficient differently in its last bits.
void clip_in_double(const std::vector<torch::Tensor>& params, double max_norm) {
  torch::NoGradGuard no_grad;
  double sq = 0;
  for (const auto& p : params)
    if (p.grad().defined()) sq += p.grad().to(torch::kDouble).pow(2).sum().item<double>();
  const double coef = max_norm / (std::sqrt(sq) + 1e-6);
  if (coef < 1)
    for (const auto& p : params)
      if (p.grad().defined()) p.grad().mul_(coef);
}

// The model computed in bfloat16 when autocast is on (the comparison would prove nothing otherwise).
torch::Tensor expect_dtype(const Config& c, torch::Tensor out) {
  EXPECT_EQ(out.scalar_type(), c.bf16 ? torch::kBFloat16 : torch::kFloat);
  return out;
}

// One model per rank, made on the calling thread: their constructor seeds the global RNG, which
// rank threads would race on (and start DDP and stage 3 from different weights).
std::vector<Stack> make_stacks(int n, const Config& c) {
  std::vector<Stack> out;
  for (int i = 0; i < n; ++i) {
    out.emplace_back(c.width, c.blocks);
    if (c.f64_block >= 0) out.back()->body->ptr(c.f64_block)->to(torch::kDouble);
    out.back()->direct = c.direct_block;
  }
  return out;
}

TrainRun run_ddp(int world, const Config& c, const Data& d, int steps) {
  TrainRun out;
  auto models = make_stacks(world, c);
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    auto& m = models[r];
    DDPOptions o;
    if (c.bf16_reduce) o.comm_hook = bf16_compress_hook();
    DistributedDataParallel ddp(m.ptr(), g, o);
    torch::optim::AdamW opt(m->parameters(), adamw());
    TrainRun run;
    train(
        opt, c, d, steps, r, run,
        [&](const torch::Tensor& x) {
          AutocastGuard autocast(torch::kCPU, torch::kBFloat16, c.bf16);
          return expect_dtype(c, ddp.forward([&] { return m->forward(x); }));
        },
        [&](double max) {
          if (c.clip_in_double)
            clip_in_double(m->parameters(), max);
          else
            torch::nn::utils::clip_grad_norm_(m->parameters(), max);
        },
        [&]() -> std::optional<std::shared_ptr<void>> {
          return std::make_shared<DistributedDataParallel::NoSyncGuard>(ddp.reducer());
        });
    if (r != 0) return;
    run.live_bytes = storage_bytes(m->parameters()) + optimizer_state_bytes(opt);
    for (auto& p : m->parameters()) run.params.push_back(p.detach().clone());
    out = std::move(run);
  });
  return out;
}

TrainRun run_fsdp(int world, const Config& c, const Data& d, int steps, FullyShardOptions fo = {}) {
  TrainRun out;
  std::vector<std::vector<torch::Tensor>> params(world);
  auto models = make_stacks(world, c);
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    auto& m = models[r];
    FullyShardOptions o = fo;
    if (c.bf16_reduce) o.reduce_dtype = torch::kBFloat16;
    auto fsdp = fully_shard(m.ptr(), m->units(), g, o);
    torch::optim::AdamW opt(fsdp->parameters(), adamw());
    TrainRun run;
    train(
        opt, c, d, steps, r, run,
        [&](const torch::Tensor& x) {
          AutocastGuard autocast(torch::kCPU, torch::kBFloat16, c.bf16);
          return expect_dtype(c, fsdp->forward([&] { return m->forward(x); }));
        },
        [&](double max) { fsdp->clip_grad_norm_(max); },
        [&]() -> std::optional<std::shared_ptr<void>> {
          return std::make_shared<FullyShardedDataParallel::NoSyncGuard>(*fsdp);
        },
        // The first forward gathers every unit (it learns which ones the model runs): the peak
        // that matters is a later step's.
        [&, done = 0]() mutable {
          if (++done == 1) fsdp->reset_peak();
        });
    run.live_bytes =
        storage_bytes(m->parameters()) + storage_bytes(fsdp->parameters()) + optimizer_state_bytes(opt);
    run.mem = fsdp->memory();
    params[r] = fsdp->gather_full_parameters();
    if (r == 0) out = std::move(run);
  });
  for (int r = 1; r < world; ++r)
    for (size_t i = 0; i < params[0].size(); ++i)
      EXPECT_TRUE(torch::equal(params[r][i], params[0][i])) << "rank " << r << " parameter " << i;
  out.params = params[0];
  return out;
}

double max_rel(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double scale = std::max(b[i].abs().max().item<double>(), 1e-12);
    worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>() / scale);
  }
  return worst;
}

void expect_same_training(int world, const Config& c, double loss_tol = 1e-5, double param_tol = 1e-4) {
  const int steps = 100;
  auto d = make_data(steps * c.micro, world * kB);
  const TrainRun ref = run_ddp(world, c, d, steps);
  const TrainRun got = run_fsdp(world, c, d, steps);
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  std::vector<torch::Tensor> start;
  for (auto& p : Stack(c.width, c.blocks)->parameters()) start.push_back(p.detach().clone());
  ASSERT_GT(max_rel(ref.params, start), 1e-2) << "training did not move the parameters";
  double worst = 0;
  for (size_t i = 0; i < ref.losses.size(); ++i)
    worst = std::max(worst, std::abs(got.losses[i] - ref.losses[i]) / std::abs(ref.losses[i]));
  const double params_rel = max_rel(got.params, ref.params);
  std::cout << "world " << world << (c.bf16 ? " bf16" : "") << ": worst loss rel " << worst << ", params rel "
            << params_rel << "\n";
  EXPECT_LE(worst, loss_tol) << "losses differ from DDP's";
  EXPECT_LE(params_rel, param_tol) << "parameters differ from DDP's";
}

class FullyShardVsDdp : public ::testing::TestWithParam<int> {};

TEST_P(FullyShardVsDdp, LossesEqualDdpFor100Steps) { expect_same_training(GetParam(), Config{}); }

TEST_P(FullyShardVsDdp, AccumulationWithNoSyncEqualsDdp) {
  Config c;
  c.micro = 2;
  c.no_sync = true;
  expect_same_training(GetParam(), c);
}

// Every micro-step reduce-scatters and adds to the shard's gradient.
TEST_P(FullyShardVsDdp, AccumulationWithoutNoSyncEqualsDdp) {
  Config c;
  c.micro = 2;
  expect_same_training(GetParam(), c);
}

// A small max norm: clipping scales every step, by the norm over every rank's shards.
TEST_P(FullyShardVsDdp, ClippingByGlobalNormEqualsDdp) {
  Config c;
  c.clip = 0.05;
  expect_same_training(GetParam(), c);
}

// bf16 autocast over fp32 parameters, gradients and optimizer state (the master shards). DDP
// under the same autocast casts the same fp32 weights to the same bf16 values and computes the
// same bf16 gradients; sums of bf16-valued gradients are exact in fp32 in any order (unless their
// magnitudes lie 2^16 apart), so
// stage 3 must match it as closely as fp32 training does (it comes out bit for bit here). Any
// last-bit difference of the fp32 masters would show up far larger than in fp32: it flips the
// bf16 rounding of a weight now and then (2^-8 relative), and training carries that on. So DDP
// clips with stage 3's arithmetic here (the fp32 test compares against LibTorch's rule).
// Bit for bit on the machine that measured it (a Xeon with AVX-512), but that rests on LibTorch's
// AdamW rounding an element alike whether it lies in a vector or in a loop's scalar tail (shards
// and whole tensors put different elements there), which another CPU's kernels need not do; such
// last-bit differences grew to ~1e-3 where they occurred (3 ranks, above). So the bf16 cases allow
// 5e-3: the mutations measured still fail it (clipping that does not scale: 4e-2 and more on the
// losses; gradients reduced in bf16: 5.6e-3 to 1.1e-2 on the parameters).
constexpr double kBf16LossTol = 5e-3, kBf16ParamTol = 5e-3;

// Parameters of two dtypes (one dtype per unit: each unit's flat buffer, shard and reduce-scatter
// are in its own dtype), as DDP's buckets per dtype.
TEST_P(FullyShardVsDdp, UnitsOfTwoDtypesEqualDdp) {
  Config c;
  c.f64_block = 1;
  expect_same_training(GetParam(), c);
  // In float the double unit would train nearly the same: check that it stayed double.
  auto models = make_stacks(1, c);
  run_ranks(1, [&](int r, std::shared_ptr<Store> store) {
    auto fsdp = fully_shard(models[0].ptr(), models[0]->units(), make_comm(r, 1, store));
    int doubles = 0;
    for (auto& s : fsdp->parameters()) doubles += s.scalar_type() == torch::kDouble;
    EXPECT_EQ(doubles, 1) << "one shard (block 1's) in double";
    for (auto& p : models[0]->body->ptr(1)->parameters()) EXPECT_EQ(p.scalar_type(), torch::kDouble);
  });
}

// Gradients reduce-scattered in bf16 (half the bytes) as DDP's bf16 compression hook all-reduces
// them: the same division before the cast, the same sums.
TEST_P(FullyShardVsDdp, Bf16ReduceEqualsDdpsBf16CompressionHook) {
  Config c;
  c.bf16_reduce = true;
  expect_same_training(GetParam(), c);
}

TEST_P(FullyShardVsDdp, Bf16AutocastEqualsDdp) {
  Config c;
  c.bf16 = true;
  expect_same_training(GetParam(), c, kBf16LossTol, kBf16ParamTol);
}

TEST_P(FullyShardVsDdp, Bf16WithAccumulationAndClippingEqualsDdp) {
  const int world = GetParam();
  for (const bool no_sync : {true, false}) {
    SCOPED_TRACE(no_sync ? "no_sync" : "without no_sync");
    Config c;
    c.bf16 = true;
    c.micro = 2;
    c.no_sync = no_sync;
    c.clip = 0.05;
    c.clip_in_double = true;
    // Without no_sync both average every micro-step, DDP as (world * avg1 + sum2) / world, stage 3
    // as avg1 + sum2 / world: equal when dividing by world is exact (a power of two), else a
    // last-bit difference that bf16 rounding amplifies as above. Measured at 3 ranks: 3e-3 (losses)
    // and 8e-3 (parameters); skipping the clip, computing in fp32 or rounding the masters to bf16
    // gives 2.6e-2 to 1e-1 on the parameters.
    const bool exact = no_sync || (world & (world - 1)) == 0;
    if (exact)
      expect_same_training(world, c, kBf16LossTol, kBf16ParamTol);
    else
      expect_same_training(world, c, 1e-2, 1.5e-2);
  }
}

INSTANTIATE_TEST_SUITE_P(FullyShard, FullyShardVsDdp, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "w" + std::to_string(i.param);
                         });

// Parameters + gradients + AdamW state per rank, from the live tensors after a step.
TEST(FullyShard, FourRanksHoldAQuarterOfDdpsMemory) {
  Config c;
  c.width = 128;
  c.blocks = 4;
  auto d = make_data(3, 4 * kB);
  const TrainRun ddp = run_ddp(4, c, d, 3);
  const TrainRun fsdp = run_fsdp(4, c, d, 3);
  const double ratio = static_cast<double>(fsdp.live_bytes) / static_cast<double>(ddp.live_bytes);
  std::cout << "live bytes per rank: DDP " << ddp.live_bytes << ", fully_shard " << fsdp.live_bytes << " ("
            << ratio << "x); whole peak during a step " << fsdp.mem.whole_peak << "\n";
  EXPECT_LE(ratio, 0.30);
  EXPECT_EQ(fsdp.mem.whole_now, 0) << "whole parameters or gradients left after the step";
  // Parameters + gradients whole at once: never the model's (a unit or two, the root, a prefetch).
  const int64_t model_bytes = ddp.live_bytes / 4;  // AdamW: params, grads, 2 moments
  EXPECT_LE(fsdp.mem.whole_peak, model_bytes) << "more than one model's worth whole at once";
}

// units_only_in_run_unit: the first step gathers each unit as it runs, as later steps do, and
// trains the same; by default the first forward gathers every unit at once (the whole model).
TEST(FullyShard, PromisedUnitsGatherOneAtATimeInTheFirstStep) {
  const int world = 2, steps = 2;
  Config c;
  c.width = 64;
  c.blocks = 8;
  auto d = make_data(steps, world * kB);
  std::vector<double> losses[2];
  for (const bool promised : {false, true}) {
    SCOPED_TRACE(promised ? "units_only_in_run_unit" : "default");
    auto models = make_stacks(world, c);
    std::vector<int64_t> peak(world), model_bytes(world);
    run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
      auto g = make_comm(r, world, store);
      auto& m = models[r];
      FullyShardOptions fo;
      fo.units_only_in_run_unit = promised;
      auto fsdp = fully_shard(m.ptr(), m->units(), g, fo);
      torch::optim::AdamW opt(fsdp->parameters(), adamw());
      TrainRun run;
      train_sharded(opt, c, d, steps, r, run, *fsdp, *m);
      peak[r] = fsdp->memory().whole_peak;  // since construction: the first step's included
      for (const auto& u : fsdp->units()) model_bytes[r] += u.padded * static_cast<int64_t>(sizeof(float));
      if (r == 0) losses[promised] = run.losses;
    });
    for (int r = 0; r < world; ++r) {
      if (promised)
        EXPECT_LE(peak[r], model_bytes[r] / 2) << "rank " << r << ": the first forward gathered every unit";
      else
        EXPECT_GE(peak[r], model_bytes[r]) << "rank " << r << ": the default gathers every unit first";
    }
  }
  EXPECT_EQ(losses[1], losses[0]);
}

// By default the first forward gathers every unit, so a unit the model runs without
// gz::run_unit() is read whole, and stays whole (and trains: UnitNotRunThroughRunUnitTrainsAsDdp).
TEST(FullyShard, UnitNotRunThroughRunUnitIsReadWholeByDefault) {
  const int world = 2, steps = 2;
  Config c;
  c.direct_block = 1;
  auto d = make_data(steps, world * kB);
  auto ref = make_stacks(1, c)[0];  // the same weights, unsharded
  std::vector<std::vector<torch::Tensor>> want(world);
  {
    torch::NoGradGuard no_grad;
    for (int r = 0; r < world; ++r)
      for (int s = 0; s < steps; ++s) want[r].push_back(ref->forward(shard(d.x[s], r, kB)));
  }
  auto models = make_stacks(world, c);
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    auto& m = models[r];
    auto fsdp = fully_shard(m.ptr(), m->units(), g);
    torch::NoGradGuard no_grad;
    for (int s = 0; s < steps; ++s) {
      auto out = fsdp->forward([&] { return m->forward(shard(d.x[s], r, kB)); });
      EXPECT_TRUE(torch::allclose(out, want[r][s], 1e-6, 1e-7)) << "rank " << r << " forward " << s;
    }
    int64_t direct_bytes = 0;
    for (const auto& u : fsdp->units())
      if (u.name == "body.1") direct_bytes = u.padded * static_cast<int64_t>(sizeof(float));
    EXPECT_EQ(fsdp->memory().whole_now, direct_bytes) << "rank " << r << ": body.1 should stay whole, alone";
  });
}

// A unit kept whole (run without gz::run_unit()) still trains: its backward starts with the
// root's, its gradients are reduce-scattered into its shard like any unit's.
TEST(FullyShard, UnitNotRunThroughRunUnitTrainsAsDdp) {
  Config c;
  c.direct_block = 1;
  expect_same_training(2, c);
}

TEST(FullyShard, WithoutPrefetchOrReshardTrainsTheSame) {
  const int world = 2, steps = 20;
  Config c;
  auto d = make_data(steps, world * kB);
  const TrainRun ref = run_fsdp(world, c, d, steps);
  FullyShardOptions fo;
  fo.prefetch = false;
  fo.reshard_after_forward = false;
  const TrainRun got = run_fsdp(world, c, d, steps, fo);
  EXPECT_EQ(got.losses, ref.losses);
}

// find_unused_parameters: from micro-step to micro-step each rank's loss leaves out other parts of
// the model: a layer inside a unit (block 1's b, on some ranks), a whole unit (block 2's output,
// on some ranks), the root's first layer (on some ranks: the root's parameters are used before
// and after the units) and, every fifth micro-step, block 0 on every rank (with accumulation
// under no_sync also right after a micro-step that used it). The blocks are the same size, so a
// reduce-scatter paired with another rank's wrong unit would go through unnoticed on a backend
// that does not compare ops and show only in the values. Stage 3 trains as DDP with the same
// option, at 2 and 3 ranks. Where a rank drops block 2, its output is NaN there, as a block that
// overflowed on that rank's batch: DDP runs no backward through it, nor may stage 3.
void leave_out(Stack& m, int i, int r) {
  for (size_t b = 0; b < m->body->size(); ++b) m->body->ptr(b)->as<BlockImpl>()->skip_b = false;
  m->body->ptr(1)->as<BlockImpl>()->skip_b = (i + r) % 3 == 0;
  m->dropped = {i % 5 == 4, false, (i + 2 * r) % 4 == 1};
  m->skip_in = (i + r) % 4 == 2;
  // Where a rank drops block 2 it is NaN there: no gradient may pass through it (0 x NaN).
  m->body->ptr(2)->as<BlockImpl>()->poison = m->dropped[2];
}

TrainRun train_leaving_out(int world, const Data& d, int steps, bool fsdp_mode, int micro, int direct) {
  TrainRun out;
  std::vector<std::vector<torch::Tensor>> params(world);
  Config mc;
  mc.direct_block = direct;
  auto models = make_stacks(world, mc);
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    auto& m = models[r];
    std::shared_ptr<FullyShardedDataParallel> fsdp;
    std::unique_ptr<DistributedDataParallel> ddp;
    if (fsdp_mode) {
      FullyShardOptions fo;
      fo.find_unused_parameters = true;
      fsdp = fully_shard(m.ptr(), m->units(), g, fo);
    } else {
      DDPOptions o;
      o.find_unused_parameters = true;
      ddp = std::make_unique<DistributedDataParallel>(m.ptr(), g, o);
    }
    torch::optim::AdamW opt(fsdp ? fsdp->parameters() : m->parameters(), adamw());
    TrainRun run;
    int i = 0;
    Config c;
    c.micro = micro;
    c.no_sync = micro > 1;
    train(
        opt, c, d, steps, r, run,
        [&](const torch::Tensor& x) {
          leave_out(m, i++, r);
          auto fn = [&] { return m->forward(x); };
          return fsdp ? fsdp->forward(fn) : ddp->forward(fn);
        },
        [](double) {},
        [&]() -> std::optional<std::shared_ptr<void>> {
          if (fsdp) return std::make_shared<FullyShardedDataParallel::NoSyncGuard>(*fsdp);
          return std::make_shared<DistributedDataParallel::NoSyncGuard>(ddp->reducer());
        });
    params[r] = fsdp ? fsdp->gather_full_parameters() : m->parameters();
    if (fsdp && direct < 0) EXPECT_EQ(fsdp->memory().whole_now, 0) << "rank " << r << ": units left whole";
    if (r == 0) out = std::move(run);
  });
  for (auto& p : params[0]) out.params.push_back(p.detach().clone());
  return out;
}

TEST(FullyShard, FindUnusedParametersTrainsAsDdp) {
  // {world, micro-steps, block run outside run_unit() (kept whole; -1: none; refused with
  // find_unused_parameters: MisuseIsReported)}
  for (const auto& [world, micro, direct] : {std::tuple{2, 1, -1}, {3, 1, -1}, {2, 2, -1}}) {
    SCOPED_TRACE("world " + std::to_string(world) + ", micro-steps " + std::to_string(micro) + ", direct " +
                 std::to_string(direct));
    const int steps = 30;
    auto d = make_data(steps * micro, world * kB);
    const TrainRun ref = train_leaving_out(world, d, steps, false, micro, direct);
    const TrainRun got = train_leaving_out(world, d, steps, true, micro, direct);
    ASSERT_EQ(got.losses.size(), ref.losses.size());
    double worst = 0;
    for (size_t i = 0; i < ref.losses.size(); ++i)
      worst = std::max(worst, std::abs(got.losses[i] - ref.losses[i]) / std::abs(ref.losses[i]));
    EXPECT_LE(worst, 1e-5) << "losses differ from DDP's";
    EXPECT_LE(max_rel(got.params, ref.params), 1e-4) << "parameters differ from DDP's";
  }
}

// The unsharded optimizer state (what checkpoints hold) cut back into shards is the state the
// shards had: rank 0 consolidates, then rebuilds its shards from the whole state, rank 1 restores.
TEST(FullyShard, OptimizerStateUnshardsAndShardsBack) {
  const int world = 2;
  Config c;
  auto d = make_data(4, world * kB);
  auto models = make_stacks(world, c);
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    auto& m = models[r];
    auto fsdp = fully_shard(m.ptr(), m->units(), g);
    torch::optim::AdamW opt(fsdp->parameters(), adamw());
    TrainRun run;
    train_sharded(opt, c, d, 4, r, run, *fsdp, *m);
    std::vector<torch::Tensor> moments;  // exp_avg of each shard, in parameters() order
    for (auto& s : fsdp->parameters())
      moments.push_back(
          static_cast<torch::optim::AdamWParamState&>(*opt.state().at(zero_key(opt, s))).exp_avg().clone());
    fsdp->unshard_optimizer(opt, 0);
    const auto whole = m->parameters();
    EXPECT_EQ(opt.param_groups()[0].params().size(), whole.size());
    EXPECT_EQ(opt.state().size(), r == 0 ? whole.size() : 0u);
    if (r == 0) {
      auto& first = static_cast<torch::optim::AdamWParamState&>(*opt.state().at(zero_key(opt, whole[0])));
      EXPECT_EQ(first.exp_avg().sizes(), whole[0].sizes());
      fsdp->shard_optimizer(opt);
    } else {
      fsdp->restore_optimizer(opt);
    }
    const auto shards = fsdp->parameters();
    ASSERT_EQ(opt.state().size(), shards.size());
    for (size_t i = 0; i < shards.size(); ++i)
      EXPECT_TRUE(torch::equal(
          static_cast<torch::optim::AdamWParamState&>(*opt.state().at(zero_key(opt, shards[i]))).exp_avg(),
          moments[i]))
          << "rank " << r << " shard " << i;
  });
}

// A pass that throws inside a unit (its forward, or half way through its backward while other
// units' reduce-scatters and a prefetch are in flight) leaves nothing behind: the run that repeats
// the step trains exactly as one without the failure, and nothing stays whole.
class FullyShardFailedPass : public ::testing::TestWithParam<bool> {};

TEST_P(FullyShardFailedPass, NextStepTrainsAsIfItNeverHappened) {
  const bool in_backward = GetParam();
  const int world = 2, steps = 6, fail_after = 2;
  Config c;
  auto d = make_data(steps, world * kB);
  const TrainRun ref = run_fsdp(world, c, d, steps);
  TrainRun got;
  auto models = make_stacks(world, c);
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    auto& m = models[r];
    auto fsdp = fully_shard(m.ptr(), m->units(), g);
    torch::optim::AdamW opt(fsdp->parameters(), adamw());
    TrainRun run;
    auto* middle = m->body->ptr(1)->as<BlockImpl>();
    auto fail_once = [&, step = 0]() mutable {
      if (++step != fail_after) return;
      (in_backward ? middle->fail_backward : middle->fail_forward) = true;
      EXPECT_ANY_THROW({
        auto out = fsdp->forward([&] { return m->forward(shard(d.x[0], r, kB)); });
        torch::mse_loss(out, shard(d.y[0], r, kB)).backward();
      });
      middle->fail_backward = middle->fail_forward = false;
      if (!in_backward) EXPECT_EQ(fsdp->memory().whole_now, 0) << "a failed forward left units whole";
    };
    train_sharded(opt, c, d, steps, r, run, *fsdp, *m, fail_once);
    EXPECT_EQ(fsdp->memory().whole_now, 0) << "whole parameters or gradients left after the step";
    auto params = fsdp->gather_full_parameters();
    if (r != 0) return;
    run.params = params;
    got = std::move(run);
  });
  EXPECT_EQ(got.losses, ref.losses);
  ASSERT_EQ(got.params.size(), ref.params.size());
  for (size_t i = 0; i < ref.params.size(); ++i) EXPECT_TRUE(torch::equal(got.params[i], ref.params[i])) << i;
}

INSTANTIATE_TEST_SUITE_P(FullyShard, FullyShardFailedPass, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "InBackward" : "InForward";
                         });

// Destroying the wrapper gives the module its whole, trained parameters (gathered from the
// shards, after a step or after unshard()): it goes on training without the wrapper.
TEST(FullyShard, DestroyedWrapperLeavesTheModuleWhole) {
  const int world = 2, steps = 3;
  Config c;
  auto d = make_data(steps, world * kB);
  for (const bool unshard_first : {false, true}) {
    SCOPED_TRACE(unshard_first ? "after unshard()" : "after a step");
    auto models = make_stacks(world, c);
    run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
      auto g = make_comm(r, world, store);
      auto& m = models[r];
      auto fsdp = fully_shard(m.ptr(), m->units(), g);
      torch::optim::AdamW opt(fsdp->parameters(), adamw());
      TrainRun run;
      train_sharded(opt, c, d, steps, r, run, *fsdp, *m);
      const auto want = fsdp->gather_full_parameters();
      if (unshard_first) fsdp->unshard();
      fsdp.reset();
      const auto params = m->parameters();
      ASSERT_EQ(params.size(), want.size());
      for (size_t i = 0; i < params.size(); ++i) {
        const auto& p = params[i];
        ASSERT_GE(p.storage().nbytes(), static_cast<size_t>(p.numel() * p.element_size()))
            << "rank " << r << " parameter " << i << " holds no memory";
        EXPECT_TRUE(torch::equal(p, want[i])) << "rank " << r << " parameter " << i;
      }
      torch::optim::SGD sgd(params, torch::optim::SGDOptions(0.1));
      torch::mse_loss(m->forward(shard(d.x[0], r, kB)), shard(d.y[0], r, kB)).backward();
      sgd.step();
      for (size_t i = 0; i < params.size(); ++i) {
        EXPECT_TRUE(params[i].grad().defined()) << i;
        EXPECT_FALSE(torch::equal(params[i], want[i])) << "parameter " << i << " did not train";
      }
    });
  }
}

// A wrapper that holds the module's last reference on every rank frees the units instead of
// gathering the whole model back (a process that ends would hold it one last time).
TEST(FullyShard, LastHolderFreesWithoutGathering) {
  const int world = 2;
  Config c;
  auto d = make_data(1, world * kB);
  auto models = make_stacks(world, c);
  std::vector<size_t> bytes_after(world, 1);
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    auto units = models[r]->units();
    const torch::Tensor weight = models[r]->body->ptr(0)->as<BlockImpl>()->a->weight;  // a unit's view
    StackImpl* model = models[r].get();
    std::shared_ptr<torch::nn::Module> module = models[r].ptr();
    models[r] = Stack(nullptr);  // the wrapper's reference becomes the last one
    auto fsdp = fully_shard(std::move(module), std::move(units), g);
    torch::optim::AdamW opt(fsdp->parameters(), adamw());
    TrainRun run;
    train_sharded(opt, c, d, 1, r, run, *fsdp, *model);
    fsdp.reset();
    bytes_after[r] = weight.storage().nbytes();
  });
  EXPECT_EQ(bytes_after, std::vector<size_t>(world, 0)) << "the wrapper gathered a module no one holds";
}

TEST(FullyShard, UnitsBySizeTakeTheBlocks) {
  Stack m(24, 3);
  // A block holds 2 * (24 * 24 + 24) floats = 4800 bytes; the root's layers are smaller.
  auto units = units_by_size(m.ptr(), 4000);
  ASSERT_EQ(units.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(units[i].get(), m->body->ptr(i).get());
  EXPECT_EQ(units_by_size(m.ptr(), 1 << 20).size(), 0u);
}

TEST(FullyShard, MisuseIsReported) {
  run_ranks(1, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, 1, store);
    Stack m(8, 2);
    Stack other(8, 1);
    EXPECT_THROW(fully_shard(m.ptr(), {other->body->ptr(0)}, g), InvalidArgument);  // not a submodule
    EXPECT_THROW(fully_shard(m.ptr(), {m.ptr()}, g), InvalidArgument);              // the root itself
    Stack mixed(8, 1);
    mixed->body->ptr(0)->as<BlockImpl>()->b->to(torch::kDouble);
    EXPECT_THROW(fully_shard(mixed.ptr(), mixed->units(), g), InvalidArgument);  // two dtypes in a unit
    // find_unused_parameters: which of two calls a rank's loss reaches would move the unit's
    // backward collectives to another place on each rank.
    Stack twice(8, 1);
    FullyShardOptions fo;
    fo.find_unused_parameters = true;
    auto fsdp = fully_shard(twice.ptr(), twice->units(), g, fo);
    auto* blk = twice->body->ptr(0)->as<BlockImpl>();
    const auto x = torch::randn({2, 8});
    EXPECT_THROW(fsdp->forward([&] {
      auto h = run_unit(*blk, [&] { return blk->forward(x); });
      return run_unit(*blk, [&] { return blk->forward(h); });
    }),
                 InvalidArgument);
    EXPECT_EQ(fsdp->memory().whole_now, 0) << "the refused forward left units whole";
    // ... and a unit run outside gz::run_unit() (kept whole: its backward has no node of its own).
    Config dc;
    dc.direct_block = 0;
    auto direct = make_stacks(1, dc)[0];
    auto fd = fully_shard(direct.ptr(), direct->units(), g, fo);
    EXPECT_THROW(fd->forward([&] { return direct->forward(torch::randn({2, 8})); }), InvalidArgument);
  });
}

}  // namespace
