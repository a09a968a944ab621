// The Trainer's checkpoints (save, load, resume) and the small collectives they agree with.
#include <torch/torch.h>

#include <cstring>
#include <filesystem>
#include <optional>

#include "gz/core/error.h"
#include "gz/core/log.h"
#include "gz/core/phase.h"
#include "gz/torch/collectives.h"
#include "gz/torch/sharded_checkpoint.h"
#include "gz/train/checkpoint.h"
#include "train/strategy/fsdp_strategy.h"
#include "trainer_impl.h"

namespace gz::train {

namespace fs = std::filesystem;

int64_t Trainer::broadcast_value(int64_t value, int root) {
  if (!group_ || world_ == 1) return value;
  auto t = torch::tensor({value}, torch::kInt64);
  gz::broadcast(t, root, group_);
  return t.item<int64_t>();
}

std::string Trainer::broadcast_string(const std::string& text, int root) {
  if (!group_ || world_ == 1) return text;
  const int64_t n = broadcast_value(static_cast<int64_t>(text.size()), root);
  if (n == 0) return {};
  auto t = torch::zeros({n}, torch::kUInt8);
  if (rank_ == root) std::memcpy(t.data_ptr<uint8_t>(), text.data(), static_cast<size_t>(n));
  gz::broadcast(t, root, group_);
  return std::string(reinterpret_cast<const char*>(t.data_ptr<uint8_t>()), static_cast<size_t>(n));
}

void Trainer::agree(std::exception_ptr error, const std::string& what) {
  if (!group_ || world_ == 1) {
    if (error) std::rethrow_exception(error);
    return;
  }
  std::vector<double> failed(static_cast<size_t>(world_), 0.0);
  failed[static_cast<size_t>(rank_)] = error ? 1.0 : 0.0;
  allreduce_sum(failed);
  std::string ranks;
  int first = -1;
  for (int r = 0; r < world_; ++r) {
    if (failed[static_cast<size_t>(r)] == 0) continue;
    if (first < 0) first = r;
    ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  }
  if (first < 0) return;
  // The first failing rank's message travels to every rank, so each error says what went wrong.
  std::string message;
  if (rank_ == first) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      message = e.what();
    } catch (...) {
      message = "unknown exception";
    }
  }
  message = broadcast_string(message, first);
  if (error) std::rethrow_exception(error);
  GZ_THROW(Error, "rank ", rank_, ": ", what, " failed on rank(s) ", ranks, ": ", message);
}

TrainingState Trainer::live_state() {
  TrainingState s;
  s.model = module_tensors(*model_);
  s.optimizer = &impl_->strategy->optimizer();
  s.scaler = *impl_->scaler;
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    s.rng = gen.get_state();
  }
  s.counters = {state_.step,
                state_.epoch,
                state_.best_step,
                state_.evals_without_improvement,
                static_cast<int64_t>(world_),
                state_.total_steps,
                config_.batch_size,
                config_.gradient_accumulation_steps,
                state_.epoch_samples,
                state_.samples_seen,
                impl_->plan.reference_global_batch};
  s.best_metric = state_.best_metric;
  return s;
}

void Trainer::write_state(torch::serialize::OutputArchive& root) { write_training_state(live_state(), root); }

std::string Trainer::save_checkpoint() {
  gz::ScopedPhase phase(gz::Phase::checkpoint);
  finish_state_copies();  // ZeRO's before_save() gathers into the optimizer a copy may read
  Stopwatch clock;
  std::string dir;
  if (impl_->sharded_checkpoints) {
    if (config_.async_checkpoint && is_main() && !impl_->checkpoint_fallback_logged)
      GZ_LOG(info,
             "rank 0: sharded checkpoints are written on the training thread (async_checkpoint "
             "covers the consolidated format)");
    impl_->checkpoint_fallback_logged = true;
    dir = save_sharded_checkpoint();  // may fall back (auto): below
  }
  if (!impl_->sharded_checkpoints) {
    std::exception_ptr error;
    impl_->strategy->before_save();  // collective: ZeRO gathers the whole state on rank 0
    if (is_main()) {
      try {
        dir = write_consolidated_checkpoint();
      } catch (...) {
        error = std::current_exception();
      }
    }
    // Replaces a barrier: the other ranks wait here for rank 0's write (or copy), and learn if it
    // (or the last background write) failed instead of timing out in a collective rank 0 skips.
    agree(error, detail::concat("saving the checkpoint of step ", state_.step));
  }
  impl_->checkpoint_seconds += clock.seconds();
  ++impl_->checkpoints_saved;
  for_each_callback([&](Callback& cb) { cb.on_save(*this, dir); });
  return dir;
}

std::string Trainer::why_not_async(const TrainingState& live) const {
  if (!config_.async_checkpoint) return "async_checkpoint: false";
  if (!impl_->in_train) return "a save outside train()";
  // ZeRO's consolidated state is gathered into the optimizer for this save only.
  if (config_.zero_stage > 0) return detail::concat("zero_stage ", config_.zero_stage);
  return StateCapture::unsupported(live);
}

std::string Trainer::write_consolidated_checkpoint() {
  const TrainingState live = live_state();
  auto& writer = impl_->checkpoint_writer;
  if (writer) {  // one write at a time: this save waits for the last one (its failure throws)
    Stopwatch waiting;
    writer->wait();
    impl_->checkpoint_wait_seconds += waiting.seconds();
  }
  const std::string why = why_not_async(live);
  if (why.empty()) {
    if (!writer) writer = std::make_unique<CheckpointWriter>(*impl_->checkpoints);
    // Waited for before the next update; set first: a start() that throws after the copy began
    // leaves it running.
    impl_->checkpoint_copying = impl_->defer_state_copy ? &writer->capture() : nullptr;
    return writer->start(live, state_.step, state_.epoch, checkpoint_metrics(), impl_->defer_state_copy);
  }
  if (config_.async_checkpoint && impl_->in_train && !impl_->checkpoint_fallback_logged)
    GZ_LOG(info, "rank ", rank_, ": checkpoints of ", why, " are written on the training thread");
  impl_->checkpoint_fallback_logged = true;
  torch::serialize::OutputArchive root;
  write_training_state(live, root);
  return impl_->checkpoints->save(root, state_.step, state_.epoch, checkpoint_metrics());
}

void Trainer::finish_state_copies() {
  if (!impl_->checkpoint_copying && !impl_->snapshot_copying) return;
  // A checkpoint's cost on this rank, as take_snapshot() marks its own: the straggler report
  // must not charge the wait to the phase it happens in (the optimizer's, say).
  gz::ScopedPhase phase(gz::Phase::checkpoint);
  for (auto [copying, seconds] : {std::pair{&impl_->checkpoint_copying, &impl_->checkpoint_seconds},
                                  std::pair{&impl_->snapshot_copying, &impl_->snapshot_seconds}}) {
    if (!*copying) continue;
    Stopwatch waiting;
    (*copying)->wait_copied();  // a failed copy fails its write: reported there
    *seconds += waiting.seconds();
    *copying = nullptr;
  }
}

void Trainer::finish_checkpoint_writes() {
  std::exception_ptr error;
  auto& writer = impl_->checkpoint_writer;
  Stopwatch waiting;
  if (writer) {
    try {
      writer->wait();
    } catch (...) {
      error = std::current_exception();
    }
  }
  if (is_main() && impl_->checkpoints_saved > 0) {
    const double n = static_cast<double>(impl_->checkpoints_saved);
    const std::string background =
        writer ? detail::concat(writer->writes(), " written in the background (",
                                1e3 * writer->write_seconds() /
                                    static_cast<double>(std::max<int64_t>(1, writer->writes())),
                                " ms per write; the end of training waited ", 1e3 * waiting.seconds(), " ms)")
               : std::string("written on the training thread");
    GZ_LOG(info, "checkpoints: ", impl_->checkpoints_saved, " saved, ", 1e3 * impl_->checkpoint_seconds / n,
           " ms each blocking the training thread (", 1e3 * impl_->checkpoint_wait_seconds / n,
           " ms of it waiting for the last write); ", background);
  }
  agree(error, "writing the last checkpoint");
}

std::map<std::string, double> Trainer::checkpoint_metrics() const {
  auto metrics = state_.metrics;
  metrics["train_loss"] = state_.loss;
  return metrics;
}

void Trainer::load_checkpoint(const std::string& path) {
  torch::serialize::InputArchive root;
  auto info = CheckpointManager::open(path, root);
  apply_checkpoint(root, info, fs::is_directory(path) ? info.state_file() : path);
}

void Trainer::apply_checkpoint(torch::serialize::InputArchive& root, const CheckpointInfo& info,
                               const std::string& file) {
  if (!info.sharded) return apply_state(root, info, file, nullptr);
  // Sharded: state.pt holds what the shards do not. At zero_stage >= 1 the shards load
  // collectively, so every rank learns first whether every rank could apply state.pt.
  const bool collective = !impl_->strategy->replicated_state();
  std::exception_ptr error;
  try {
    const auto held = read_sharded_manifest(info.shards_dir()).params;
    apply_state(root, info, file, &held);
  } catch (...) {
    error = std::current_exception();
  }
  if (collective)
    agree(error, "loading checkpoint " + info.dir);
  else if (error)
    std::rethrow_exception(error);
  load_shards(info);
}

void Trainer::apply_state(torch::serialize::InputArchive& root, const CheckpointInfo& info,
                          const std::string& file, const std::vector<std::string>* sharded) {
  try {
    torch::serialize::InputArchive model_archive, opt_archive, scaler_archive;
    if (!root.try_read("model", model_archive)) GZ_THROW(Error, "checkpoint ", file, " has no model state");
    torch::Tensor counters, best, rng;
    if (!root.try_read("counters", counters) || counters.numel() < 8)
      GZ_THROW(Error, "checkpoint ", file, " has no trainer counters (not a training checkpoint?)");
    auto cnt = counters.to(torch::kInt64);
    auto at = [&](int i) { return cnt[i].item<int64_t>(); };
    const bool accounted = counters.numel() >= 11;  // written with the sample accounting
    if (sharded) {
      load_module_state(*model_, model_archive, file, *sharded);  // buffers, frozen parameters
    } else {
      auto* z3 = fsdp_hooks(*impl_->strategy);
      if (z3) z3->begin_load();  // whole model and optimizer to load into
      load_module_state(*model_, model_archive, file);
      if (root.try_read("optimizer", opt_archive)) impl_->strategy->optimizer().load(opt_archive);
      if (z3) z3->end_load();
    }
    if (root.try_read("scaler", scaler_archive)) impl_->scaler->load(scaler_archive);
    if (root.try_read("rng_cpu", rng)) {
      auto gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(rng);
    }
    state_.step = at(0);
    state_.epoch = at(1);
    state_.best_step = at(2);
    state_.evals_without_improvement = at(3);
    if (root.try_read("best_metric", best)) state_.best_metric = best.item<double>();
    state_.metrics = info.metrics;
    state_.metrics.erase("train_loss");
    // Where the data stands: the epoch and the samples of its order consumed, all ranks together,
    // so that any world size reads the rest of the epoch exactly once.
    const int64_t written_world = at(4);
    int64_t reference = at(6) * at(7) * written_world;
    if (accounted) {
      state_.epoch_samples = at(8);
      state_.samples_seen = at(9);
      reference = at(10);
    } else {
      const int64_t spe =
          std::max<int64_t>(1, static_cast<int64_t>(train_data_->size() / static_cast<size_t>(reference)));
      state_.epoch = state_.step / spe;
      state_.epoch_samples = (state_.step % spe) * reference;
      state_.samples_seen = state_.step * reference;
    }
    plan_steps(reference);
    if (written_world != world_ && is_main())
      GZ_LOG(info, "resuming on ", world_, " rank(s), checkpoint written by ", written_world,
             " (elastic_batch ", config_.elastic_batch, "): global batch ", state_.global_batch,
             " (first launch ", impl_->plan.reference_global_batch, "), ", impl_->plan.accumulation,
             " micro-batch(es) per step, lr x ", state_.lr_scale, "; epoch ", state_.epoch, " at sample ",
             state_.epoch_samples, " of ", train_data_->size());
  } catch (const gz::Error&) {
    throw;
  } catch (const c10::Error& e) {
    GZ_THROW(Error, "checkpoint ", file,
             " does not match this model/optimizer: ", e.what_without_backtrace());
  }
  if (state_.step > state_.total_steps)
    GZ_THROW(Error, "checkpoint ", file, " is at step ", state_.step, ", past this run's ",
             state_.total_steps, " steps");
}

// resume_from_checkpoint: auto without a snapshot: the checkpoint rank 0 chooses, opened on every
// rank; none when the folder holds none.
std::optional<CheckpointInfo> Trainer::open_auto_checkpoint(torch::serialize::InputArchive& archive) {
  // Every rank must end up at the same step, or they issue different collectives and hang. So
  // rank 0 alone lists the folder (other nodes may see a stale or different one) and decides.
  constexpr int64_t kNone = -1, kRankZeroFailed = -2;
  std::optional<CheckpointInfo> info;
  std::exception_ptr error;
  int64_t step = kNone;
  if (is_main()) {
    try {
      impl_->checkpoints->remove_temp_dirs();
      info = impl_->checkpoints->open_latest(archive);
      if (info) step = info->step;
    } catch (...) {
      step = kRankZeroFailed;
      error = std::current_exception();
    }
  }
  step = broadcast_value(step);
  if (step == kRankZeroFailed)
    agree(error, "resume_from_checkpoint: auto (choosing a checkpoint)");  // throws
  if (step == kNone) {
    if (is_main())
      GZ_LOG(info, "resume_from_checkpoint: auto found no checkpoint in ", impl_->checkpoints->root(),
             "; starting fresh");
    return std::nullopt;
  }
  if (!is_main()) {
    try {
      info = impl_->checkpoints->find(step);
      if (!info)
        GZ_THROW(Error, "rank ", rank_, ": checkpoint of step ", step, " (chosen by rank 0) is not in ",
                 impl_->checkpoints->root(), " on this rank; every node must see the same checkpoint folder");
      info = CheckpointManager::open(info->dir, archive);
    } catch (...) {
      error = std::current_exception();
    }
  }
  agree(error, detail::concat("loading the checkpoint of step ", step));
  return info;
}

void Trainer::maybe_resume() {
  const std::string& r = config_.resume_from_checkpoint;
  impl_->resumed_nothing = r.empty();
  if (r.empty()) return;
  torch::serialize::InputArchive archive;
  std::optional<CheckpointInfo> info;
  std::exception_ptr error;
  std::string path = r;
  if (r == "auto" && impl_->snapshots && restore_snapshot()) {
    restored_snapshot_ = true;
    return;
  }
  if (r == "auto") {
    info = open_auto_checkpoint(archive);
    if (!info) {
      impl_->resumed_nothing = true;
      return;
    }
    path = info->dir;
  } else {
    try {
      info = CheckpointManager::open(path, archive);
    } catch (...) {
      error = std::current_exception();
    }
    agree(error, "loading checkpoint " + path);
  }
  // The format decides whether loading is collective: rank 0's copy of the manifest decides, and
  // a rank whose copy says otherwise (a stale per-node folder) fails every rank, none hangs.
  if (group_ && world_ > 1) {
    const bool on_zero = broadcast_value(info->sharded ? 1 : 0) != 0;
    if (on_zero != info->sharded) {
      try {
        GZ_THROW(Error, "rank ", rank_, ": checkpoint ", path, " is ",
                 info->sharded ? "sharded" : "consolidated",
                 " here but not on rank 0; every node must see the same checkpoint folder");
      } catch (...) {
        error = std::current_exception();
      }
    }
    agree(error, "loading checkpoint " + path);
  }
  // A model or optimizer mismatch is the same on every rank, but agree anyway: no rank may go on.
  try {
    apply_checkpoint(archive, *info, fs::is_directory(path) ? info->state_file() : path);
  } catch (...) {
    error = std::current_exception();
  }
  agree(error, "applying checkpoint " + path);
  if (is_main()) GZ_LOG(info, "resumed from ", path, " at step ", state_.step);
}

}  // namespace gz::train
