// Private: the Trainer's state behind its pimpl, shared by trainer*.cpp.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <functional>
#include <memory>

#include "comm_algorithms.h"
#include "gz/comm/communicator.h"
#include "gz/core/deadline.h"
#include "gz/torch/grad_scaler.h"
#include "gz/train/checkpoint.h"
#include "gz/train/elastic_batch.h"
#include "gz/train/parallel_strategy.h"
#include "gz/train/recovery/snapshot_store.h"
#include "gz/train/scheduler.h"
#include "gz/train/trainer.h"
#include "recovery/checkpoint_writer.h"
#include "recovery/state_capture.h"

namespace gz::train {

/// @brief train()'s withdrawal from gzrun's moves: calls `withdraw` (gz::accept_moves(false)).
/// A gz::MovedError (gzrun committed this worker to a move: exiting 0 would leave the new round
/// waiting for it) is rethrown when `rethrow`, else logged; any other failure (the store gone or
/// closed after training, a timeout) is a warning: the end of a finished training still runs.
void withdraw_from_moves(const std::function<void()>& withdraw, int rank, bool rethrow);

// Sets a flag for a scope, however it ends (train()'s in_train, a recovery's recovering).
struct FlagScope {
  explicit FlagScope(bool& f) : flag(f) { flag = true; }
  ~FlagScope() { flag = false; }
  FlagScope(const FlagScope&) = delete;
  FlagScope& operator=(const FlagScope&) = delete;
  bool& flag;
};

struct Trainer::Impl {
  ParallelMode mode = ParallelMode::single;  // parsed once from config `mode`
  bool sharded_checkpoints = false;          // resolved once from config `checkpoint_format`
  /// @brief The optimizer over the model's parameters, as built from the config; the strategy
  /// steps it (or its ZeRO wrapper).
  std::shared_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<ParallelStrategy> strategy;
  std::unique_ptr<LrScheduler> scheduler;
  std::unique_ptr<CheckpointManager> checkpoints;
  // async_checkpoint: rank 0's background writer of disk checkpoints, made by the first save
  // that uses it (refers to `checkpoints`: declared after it, destroyed before it).
  std::unique_ptr<CheckpointWriter> checkpoint_writer;
  bool checkpoint_fallback_logged = false;
  bool in_train = false;               // async_checkpoint writes in the background only inside train()
  double checkpoint_seconds = 0;       // save_checkpoint() on the training thread, all of it
  double checkpoint_wait_seconds = 0;  // of it, waiting for the last background write
  int64_t checkpoints_saved = 0;
  std::unique_ptr<GradScaler> scaler;
  torch::Device device{torch::kCPU};
  Stopwatch clock;
  bool set_up = false;
  int64_t last_eval_step = -1;
  BatchPlan plan;
  // Compression, local SGD, async averaging (comm_algorithms.h); eval time for the time-to-accuracy logs.
  CommAlgorithms comm;
  double eval_seconds = 0;
  int64_t first_step = 0;
  int64_t first_step_bytes = 0;  // comm.bytes() at first_step (an in-place recovery moves both)
  // In-memory snapshots (snapshot_every): the node's folder, its writer on local rank 0 (the
  // writer refers to the store: declared after it, destroyed before it).
  // The captures the writer builds archives from: declared before the writer, whose
  // destructor runs its queued writes (they read the captures).
  std::unique_ptr<SnapshotStore> snapshots;
  std::unique_ptr<CaptureRing> snapshot_captures;
  std::unique_ptr<SnapshotWriter> snapshot_writer;
  bool snapshot_fallback_logged = false;
  double snapshot_seconds = 0;       // spent on the training thread (copying, waiting)
  double snapshot_wait_seconds = 0;  // of it, waiting for the writer (a capture, the queue)
  int64_t snapshots_taken = 0;
  // zero_stage > 0 (shard_snapshot.cpp): `snapshots` holds this rank's shard (every rank has a
  // writer); held_snapshots the copy of rank buddy_from's (the same local rank, previous node).
  // Every rank sends its shard to buddy_to. -1: one node, no buddy. All of it is of the current
  // group: an in-place recovery stops it before the regroup and starts it again on the new group.
  bool shard_snapshots = false;
  int snapshot_local_world = 0;  // set_snapshot_local_world(); 0: the launcher's
  int shard_per_node = 1;        // ranks per node of the current group's buddy ring
  int buddy_to = -1, buddy_from = -1;
  std::unique_ptr<SnapshotStore> held_snapshots;
  std::unique_ptr<SnapshotWriter> held_writer;
  std::atomic<bool> shard_snapshot_failed_logged{false};
  std::atomic<bool> own_writes_off{false}, held_writes_off{false};  // a write failed: off for the run
  std::atomic<int64_t> shard_exchange_ns{0};                        // the exchange's thread, in all
  // The exchange's own group (of all ranks): its progress thread serializes the shard copy and
  // sends it while the training thread goes on. Declared after the writers it hands payloads to,
  // and `shard_exchange` after the group: destroyed first, it waits for the exchange in flight.
  comm::CommPtr snapshot_comm;
  struct PendingWork {
    comm::WorkPtr work;
    ~PendingWork() {
      if (work) work->wait_finished();
    }
  } shard_exchange;
  // GZ_DEFER_STATE_COPY (default 1): a background checkpoint's or snapshot's copy of the
  // parameters and optimizer state runs alongside the next step; 0 copies on the training thread
  // (for a model whose forward changes its own parameters, and for A/B benchmarks).
  bool defer_state_copy = true;
  // In-place recovery (Trainer::set_regroup): the new group after a lost peer; empty = off.
  std::function<comm::CommPtr(const std::string&)> regroup;
  bool follows_moves = false;  // regroup is gz's default group's: gzrun's moves (accept_moves)
  int64_t recoveries = 0;
  bool recovering = false;       // in rejoin_and_restore(): the live state may be a step's half
  bool resumed_nothing = false;  // maybe_resume() found neither a snapshot nor a checkpoint
  bool simulated_crash = false;  // set_crash_at_step's exception is not a lost peer
  // Copies of the live state still running in the background (finish_state_copies() waits).
  StateCapture* checkpoint_copying = nullptr;
  StateCapture* snapshot_copying = nullptr;
};

}  // namespace gz::train
