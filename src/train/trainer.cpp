#include "gz/train/trainer.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <random>

#include "gz/core/env.h"
#include "gz/core/error.h"
#include "gz/core/log.h"
#include "gz/core/phase.h"
#include "gz/torch/autocast.h"
#include "gz/torch/collectives.h"
#include "gz/torch/fused_adamw.h"
#include "gz/torch/process_group.h"
#include "gz/torch/sharded_checkpoint.h"
#include "gz/train/data/factory.h"
#include "gz/train/data_loader.h"
#include "gz/train/elastic_batch.h"
#include "gz/train/scheduler.h"
#include "gz/train/straggler.h"
#include "comm_algorithms.h"
#include "train/straggler/observability_ab.h"
#include "train/strategy/fsdp_strategy.h"
#include "trainer_impl.h"

namespace gz::train {

namespace fs = std::filesystem;

namespace {

// A per-sample stream that depends only on (seed, epoch, index): augmentation is the same
// whatever thread builds the batch and whether the run was resumed.
uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t x = a * 0x9E3779B97F4A7C15ULL ^ (b + 0x632BE59BD9B4E019ULL + (a << 6) + (a >> 2));
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ULL;
  return x ^ (x >> 29);
}

Example augment_image(Example e, uint64_t seed) {
  if (e.input.dim() != 3) return e;  // images only: [C, H, W]
  std::mt19937_64 rng(seed);
  const int64_t pad = 2;
  const int64_t h = e.input.size(1), w = e.input.size(2);
  auto padded = torch::constant_pad_nd(e.input, {pad, pad, pad, pad}, 0);
  int64_t dy = static_cast<int64_t>(rng() % (2 * pad + 1)), dx = static_cast<int64_t>(rng() % (2 * pad + 1));
  auto out = padded.slice(1, dy, dy + h).slice(2, dx, dx + w);
  if (rng() & 1) out = out.flip({2});
  e.input = out.contiguous();
  return e;
}

std::shared_ptr<torch::optim::Optimizer> make_optimizer(const TrainConfig& c, std::vector<torch::Tensor> params) {
  if (c.optimizer == "sgd")
    return std::make_shared<torch::optim::SGD>(
        params, torch::optim::SGDOptions(c.lr).momentum(c.momentum).weight_decay(c.weight_decay));
  if (c.optimizer == "adam")
    return std::make_shared<torch::optim::Adam>(params, torch::optim::AdamOptions(c.lr).weight_decay(c.weight_decay));
  if (c.optimizer == "adamw")
    return std::make_shared<FusedAdamW>(params, torch::optim::AdamWOptions(c.lr).weight_decay(c.weight_decay));
  GZ_THROW(InvalidArgument, "unknown optimizer '", c.optimizer, "' (known: sgd adam adamw)");
}

std::string fmt(double v, int prec = 4) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(prec);
  os << v;
  return os.str();
}

}  // namespace

Trainer::Trainer(TrainConfig config, comm::CommPtr group) : config_(std::move(config)), impl_(std::make_unique<Impl>()) {
  impl_->mode = parse_parallel_mode(config_.mode);
  impl_->sharded_checkpoints = sharded_checkpoints(config_);
  if (needs_group(impl_->mode)) {
    if (!group && gz::is_initialized()) group = gz::default_group();
    if (!group)
      GZ_THROW(InvalidArgument, "mode '", config_.mode, "' needs a process group: run under gzrun or call gz::init()");
  }
  group_ = needs_group(impl_->mode) ? group : nullptr;
  if (group_) {
    rank_ = group_->rank();
    world_ = group_->size();
    // gzrun --recovery in-place: the default group's next generation replaces it.
    if (Env::from_process().get("GZ_RECOVERY", "") == "in_place" && gz::can_regroup() &&
        group_ == gz::default_group()) {
      impl_->regroup = [](const std::string& why) { return gz::regroup(why); };
      impl_->follows_moves = true;
    }
  }
  if (config_.device == "cuda") {
    if (!torch::cuda::is_available()) GZ_THROW(InvalidArgument, "config device: cuda but CUDA is not available");
    int local = gz::is_initialized() ? gz::local_rank() : 0;
    impl_->device = torch::Device(torch::kCUDA, local % std::max<int64_t>(1, torch::cuda::device_count()));
  }
  if (config_.mixed_precision == "fp16" && config_.device != "cuda")
    GZ_THROW(InvalidArgument, "mixed_precision fp16 needs CUDA (GradScaler path); use bf16 on CPU");
}

Trainer::~Trainer() {
  // Our hold on the model goes first: at zero_stage 3 the strategy then gathers the parameters back
  // into the model only when someone else (the caller) still holds it (gz::fully_shard's rule).
  model_.reset();
  impl_.reset();
}

void Trainer::set_model(ModelPtr model) { model_ = std::move(model); }
void Trainer::set_datasets(DatasetPtr train, DatasetPtr test) {
  train_data_ = std::move(train);
  test_data_ = std::move(test);
}
void Trainer::add_callback(CallbackPtr callback) { user_callbacks_.push_back(std::move(callback)); }
void Trainer::set_default_callbacks(bool on) { default_callbacks_ = on; }
void Trainer::set_crash_at_step(int64_t step) { crash_at_step_ = step; }
void Trainer::set_snapshot_local_world(int ranks_per_node) { impl_->snapshot_local_world = ranks_per_node; }
void Trainer::set_regroup(std::function<comm::CommPtr(const std::string&)> regroup) {
  impl_->regroup = std::move(regroup);
  impl_->follows_moves = false;  // a caller's regroup does not follow gzrun's moves
}
int64_t Trainer::recoveries() const { return impl_->recoveries; }

torch::optim::Optimizer& Trainer::optimizer() {
  if (!impl_->strategy) GZ_THROW(Error, "Trainer::optimizer() before train()");
  return impl_->strategy->optimizer();
}
const LrScheduler& Trainer::scheduler() const {
  if (!impl_->scheduler) GZ_THROW(Error, "Trainer::scheduler() before train()");
  return *impl_->scheduler;
}
CheckpointManager& Trainer::checkpoints() {
  if (!impl_->checkpoints) GZ_THROW(Error, "Trainer::checkpoints() before train()");
  return *impl_->checkpoints;
}
double Trainer::elapsed_seconds() const { return impl_->clock.seconds(); }

void Trainer::allreduce_sum(std::vector<double>& values) {
  if (!group_ || world_ == 1 || values.empty()) return;
  auto t = torch::from_blob(values.data(), {static_cast<int64_t>(values.size())}, torch::kFloat64);
  gz::allreduce(t, comm::ReduceOp::sum, group_);
}

void Trainer::build_optimizer() { impl_->optimizer = make_optimizer(config_, model_->parameters()); }

void Trainer::build_strategy() {
  const auto& c = config_;
  StrategyOptions so;
  so.mode = impl_->mode;
  so.group = group_;
  so.ddp.comm_hook = impl_->comm.ddp_hook(c);
  so.zero_stage = static_cast<int>(c.zero_stage);
  so.zero.stats = impl_->comm.stats();  // ZeRO's reduce-scatters and all-gathers are the gradient traffic
  so.fsdp.prefetch = c.fsdp_prefetch;
  if (c.zero_stage == 3 && c.compression.method != "none") {  // parse_config refuses the rest
    if (c.compression.method != "fp16" && c.compression.method != "bf16")
      GZ_THROW(InvalidArgument, "zero_stage 3 takes compression fp16 or bf16, got '", c.compression.method,
               "'");
    so.fsdp.reduce_dtype = c.compression.method == "fp16" ? torch::kHalf : torch::kBFloat16;
  }
  so.horovod = impl_->comm.horovod_options(c);
  so.accumulation = impl_->plan.accumulation;
  so.dp_devices.assign(static_cast<size_t>(c.dp_replicas), impl_->device);
  // Collective in ddp/horovod mode: rank 0's parameters reach every rank.
  impl_->strategy = make_strategy(so, model_, impl_->optimizer);
  if (impl_->mode == ParallelMode::ddp) impl_->comm.build_averager(c, *model_, group_);
}

void Trainer::setup() {
  if (impl_->set_up) return;
  const auto& c = config_;
  if (c.num_threads > 0) torch::set_num_threads(static_cast<int>(c.num_threads));
  torch::manual_seed(static_cast<uint64_t>(c.seed));
  if (!train_data_) {
    DataSpec spec{c.dataset, c.train_data, c.test_data, c.input_size, c.in_channels, c.num_classes,
                  static_cast<uint64_t>(c.seed)};
    auto pair = make_datasets(spec);
    train_data_ = pair.first;
    test_data_ = pair.second;
  }
  if (c.train_limit > 0 && static_cast<size_t>(c.train_limit) < train_data_->size())
    train_data_ = limit_dataset(train_data_, static_cast<size_t>(c.train_limit));
  if (test_data_ && c.test_limit > 0 && static_cast<size_t>(c.test_limit) < test_data_->size())
    test_data_ = limit_dataset(test_data_, static_cast<size_t>(c.test_limit));
  if (!model_) {
    ModelOptions mo;
    mo.net_type = c.net_type;
    mo.num_classes = c.num_classes;
    mo.in_channels = c.in_channels;
    mo.input_size = c.input_size;
    mo.dropout = c.dropout;
    mo.hidden = c.hidden;
    mo.layers = c.layers;
    model_ = create_model(mo);
  }
  model_->to(impl_->device);

  plan_steps(0);

  if (!c.finetune.empty()) {
    torch::serialize::InputArchive archive;
    auto info = CheckpointManager::open(c.finetune, archive);
    torch::serialize::InputArchive model_archive;
    std::string file = fs::is_directory(c.finetune) ? info.state_file() : c.finetune;
    if (info.sharded) {
      // The weights the shards hold, whole (their optimizer state goes into a scratch optimizer).
      if (!archive.try_read("model", model_archive))
        GZ_THROW(Error, "finetune: checkpoint ", file, " has no model state");
      load_module_state(*model_, model_archive, file, read_sharded_manifest(info.shards_dir()).params);
      auto scratch = make_optimizer(c, model_->parameters());
      load_sharded_whole(*model_, *scratch, info.shards_dir(), {});
    } else if (archive.try_read("model", model_archive)) {
      load_module_state(*model_, model_archive, file);
    } else {
      load_module_state(*model_, archive, file);
    }
  }
  build_optimizer();
  build_strategy();
  GradScalerOptions gs;
  gs.enabled = c.mixed_precision == "fp16";
  impl_->scaler = std::make_unique<GradScaler>(gs);
  impl_->checkpoints = std::make_unique<CheckpointManager>((fs::path(c.work_dir) / "checkpoints").string(),
                                                           c.save_total_limit, c.metric_for_best_model,
                                                           c.greater_is_better);

  impl_->defer_state_copy = Env::from_process().get_bool("GZ_DEFER_STATE_COPY", true);
  callbacks_.clear();
  callbacks_.push_back(std::make_shared<LrSchedulerCallback>());
  if (default_callbacks_) {
    if (c.prune_sparsity > 0) callbacks_.push_back(std::make_shared<PruningCallback>(c.prune_sparsity));
    callbacks_.push_back(std::make_shared<ProgressBar>(c.progress));
    auto history = std::make_shared<HistoryLogger>(c.tensorboard);
    callbacks_.push_back(history);
    CallbackPtr report = std::make_shared<StragglerReport>(straggler_options(c, Env::from_process()), history);
    // A benchmark's switch: the recorders' and the report's cost, A/B within this run.
    if (const auto w = Env::from_process().get_int("GZ_OBS_AB_WINDOW"); w && *w > 0)
      report = std::make_shared<ObservabilityAB>(report, *w, Env::from_process().get_bool("GZ_OBS_AB_CONTROL", false));
    callbacks_.push_back(report);
    if (c.save_checkpoints) callbacks_.push_back(std::make_shared<ModelCheckpoint>());
    if (c.early_stopping_patience > 0)
      callbacks_.push_back(std::make_shared<EarlyStopping>(c.early_stopping_patience, c.early_stopping_threshold));
  }
  if (c.log_samples) callbacks_.push_back(std::make_shared<SampleLog>());
  setup_snapshots();
  for (auto& cb : user_callbacks_) callbacks_.push_back(cb);
  impl_->set_up = true;
}

std::vector<size_t> Trainer::epoch_order(int64_t epoch) const {
  const size_t n = train_data_->size();
  std::vector<size_t> perm(n);
  for (size_t i = 0; i < n; ++i) perm[i] = i;
  std::mt19937_64 rng(mix(static_cast<uint64_t>(config_.seed), static_cast<uint64_t>(epoch)));
  for (size_t i = n; i > 1; --i) std::swap(perm[i - 1], perm[rng() % i]);  // Fisher-Yates, portable
  return perm;
}

std::vector<std::vector<size_t>> Trainer::epoch_batches(const EpochPlan& plan, int64_t epoch,
                                                        size_t steps) const {
  const std::vector<size_t> order = epoch_order(epoch);
  std::vector<std::vector<size_t>> batches;
  batches.reserve(steps * static_cast<size_t>(impl_->plan.accumulation));
  for (size_t k = 0; k < steps; ++k)
    for (auto& mb : plan.micro_batches(k)) {
      for (auto& pos : mb) pos = order[pos];
      batches.push_back(std::move(mb));
    }
  return batches;
}

void Trainer::plan_steps(int64_t reference) {
  const auto& c = config_;
  const ElasticBatchPolicy policy = parse_elastic_batch_policy(c.elastic_batch);
  BatchPlanOptions bo;
  bo.dataset_size = train_data_->size();
  bo.world = world_;
  bo.batch_size = c.batch_size;
  bo.accumulation = c.gradient_accumulation_steps;
  bo.policy = policy;
  bo.reference_global_batch = reference;
  bo.configured_global_batch = c.global_batch_size;
  impl_->plan = plan_batches(bo);
  const BatchPlan& p = impl_->plan;
  state_.global_batch = p.global_batch;
  state_.lr_scale = p.lr_scale;
  state_.steps_per_epoch = p.steps_per_epoch;
  // The lr schedule is laid out in steps of the first launch's global batch (every launch's, with
  // keep_global); scale_lr reads it at samples seen / that batch.
  const int64_t ref_steps_per_epoch =
      static_cast<int64_t>(bo.dataset_size / static_cast<size_t>(p.reference_global_batch));
  const int64_t ref_total = c.max_steps > 0 ? c.max_steps : ref_steps_per_epoch * c.num_epochs;
  if (policy == ElasticBatchPolicy::keep_global) {
    state_.total_steps = ref_total;
  } else {
    if (c.max_steps > 0)
      GZ_THROW(InvalidArgument,
               "max_steps counts steps of a fixed global batch: use elastic_batch: keep_global with it");
    // The steps this world still has to take: the rest of this epoch, then whole epochs.
    const int64_t left_in_epoch =
        state_.epoch >= c.num_epochs
            ? 0
            : static_cast<int64_t>((bo.dataset_size - static_cast<size_t>(state_.epoch_samples)) /
                                   static_cast<size_t>(p.global_batch));
    state_.total_steps = state_.step + left_in_epoch +
                         std::max<int64_t>(0, c.num_epochs - state_.epoch - 1) * p.steps_per_epoch;
  }
  SchedulerOptions so;
  so.name = c.scheduler.name;
  so.base_lr = c.lr;
  so.total_steps = ref_total;
  so.warmup_steps = c.scheduler.warmup_steps > 0
                        ? c.scheduler.warmup_steps
                        : static_cast<int64_t>(std::llround(c.scheduler.warmup_epochs * ref_steps_per_epoch));
  so.gamma = c.scheduler.gamma;
  so.min_lr = std::min(c.scheduler.min_lr, c.lr);
  for (auto m : c.scheduler.milestones)
    so.milestones.push_back(c.scheduler.unit == "epoch" ? m * ref_steps_per_epoch : m);
  impl_->scheduler = std::make_unique<LrScheduler>(so);
  if (impl_->strategy) impl_->strategy->set_accumulation(p.accumulation);
}

void Trainer::for_each_callback(const std::function<void(Callback&)>& hook) {
  for (auto& cb : callbacks_) {
    if (cb->changes_training_state()) finish_state_copies();
    hook(*cb);
  }
}

void Trainer::train_step(DataLoader& loader, int64_t accum, int64_t global_batch) {
  const auto& c = config_;
  auto& strategy = *impl_->strategy;
  auto& opt = strategy.optimizer();
  model_->train();
  strategy.zero_grad();
  double loss_sum = 0;
  const bool bf16 = c.mixed_precision == "bf16", fp16 = c.mixed_precision == "fp16";
  for (int64_t k = 0; k < accum; ++k) {
    gz::set_phase(gz::Phase::data, state_.step);  // phase marks: dumps and the straggler report
    auto batch = loader.next();
    if (!batch) GZ_THROW(Error, "rank ", rank_, ": data loader ran out of batches at step ", state_.step);
    auto input = batch->input.to(impl_->device), label = batch->label.to(impl_->device);
    // DDP: only the last micro-step's backward communicates; earlier ones accumulate locally.
    strategy.begin_micro_step(k + 1 == accum);
    torch::Tensor logits;
    gz::set_phase(gz::Phase::forward);
    {
      AutocastGuard autocast(impl_->device.type(), fp16 ? torch::kHalf : torch::kBFloat16, bf16 || fp16);
      logits = strategy.forward(input);
    }
    auto opts = torch::nn::functional::CrossEntropyFuncOptions();
    if (c.loss == "label_smoothing") opts.label_smoothing(c.label_smoothing);
    auto loss = torch::nn::functional::cross_entropy(logits.to(torch::kFloat32), label, opts);
    // Weighted by the micro-batch's share of the global batch (n W / G): with gradients averaged
    // over the ranks, the step's gradient is the mean over the global batch however it is split.
    const auto n = static_cast<double>(label.size(0));
    loss_sum += loss.item<double>() * n;
    gz::set_phase(gz::Phase::backward);  // DDP marks its exposed wait for the buckets as comm
    impl_->scaler->scale(loss * (n * world_ / static_cast<double>(global_batch))).backward();
    strategy.end_micro_step();
  }
  gz::set_phase(gz::Phase::optimizer);  // Horovod mode's synchronize() marks itself comm
  // A checkpoint's or snapshot's copy of the parameters and optimizer state ran alongside this
  // step's forward and backward (which only read them); the update must not start before it ends.
  finish_state_copies();
  strategy.before_update();
  auto& scaler = *impl_->scaler;
  if (c.max_grad_norm > 0) {
    if (scaler.enabled()) scaler.unscale_(opt);
    strategy.clip_grad_norm(c.max_grad_norm);
  }
  scaler.step(opt);
  // ZeRO all-gathers the stepped parameters in the background: everything after the step
  // (averagers, callbacks, evaluation, the caller of train()) reads them whole.
  strategy.synchronize();
  scaler.update();
  impl_->comm.after_step();
  std::vector<double> loss{loss_sum};
  gz::set_phase(gz::Phase::comm);
  allreduce_sum(loss);
  gz::set_phase(gz::Phase::idle);
  state_.loss = loss[0] / static_cast<double>(global_batch);
}

void Trainer::gather_model() {
  if (!impl_->strategy) return;
  impl_->strategy->synchronize();
  if (auto* z3 = fsdp_hooks(*impl_->strategy)) z3->gather_model();  // whole until the next forward
}

std::map<std::string, double> Trainer::evaluate() {
  gz::ScopedPhase phase(gz::Phase::eval);
  std::map<std::string, double> out;
  // sync_replicas() below writes averaged values into the parameters (only with an averager: the
  // evaluation otherwise runs alongside a save's copy, which it only reads).
  if (impl_->comm.averages()) finish_state_copies();
  // Local SGD / async averaging: every rank evaluates (and then saves) the averaged model. Also
  // without a test set: train() ends with an evaluation, which leaves every rank the same model.
  impl_->comm.sync_replicas();
  if (impl_->strategy) impl_->strategy->synchronize();  // the last step's parameter all-gathers (ZeRO)
  // zero_stage 3 evaluates through the sharded forward, as it trains: a unit is whole only while
  // it runs (no_grad: freed as it returns), never the whole model.
  ParallelStrategy* sharded =
      impl_->strategy && fsdp_hooks(*impl_->strategy) ? impl_->strategy.get() : nullptr;
  if (!test_data_ || !model_) return out;
  torch::NoGradGuard no_grad;
  // Rank 0's buffers (batch-norm statistics) everywhere, as DDP uses them in the next forward.
  if (group_ && world_ > 1)
    for (auto& b : model_->buffers()) gz::broadcast(b, 0, group_);
  model_->eval();
  const size_t n = test_data_->size();
  std::vector<std::vector<size_t>> batches;
  std::vector<size_t> cur;
  for (size_t i = static_cast<size_t>(rank_); i < n; i += static_cast<size_t>(world_)) {
    cur.push_back(i);
    if (cur.size() == static_cast<size_t>(config_.eval_batch_size)) batches.push_back(std::move(cur)), cur.clear();
  }
  if (!cur.empty()) batches.push_back(std::move(cur));
  // The sharded forward is collective (its all-gathers): every rank runs as many forwards as the
  // rank with the most batches (agreed, not derived: a node's copy of the test set may differ),
  // the extra ones on sample 0, and does not count them.
  const size_t counted = batches.size();
  if (sharded) {
    auto most = torch::tensor({static_cast<int64_t>(counted)}, torch::kInt64);
    gz::allreduce(most, comm::ReduceOp::max, group_);
    batches.resize(static_cast<size_t>(most.item<int64_t>()), std::vector<size_t>{0});
  }
  DataLoader loader(test_data_, std::move(batches), static_cast<int>(config_.num_workers));
  std::vector<double> sums{0, 0, 0};  // loss sum, correct, count
  const bool bf16 = config_.mixed_precision == "bf16", fp16 = config_.mixed_precision == "fp16";
  for (size_t k = 0; auto batch = loader.next(); ++k) {
    auto input = batch->input.to(impl_->device), label = batch->label.to(impl_->device);
    torch::Tensor logits;
    {
      AutocastGuard autocast(impl_->device.type(), fp16 ? torch::kHalf : torch::kBFloat16, bf16 || fp16);
      logits = sharded ? sharded->forward(input) : model_->forward(input);
    }
    if (k >= counted) continue;
    logits = logits.to(torch::kFloat32);
    sums[0] += torch::nn::functional::cross_entropy(
                   logits, label, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                   .item<double>();
    sums[1] += logits.argmax(1).eq(label).sum().item<double>();
    sums[2] += static_cast<double>(label.size(0));
  }
  allreduce_sum(sums);
  model_->train();
  if (sums[2] > 0) {
    out["test_loss"] = sums[0] / sums[2];
    out["test_accuracy"] = sums[1] / sums[2];
    out["test_samples"] = sums[2];
  }
  return out;
}

void Trainer::run_eval() {
  const auto& c = config_;
  Stopwatch eval_clock;
  auto m = evaluate();
  impl_->eval_seconds += eval_clock.seconds();
  if (m.empty()) return;
  impl_->last_eval_step = state_.step;
  state_.metrics = m;
  state_.metrics["train_loss"] = state_.loss;
  // Time-to-accuracy logs subtract evaluation time; bytes this rank handed to collectives.
  state_.metrics["eval_seconds"] = impl_->eval_seconds;
  if (group_)
    state_.metrics["comm_bytes_per_step"] =
        static_cast<double>(impl_->comm.bytes() - impl_->first_step_bytes) /
        static_cast<double>(std::max<int64_t>(1, state_.step - impl_->first_step));
  auto it = state_.metrics.find(c.metric_for_best_model);
  if (it != state_.metrics.end()) {
    double v = it->second;
    bool first = std::isnan(state_.best_metric);
    double delta = c.greater_is_better ? v - state_.best_metric : state_.best_metric - v;
    if (first || delta > c.early_stopping_threshold) {
      state_.best_metric = v;
      state_.best_step = state_.step;
      state_.evals_without_improvement = 0;
    } else {
      ++state_.evals_without_improvement;
    }
  }
  for_each_callback([&](Callback& cb) { cb.on_evaluate(*this); });
}

namespace {
// Runs `fn` however the scope is left (an exception included).
struct AtExit {
  explicit AtExit(std::function<void()> f) : fn(std::move(f)) {}
  ~AtExit() { fn(); }
  AtExit(const AtExit&) = delete;
  AtExit& operator=(const AtExit&) = delete;
  std::function<void()> fn;
};
}  // namespace

void Trainer::begin_training() {
  const auto& c = config_;
  if (is_main()) {
    std::error_code ec;
    fs::create_directories(c.work_dir, ec);
    if (ec) throw SystemError("create work_dir " + c.work_dir, ec.value());
    save_config(c, (fs::path(c.work_dir) / "config.yaml").string());
  }
  maybe_resume();
  agree_on_resumed_step();  // before anything that depends on the step (Horovod's after_load)
  // Snapshots newer than this run's start (another run's, or refused) would outrank its own.
  if (impl_->snapshot_writer && !restored_snapshot_) impl_->snapshots->remove_snapshots();
  if (impl_->held_snapshots && !restored_snapshot_) impl_->held_snapshots->remove_snapshots();
  if (c.log_samples) {
    // One id per launch, the same on every rank (rank 0's clock), naming this session's sample logs.
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    session_id_ = broadcast_value(std::chrono::duration_cast<std::chrono::nanoseconds>(now).count());
  }
  if (state_.step > 0) impl_->strategy->after_load();  // Horovod mode: rank 0's optimizer state
  for_each_callback([&](Callback& cb) { cb.on_train_begin(*this); });
  agree_on_resumed_step();  // last: a rank lost in the collectives above is still a recovery's
  impl_->first_step = state_.step;
  impl_->first_step_bytes = impl_->comm.bytes();
}

void Trainer::train_epoch() {
  const auto& c = config_;
  const size_t n = train_data_->size();
  // The rest of the epoch on this world, from the samples of its order already consumed.
  const int64_t epoch = state_.epoch;
  const BatchPlan& p = impl_->plan;
  EpochPlan plan(n, static_cast<size_t>(state_.epoch_samples), p.global_batch, p.accumulation, world_, rank_);
  if (plan.steps() == 0) {  // resumed at the end of an epoch: its end-of-epoch work is done
    ++state_.epoch;
    state_.epoch_samples = 0;
    return;
  }
  if (state_.epoch_samples == 0) for_each_callback([&](Callback& cb) { cb.on_epoch_begin(*this); });
  const size_t steps = std::min<size_t>(plan.steps(), static_cast<size_t>(state_.total_steps - state_.step));
  std::vector<std::vector<size_t>> batches = epoch_batches(plan, epoch, steps);
  DataLoader::Transform transform;
  if (c.augment) {
    const uint64_t seed = mix(static_cast<uint64_t>(c.seed) + 1, static_cast<uint64_t>(epoch));
    transform = [seed](Example e, size_t idx) { return augment_image(std::move(e), mix(seed, idx)); };
  }
  const std::vector<std::vector<size_t>> planned =
      c.log_samples ? batches : std::vector<std::vector<size_t>>{};
  DataLoader loader(train_data_, std::move(batches), static_cast<int>(c.num_workers), transform);
  for (size_t k = 0; k < steps && !state_.should_stop; ++k) {
    step_samples_.clear();
    for (size_t m = 0; c.log_samples && m < static_cast<size_t>(p.accumulation); ++m) {
      const auto& mb = planned[k * static_cast<size_t>(p.accumulation) + m];
      step_samples_.insert(step_samples_.end(), mb.begin(), mb.end());
    }
    state_.schedule_step =
        c.elastic_batch == "keep_global" ? state_.step : state_.samples_seen / p.reference_global_batch;
    for_each_callback([&](Callback& cb) { cb.on_step_begin(*this); });
    train_step(loader, p.accumulation, p.global_batch);
    ++state_.step;
    state_.epoch_samples += p.global_batch;
    state_.samples_seen += p.global_batch;
    if (c.eval_steps > 0 && state_.step % c.eval_steps == 0) run_eval();
    for_each_callback([&](Callback& cb) { cb.on_step_end(*this); });
    // Not at an epoch's last step: restoring it would skip that epoch's end (evaluation,
    // on_epoch_end, its checkpoint), which runs after this point.
    // zero_stage > 0: every rank takes part in the buddy exchange, writer or not.
    if ((impl_->snapshot_writer || impl_->shard_snapshots) && state_.step % c.snapshot_every == 0 &&
        static_cast<size_t>(state_.epoch_samples) != plan.end())
      take_snapshot();
    if (state_.step == crash_at_step_) {
      impl_->simulated_crash = true;
      GZ_THROW(Aborted, "rank ", rank_, ": simulated crash after step ", state_.step);
    }
  }
  if (static_cast<size_t>(state_.epoch_samples) == plan.end()) {
    if (c.eval_steps == 0 && impl_->last_eval_step != state_.step) run_eval();
    for_each_callback([&](Callback& cb) { cb.on_epoch_end(*this); });
    // A checkpoint written above records the epoch as consumed; resuming there moves on.
    ++state_.epoch;
    state_.epoch_samples = 0;
  }
}

void withdraw_from_moves(const std::function<void()>& withdraw, int rank, bool rethrow) {
  try {
    withdraw();
  } catch (const MovedError& e) {
    if (rethrow) throw;
    GZ_LOG(error, e.what());
  } catch (const std::exception& e) {
    GZ_LOG(warn, "rank ", rank, ": cannot withdraw from gzrun's moves: ", e.what());
  }
}

std::map<std::string, double> Trainer::train() {
  setup();
  const FlagScope in_train(impl_->in_train);  // a save outside train() is on disk when it returns
  // gzrun may move this worker to a new rank and world (an elastic job's node lost or admitted)
  // while train() can recover from it; before and after, it stops and restarts the workers.
  if (impl_->follows_moves) gz::accept_moves(true);
  bool accepting = impl_->follows_moves;
  // Withdrawn however train() ends; a move committed meanwhile fails it on the normal path.
  auto withdraw = [this, &accepting](bool rethrow) {
    if (!accepting) return;
    accepting = false;
    withdraw_from_moves([] { gz::accept_moves(false); }, rank_, rethrow);
  };
  const AtExit moves_off([&withdraw] { withdraw(false); });
  // However train() ends, no copy reads the live state after it: the caller may change it.
  const AtExit copies_finished([this] { finish_state_copies(); });
  impl_->clock.reset();
  try {
    begin_training();
  } catch (const std::exception& e) {
    // A peer lost while this process starts (a replacement meeting survivors that are lost in
    // turn): the same recovery, which runs begin_training() again with the new group.
    if (!recover_in_place(e)) throw;
  }
  for (bool evaluated = false; !evaluated;) {
    try {
      while (state_.step < state_.total_steps && !state_.should_stop) train_epoch();
      if (impl_->last_eval_step != state_.step) run_eval();  // the final evaluation is collective too
      evaluated = true;
    } catch (const std::exception& e) {
      if (!recover_in_place(e)) throw;
    }
  }
  // Nothing below recovers from a lost peer (the end's callbacks and the last writes): from here
  // on a lost or admitted node restarts the workers instead of moving them.
  withdraw(true);
  for_each_callback([&](Callback& cb) { cb.on_train_end(*this); });
  finish_state_copies();       // counted in the checkpoints' and snapshots' time logged below
  finish_checkpoint_writes();  // the last checkpoint is on disk when train() returns
  // An early stop ends the run too: its snapshots would only hold the node's memory.
  finish_snapshots(state_.step >= state_.total_steps || state_.should_stop);
  return state_.metrics;
}

std::string Trainer::summary_line() const {
  std::ostringstream os;
  os << "final:";
  for (const char* k : {"test_accuracy", "test_loss"}) {
    auto it = state_.metrics.find(k);
    if (it != state_.metrics.end()) os << " " << k << "=" << fmt(it->second);
  }
  os << " train_loss=" << fmt(state_.loss) << " steps=" << state_.step << " epochs="
     << fmt(static_cast<double>(state_.step) / std::max<int64_t>(1, state_.steps_per_epoch), 2)
     << " world=" << world_ << " mode=" << config_.mode << " time=" << fmt(impl_->clock.seconds(), 1) << "s";
  if (state_.best_step >= 0) os << " best_" << config_.metric_for_best_model << "=" << fmt(state_.best_metric) << "@" << state_.best_step;
  return os.str();
}

}  // namespace gz::train
