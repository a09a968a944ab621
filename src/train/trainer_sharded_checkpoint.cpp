// The Trainer's sharded checkpoints (config checkpoint_format): every rank writes its shard of the
// trained parameters and optimizer state into checkpoint-<step>/shards/ (gz/torch/sharded_checkpoint.h),
// rank 0 the rest (counters, RNG, scaler, buffers, frozen parameters) as state.pt and the manifest.
// CheckpointManager's begin/commit keep the one rule of atomic checkpoint directories.
#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <set>
#include <vector>

#include "gz/core/error.h"
#include "gz/core/log.h"
#include "gz/torch/fully_shard.h"
#include "gz/torch/sharded_checkpoint.h"
#include "gz/torch/zero_redundancy_optimizer.h"
#include "gz/train/atomic_file.h"
#include "gz/train/checkpoint.h"
#include "recovery/state_capture.h"
#include "train/strategy/fsdp_strategy.h"
#include "trainer_impl.h"

namespace gz::train {

namespace fs = std::filesystem;

namespace {

ZeroRedundancyOptimizer* zero_optimizer(ParallelStrategy& s) {
  return dynamic_cast<ZeroRedundancyOptimizer*>(&s.optimizer());
}

}  // namespace

namespace {
// Whether this rank sees the shard folder rank 0 made (tests fake a work_dir per node by a hook).
bool sees_folder(CheckpointManager& manager, const std::string& shards, std::exception_ptr& error) {
  try {
    const auto& visible = manager.test_hooks().shards_visible;
    const bool seen = visible ? visible(shards) : fs::is_directory(shards);
    if (seen && manager.test_hooks().before_shards) manager.test_hooks().before_shards(shards);
    return seen;
  } catch (...) {
    error = std::current_exception();
    return true;
  }
}
}  // namespace

std::string Trainer::save_sharded_checkpoint() {
  auto& manager = *impl_->checkpoints;
  const std::string what = detail::concat("saving the checkpoint of step ", state_.step);
  std::optional<PendingCheckpoint> pending;  // rank 0's: it alone decides the folder and commits
  std::exception_ptr error;
  if (is_main()) {
    try {
      pending = manager.begin(state_.step, true);
    } catch (...) {
      error = std::current_exception();
    }
  }
  try {
    agree(error, what);
    const std::string shards = broadcast_string(pending ? pending->shards_dir() : std::string(), 0);
    const bool seen = sees_folder(manager, shards, error);
    std::vector<double> unseen{seen ? 0.0 : 1.0};
    allreduce_sum(unseen);
    if (unseen[0] > 0 && config_.checkpoint_format == "auto") {
      // A work_dir per node (fine for rank 0's single file) cannot hold a sharded checkpoint:
      // auto keeps the run checkpointing the way it did before sharding existed.
      if (pending) manager.abort(*pending);
      impl_->sharded_checkpoints = false;
      if (is_main())
        GZ_LOG(warn, "checkpoint_format auto: ", unseen[0], " rank(s) cannot see ", shards,
               " (no folder every rank sees); writing consolidated checkpoints for the rest of this run");
      return {};
    }
    if (!seen && !error) {
      try {
        GZ_THROW(
            Error, "rank ", rank_, ": the shard folder ", shards, " (made by rank 0) is not visible here; ",
            "sharded checkpoints need a work_dir that every rank sees (or checkpoint_format: consolidated)");
      } catch (...) {
        error = std::current_exception();
      }
    }
    agree(error, what);
    try {
      write_shards(shards);  // collective: fails on every rank when one rank's write failed
    } catch (...) {
      error = std::current_exception();
    }
    agree(error, what);
    std::string dir;
    if (is_main()) {
      try {
        torch::serialize::OutputArchive root;
        // Everything the shards do not hold; no optimizer state, no gathered parameters.
        const auto held = read_sharded_manifest(shards).params;
        const std::set<std::string> in_shards(held.begin(), held.end());
        TrainingState s = live_state();
        s.optimizer = nullptr;
        s.model.erase(
            std::remove_if(s.model.begin(), s.model.end(),
                           [&](const NamedTensor& t) { return !t.buffer && in_shards.count(t.name); }),
            s.model.end());
        write_training_state(s, root);
        // commit() cleans up after itself; once it replaces the directory, the new checkpoint
        // may be the only complete copy of this step: nothing here may remove it.
        const PendingCheckpoint p = *pending;
        pending.reset();
        dir = manager.commit(p, root, state_.epoch, checkpoint_metrics(), true);
      } catch (...) {
        error = std::current_exception();
      }
    }
    agree(error, what);
    return dir;
  } catch (...) {
    if (pending) manager.abort(*pending);  // older checkpoints stay as they were
    throw;
  }
}

void Trainer::write_shards(const std::string& dir) {
  ShardedCheckpointMeta meta;
  meta.step = state_.step;
  auto& s = *impl_->strategy;
  if (auto* z3 = fsdp_hooks(s))
    z3->fsdp().save_sharded(s.optimizer(), dir, meta);
  else if (auto* zero = zero_optimizer(s))
    zero->save_sharded(dir, meta);
  else
    GZ_THROW(InvalidArgument, "sharded checkpoints need zero_stage 1, 2 or 3 (mode ", config_.mode,
             ", zero_stage ", config_.zero_stage, ")");
}

void Trainer::load_shards(const CheckpointInfo& info) {
  ShardedCheckpointMeta expect;
  expect.step = info.step;
  const std::string dir = info.shards_dir();
  auto& s = *impl_->strategy;
  if (auto* z3 = fsdp_hooks(s))
    z3->fsdp().load_sharded(s.optimizer(), dir, expect);  // collective
  else if (auto* zero = zero_optimizer(s))
    zero->load_sharded(dir, expect);  // collective
  else
    load_sharded_whole(*model_, s.optimizer(), dir, expect);  // zero_stage 0: the whole state, here
}

std::function<std::string()> Trainer::snapshot_shard(std::vector<std::string>* held) {
  ShardedCheckpointMeta meta;
  meta.step = state_.step;
  auto& s = *impl_->strategy;
  if (auto* z3 = fsdp_hooks(s)) return z3->fsdp().snapshot_shard(s.optimizer(), meta, held);
  if (auto* zero = zero_optimizer(s)) return zero->snapshot_shard(meta, held);
  GZ_THROW(InvalidArgument, "shard snapshots need zero_stage 1, 2 or 3 (mode ", config_.mode, ", zero_stage ",
           config_.zero_stage, ")");
}

void Trainer::load_shard_bytes(const std::string& bytes, const std::string& where, int64_t step) {
  ShardedCheckpointMeta expect;
  expect.step = step;
  auto& s = *impl_->strategy;
  if (auto* z3 = fsdp_hooks(s))
    z3->fsdp().load_shard_bytes(s.optimizer(), bytes, where, expect);  // collective
  else if (auto* zero = zero_optimizer(s))
    zero->load_shard_bytes(bytes, where, expect);  // collective
  else
    GZ_THROW(InvalidArgument, "shard snapshots need zero_stage 1, 2 or 3 (zero_stage ", config_.zero_stage,
             ")");
}

void Trainer::load_shard_snapshots(const std::vector<std::string>& shards, const std::string& where,
                                   int64_t step) {
  ShardedCheckpointMeta expect;
  expect.step = step;
  auto& s = *impl_->strategy;
  if (auto* z3 = fsdp_hooks(s))
    z3->fsdp().load_shard_snapshots(s.optimizer(), shards, where, expect);  // collective
  else if (auto* zero = zero_optimizer(s))
    zero->load_shard_snapshots(shards, where, expect);  // collective
  else
    GZ_THROW(InvalidArgument, "shard snapshots need zero_stage 1, 2 or 3 (zero_stage ", config_.zero_stage,
             ")");
}

void Trainer::export_checkpoint(const std::string& src, const std::string& out) {
  if (world_ != 1)
    GZ_THROW(InvalidArgument, "export_checkpoint: run it in one process (mode single), not ", world_);
  setup();
  load_checkpoint(src);
  torch::serialize::OutputArchive root;
  write_state(root);  // the consolidated format: whole model and optimizer state
  const std::string tmp = temp_name_for(out);
  try {
    root.save_to(tmp);
    fsync_path(tmp);
  } catch (const c10::Error& e) {
    std::error_code ec;
    fs::remove(tmp, ec);
    GZ_THROW(Error, "export_checkpoint: cannot write ", out, ": ", e.what_without_backtrace());
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  if (::rename(tmp.c_str(), out.c_str()) != 0) throw SystemError("rename " + tmp + " -> " + out, errno);
}

}  // namespace gz::train
