// In-place recovery: when a peer is lost mid-training the surviving ranks keep their process
// (LibTorch, model, data stay loaded). They abort the group, meet the launcher's replacements
// in the group's next generation, and then run exactly what a replacement's train() runs from
// the strategy on: the same collectives in the same order, so both sides restore the same
// snapshot and continue at the same step.
#include <torch/torch.h>

#include "../trainer_impl.h"
#include "gz/core/env.h"
#include "gz/core/error.h"
#include "gz/core/log.h"
#include "gz/core/phase.h"
#include "gz/torch/collectives.h"
#include "gz/train/recovery/snapshot_store.h"

namespace gz::train {

namespace {
// Generations one recovery may go through when peers keep being lost while it runs.
constexpr int kRecoveryAttempts = 5;

// What a communicator reports for a peer that died, stopped or aborted (DDP's backward rethrows
// its buckets' errors as they were).
bool lost_peer(const std::exception& e) {
  return dynamic_cast<const PeerError*>(&e) || dynamic_cast<const TimeoutError*>(&e) ||
         dynamic_cast<const Aborted*>(&e);
}
}  // namespace

void Trainer::check_in_place_recovery() const {
  if (!impl_->regroup) return;
  const auto& c = config_;
  std::string missing;
  if (!group_)
    missing = "mode ddp or horovod (got " + c.mode + ")";
  else if (c.snapshot_every <= 0)
    missing = "snapshot_every > 0 (the state it restores)";
  else if (c.resume_from_checkpoint != "auto")
    missing = "resume_from_checkpoint: auto (how a replacement restores)";
  else if (snapshot_run_id(Env::from_process()).empty())
    missing =
        "a launcher's run id (GZ_RUN_ID or TORCHELASTIC_RUN_ID: a replacement finds the snapshots by it)";
  if (!missing.empty())
    GZ_THROW(InvalidArgument, "in-place recovery (gzrun --recovery in-place) needs ", missing,
             "; use gzrun's default --recovery restart otherwise");
}

void Trainer::agree_on_resumed_step() {
  if (!impl_->regroup || !group_) return;
  // Ranks that resumed at different steps (survivors restoring nothing while a replacement starts
  // at 0: no snapshot yet) would issue different collectives. A survivor that restored nothing
  // must not go on either, at any step: its live state may be a step's half (some ranks' optimizers
  // stepped), and at zero_stage > 0 the recovery rebuilt its optimizer (its moments are gone) and,
  // at stage 3, gave its parameters back. Stop every rank instead.
  const bool unrestored = impl_->recovering && impl_->resumed_nothing;
  std::vector<double> v{static_cast<double>(state_.step), -static_cast<double>(state_.step),
                        unrestored ? 1.0 : 0.0};
  auto t = torch::from_blob(v.data(), {3}, torch::kFloat64);
  gz::allreduce(t, comm::ReduceOp::max, group_);
  if (v[0] != -v[1] || v[2] > 0)
    GZ_THROW(Error, "in-place recovery: the ranks resumed at steps ", -v[1], " to ", v[0],
             v[2] > 0 ? " and a survivor restored nothing" : "",
             " (no snapshot or checkpoint that every rank holds); the job must restart");
}

bool Trainer::recover_in_place(const std::exception& error) {
  if (!impl_->regroup || impl_->simulated_crash || !lost_peer(error)) return false;
  std::string why = error.what();
  gz::ScopedPhase phase(gz::Phase::recovery);
  Stopwatch clock;
  // A peer lost during the recovery itself (a replacement that dies after joining, a survivor
  // lost in the restore) is one more generation, not the end of the job.
  for (int attempt = 1;; ++attempt) {
    GZ_LOG(warn, "rank ", rank_, ": ", why, "; recovering in place (recovery ", impl_->recoveries + 1,
           attempt > 1 ? ", attempt " + std::to_string(attempt) : std::string(), ")");
    try {
      rejoin_and_restore(why);
      break;
    } catch (const std::exception& again) {
      if (!lost_peer(again) || attempt >= kRecoveryAttempts) throw;
      why = again.what();
    }
  }
  ++impl_->recoveries;
  if (is_main())
    GZ_LOG(warn, "recovered in place at step ", state_.step, " in ", clock.seconds(), " s (",
           restored_snapshot_ ? "snapshot" : "checkpoint", ")");
  return true;
}

void Trainer::rejoin_and_restore(const std::string& why) {
  // Nothing may read or write the live state behind the restore: the copies of a save or
  // snapshot, the group's pending ops (DDP's buckets: the abort completes them), rank 0's
  // background checkpoint write (the restore lists the checkpoints, and a fallback to them
  // removes unfinished folders) and the writer's last snapshot, which should be on the node
  // before the ranks choose one (else a step more is redone).
  finish_state_copies();
  if (group_ && !group_->aborted())
    group_->abort("rank " + std::to_string(rank_) + " recovers in place: " + why);
  stop_shard_snapshots(why);  // zero_stage > 0: its exchange group and buddies are the old group's
  impl_->strategy.reset();
  try {
    if (impl_->checkpoint_writer) impl_->checkpoint_writer->wait();
  } catch (const std::exception& e) {
    GZ_LOG(warn, "rank ", rank_, ": the last background checkpoint failed (", e.what(), ")");
  }
  try {
    if (impl_->snapshot_writer) impl_->snapshot_writer->flush();
  } catch (const std::exception& e) {
    GZ_LOG(warn, "rank ", rank_, ": the last snapshot's write failed (", e.what(), ")");
  }
  comm::CommPtr fresh = impl_->regroup(why);
  if (!fresh) GZ_THROW(Error, "in-place recovery: the regroup returned no group");
  if (fresh->rank() != rank_ || fresh->size() != world_) {
    // The launcher moved the job to a new round (a node lost or admitted): the restore below
    // re-plans the batches for the new world (elastic_batch), as a restarted worker's would.
    GZ_LOG(warn, "rank ", rank_, " of ", world_, " continues as rank ", fresh->rank(), " of ", fresh->size());
    rank_ = fresh->rank();
    world_ = fresh->size();
    plan_steps(impl_->plan.reference_global_batch);  // the restore plans again from what it loads
  }
  group_ = std::move(fresh);
  // From here on what a replacement's train() runs: the strategy (rank 0's parameters), then
  // the restore, the session and the callbacks' on_train_begin (collective ones included).
  // State a replacement starts without is reset: an epoch end redone must evaluate again.
  impl_->last_eval_step = -1;
  restored_snapshot_ = false;
  // ZeRO's strategy pointed the optimizer at its shards and gave it their state: a fresh one, as
  // a replacement's setup() makes, is what it shards again.
  if (config_.zero_stage > 0) build_optimizer();
  build_strategy();
  if (impl_->shard_snapshots) start_shard_snapshots(impl_->snapshots->dir(), impl_->snapshots->run());
  const FlagScope recovering(impl_->recovering);
  begin_training();  // agree_on_resumed_step() included
}

}  // namespace gz::train
