// The Trainer: builds model, optimizer, schedule, data and distribution mode from a TrainConfig and
// runs the loop (gradient accumulation, evaluation, mixed precision, checkpoints, exact resume).
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gz/comm/communicator.h"
#include "gz/train/callback.h"
#include "gz/train/config.h"
#include "gz/train/data/dataset.h"
#include "gz/train/models/model.h"
#include "gz/train/train_state.h"

namespace gz::train {

class LrScheduler;
class CheckpointManager;
struct CheckpointInfo;
struct TrainingState;
struct SnapshotHeader;

/// @brief Runs one training job on this rank.
///
/// Modes: single (one process), ddp (gradients averaged across the group during backward),
/// horovod (DistributedOptimizer-style averaging before the step, parameters and optimizer state
/// broadcast from rank 0), dp (one process, CPU replicas). Every rank builds the same model from the
/// same seed; each optimizer step reads the next global batch of a per-epoch permutation, each rank
/// its share (gz/train/elastic_batch.h). lr is a pure function of the step, so resuming (model,
/// optimizer, scaler, RNG, step, samples consumed in the epoch) continues exactly where the
/// checkpoint was taken, on the same world size or another one (config key elastic_batch says
/// whether the global batch or the per-rank batch is kept; no sample of the epoch is repeated or
/// skipped either way).
class Trainer {
 public:
  /// @brief `group`: communicator for ddp/horovod; nullptr = gz's default group when initialized,
  /// otherwise a single process. Validates the config (gz::InvalidArgument).
  explicit Trainer(TrainConfig config, comm::CommPtr group = nullptr);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// @brief Use this model instead of create_model(config) (call before train()).
  void set_model(ModelPtr model);
  /// @brief Use these datasets instead of the ones the config names (test may be null).
  void set_datasets(DatasetPtr train, DatasetPtr test);
  /// @brief Add a callback after the built-in ones.
  void add_callback(CallbackPtr callback);
  /// @brief Built-in callbacks (lr, progress, history, checkpoints, early stopping, pruning); default on.
  void set_default_callbacks(bool on);
  /// @brief Test hook: throw gz::Aborted right after this optimizer step (simulated crash; no save).
  void set_crash_at_step(int64_t step);
  /// @brief Test hook: ranks per node for the buddy copies of zero_stage > 0 snapshots (rank r's
  /// shard is copied to rank r + n); threads as ranks have no launcher to say it. 0: the launcher's
  /// (gz::local_size()), else the whole world (one node).
  void set_snapshot_local_world(int ranks_per_node);
  /// @brief Recover in place: when training fails because a peer was lost or stopped (gz::PeerError,
  /// gz::TimeoutError, gz::Aborted from the group), this rank does not end train(): it aborts the
  /// group, takes the one `regroup` returns (the same ranks and size, shared with the launcher's
  /// replacements of the lost processes; or another rank and size, which this rank adopts),
  /// rebuilds the mode's strategy, restores the newest in-memory snapshot every rank can reach,
  /// as a replacement's train() does, and goes on. At zero_stage > 0 the shard snapshots' buddies
  /// and exchange group are rebuilt from the new group, and the newest snapshot whose every shard
  /// some rank's folder holds is restored, whatever world size wrote it (another's resharded; the
  /// files of other world sizes are removed after the restore). A survivor that finds nothing to
  /// restore stops (gz::Error: the job must restart) rather than go on from its live state.
  /// Needs snapshot_every > 0, resume_from_checkpoint: auto and a launcher's run id
  /// (gz::InvalidArgument from train() otherwise). Under gzrun --recovery in-place (GZ_RECOVERY=
  /// in_place) a Trainer on gz's default group uses gz::regroup() unless this was called, and
  /// while train() runs it accepts gzrun's moves of an elastic job (gz::accept_moves); a regroup
  /// set here does not.
  void set_regroup(std::function<comm::CommPtr(const std::string& why)> regroup);
  /// @brief In-place recoveries this Trainer went through.
  int64_t recoveries() const;

  /// @brief Set up, resume if configured, train, evaluate; returns the final metrics.
  ///
  /// resume_from_checkpoint: auto: rank 0 alone lists the checkpoint folder (after cleaning up
  /// interrupted saves), picks the newest checkpoint that opens (skipping damaged ones with a
  /// warning) and broadcasts its step; every rank loads that step from its own view of the folder.
  /// If any rank cannot, every rank throws (gz::Error naming the ranks and the step).
  std::map<std::string, double> train();
  /// @brief Exact accuracy/loss over the whole test set (sharded across ranks, sums all-reduced).
  /// zero_stage 3: through the sharded forward, one unit whole at a time (never the whole model).
  std::map<std::string, double> evaluate();
  /// @brief Collective: make model()'s parameters whole for reading outside train(). Needed at
  /// zero_stage 3 only, where they hold no memory between steps (this gathers the whole model on
  /// every rank until the next forward: a training step or evaluate(), which free it again; a
  /// callback reading model() at stage 3 must call it first, on every rank); elsewhere it waits
  /// for ZeRO's parameter all-gathers. Nothing before train().
  void gather_model();
  /// @brief Collective: the main process writes a checkpoint of the current state while the others
  /// wait; every rank learns whether it worked. Returns the directory (empty on other ranks).
  /// A failed save throws on every rank: the original error on rank 0, a gz::Error quoting it on
  /// the others (no rank is left waiting for a collective that never comes). Sharded
  /// (checkpoint_format): every rank writes its shard into the directory's shards/ folder (which
  /// every rank must see), the main process the rest and the manifest. Inside train() with
  /// async_checkpoint the main process only copies the state and a background thread writes it:
  /// the directory (also the one on_save callbacks get) is complete when the next save or
  /// train() returns, and a failed write throws there, on every rank.
  std::string save_checkpoint();
  /// @brief Restore a checkpoint (dir or state.pt) into model, optimizer, scaler, RNG and state
  /// (train() resumes collectively, see resume_from_checkpoint). This rank only, except at
  /// zero_stage >= 1 with a sharded checkpoint and at zero_stage 3: there every rank must call
  /// it (the shards are read or gathered collectively).
  void load_checkpoint(const std::string& path);
  /// @brief Write the checkpoint `src` (a directory of either format, or a state file) as one
  /// consolidated state file `out` (atomically), which resume_from_checkpoint and
  /// load_checkpoint() take at any stage and world size. One process: build this Trainer with
  /// mode single and the config of the job that wrote `src` (its model and optimizer).
  void export_checkpoint(const std::string& src, const std::string& out);
  /// @brief "final: test_accuracy=0.9123 test_loss=0.2500 steps=... time=...".
  std::string summary_line() const;

  const TrainConfig& config() const { return config_; }
  TrainState& state() { return state_; }
  const TrainState& state() const { return state_; }
  /// @brief The bare model (not the DDP wrapper).
  ModelPtr model() const { return model_; }
  torch::optim::Optimizer& optimizer();
  const LrScheduler& scheduler() const;
  CheckpointManager& checkpoints();
  int rank() const { return rank_; }
  int world_size() const { return world_; }
  bool is_main() const { return rank_ == 0; }
  /// @brief The communicator of modes ddp and horovod (nullptr in single and dp modes).
  comm::CommPtr group() const { return group_; }
  /// @brief Sum `values` over ranks in place (identity in single mode).
  void allreduce_sum(std::vector<double>& values);
  /// @brief Seconds since train() began.
  double elapsed_seconds() const;
  /// @brief Dataset indices this rank trained on in the current optimizer step (valid from
  /// on_step_begin to the next step).
  const std::vector<size_t>& step_samples() const { return step_samples_; }
  /// @brief Identifies this run (launch) of train(), the same on every rank: rank 0's wall clock
  /// in ns when it started (set when log_samples is on, 0 otherwise).
  int64_t session_id() const { return session_id_; }

 private:
  struct Impl;
  void setup();
  // The config's optimizer over the model's parameters, without state.
  void build_optimizer();
  // Collective in ddp/horovod mode: the strategy of the config's mode over group_.
  void build_strategy();
  void train_step(class DataLoader& loader, int64_t accumulation, int64_t global_batch);
  /// @brief The epoch's order of the training set (a permutation depending on seed and epoch).
  std::vector<size_t> epoch_order(int64_t epoch) const;
  /// @brief This rank's micro-batches (dataset indices) of the next `steps` steps of `plan`.
  std::vector<std::vector<size_t>> epoch_batches(const class EpochPlan& plan, int64_t epoch,
                                                 size_t steps) const;
  /// @brief Global batch, accumulation, steps and lr schedule on this world; `reference` = the
  /// first launch's global batch (0 = this is it). Called by setup() and after a resume.
  void plan_steps(int64_t reference);
  void maybe_resume();
  // resume_from_checkpoint: auto: the checkpoint rank 0 chose, opened on every rank (collective;
  // every rank throws when one cannot); none (on every rank) when there is none.
  std::optional<CheckpointInfo> open_auto_checkpoint(torch::serialize::InputArchive& archive);
  // The rest of the current epoch (or up to total_steps), on the current world.
  void train_epoch();
  // In-place recovery (src/train/recovery/in_place_recovery.cpp): false when `error` is not a
  // lost peer or recovery is off (the caller rethrows); else true once every rank continues from
  // the same restored step.
  bool recover_in_place(const std::exception& error);
  // One attempt: abort, settle the background work, the next generation, the strategy, the restore.
  void rejoin_and_restore(const std::string& why);
  // Collective with in-place recovery on, after the resume: every rank throws unless all resumed
  // at the same step (a survivor and a replacement that found nothing to restore).
  void agree_on_resumed_step();
  // Throws gz::InvalidArgument when in-place recovery is on but the config cannot support it.
  void check_in_place_recovery() const;
  // train()'s start: work_dir and config.yaml, the resume, the session id, on_train_begin.
  void begin_training();
  // Evaluate, record the metrics and the best one, tell the callbacks.
  void run_eval();
  // What a checkpoint or snapshot holds (model, optimizer, scaler, RNG, counters), by reference.
  TrainingState live_state();
  // The archive of a checkpoint: live_state() written.
  void write_state(torch::serialize::OutputArchive& root);
  // Rank 0's part of a consolidated save: the state copied and written in the background
  // (async_checkpoint), else written here. Returns the checkpoint's directory.
  std::string write_consolidated_checkpoint();
  // Why this save cannot be written in the background (empty: it can).
  std::string why_not_async(const TrainingState& live) const;
  // Collective, at the end of train(): waits for rank 0's background write; every rank throws
  // if it failed.
  void finish_checkpoint_writes();
  // The metrics a checkpoint's manifest records (the last evaluation's and train_loss).
  std::map<std::string, double> checkpoint_metrics() const;
  // In-memory snapshots (src/train/recovery/trainer_snapshot.cpp). restore_snapshot() is
  // collective: false when no rank holds one, the disk checkpoint is newer, or it cannot be read.
  void setup_snapshots();
  void take_snapshot();
  // The snapshot's state copied into the next capture, its archive built on the writer's thread.
  void submit_capture(const TrainingState& live, const SnapshotHeader& header);
  bool restore_snapshot();
  // `lacks`: this rank's node does not hold `step` (it receives it from `source`).
  std::optional<std::string> read_snapshot(int64_t step, int source, bool all_hold, bool lacks);
  // Collective: whether every rank read `what` (`ok`); else each failed rank warns its `error`,
  // rank 0 that the disk checkpoint is used, and false.
  bool every_rank_read(bool ok, const std::string& error, const std::string& what);
  // Collective: the newest disk checkpoint's step (rank 0's listing; -1: none); rank 0 says so
  // when it is newer than the snapshot of `snapshot_step` (which the restore then skips).
  int64_t disk_checkpoint_step(int64_t snapshot_step);
  void finish_snapshots(bool completed);
  // zero_stage > 0 (src/train/recovery/shard_snapshot.cpp): every rank's shard, a copy on the
  // same local rank of the next node. Both collective (the copy is sent point-to-point).
  void setup_shard_snapshots(const std::string& dir, const std::string& run);
  // What setup does, on the current group: again after an in-place recovery's regroup (new rank,
  // world, buddies, exchange group). stop_shard_snapshots() ends the old group's before it.
  void start_shard_snapshots(const std::string& dir, uint64_t run);
  void stop_shard_snapshots(const std::string& why);
  void take_shard_snapshot();
  // Waits for the last snapshot's serialization and buddy exchange; rethrows its failure.
  void wait_shard_exchange();
  // The exchange itself (on the exchange group's progress thread): `payload` to this rank's
  // writer and to the buddy, the buddy's shard back to the other writer.
  static void exchange_shard_snapshot(Impl& im, const SnapshotHeader& h, int rank, std::string payload);
  // Collective: chooses (choose_shard_snapshot), restores and then removes the files of other
  // world sizes (remove_other_worlds_shards); false: the disk checkpoint.
  bool restore_shard_snapshot();
  // Collective: the snapshot of `step` written by holder.size() ranks, holder[q] sending old rank
  // q's shard when it is not this world's; false when the disk checkpoint is newer or a read failed.
  bool restore_shard_snapshot(int64_t step, const std::vector<int>& holder);
  // Reads (or receives from its buddy) this rank's shard snapshot of `step`; nullopt on every
  // rank when any rank could not read its part.
  std::optional<std::string> fetch_shard_snapshot(int64_t step, const std::vector<int64_t>& own_ranks);
  void apply_shard_snapshot(const std::string& payload, int64_t step);
  // A shard snapshot's rest (buffers, counters, RNG, scaler, data position; `rest`, its archive)
  // applied as a sharded checkpoint's state.pt is, the steps re-planned for this world.
  void apply_shard_rest(const std::string& rest, int64_t step, const std::string& name);
  // Collective: the newest step, of any world size W, whose every shard (of the W ranks that
  // wrote it) some rank's folder holds, and holder[q] (size W) the lowest such rank of old rank
  // q's shard; -1 (a warning when snapshots were found) otherwise. A snapshot of another world
  // (after a node's loss, or a restart on fewer or more ranks) is restored resharded: each old
  // shard sent by its holder to every rank (gather_old_shards).
  int64_t choose_shard_snapshot(std::vector<int>& holder);
  // Collective: the same-world path for `step`; nullopt (on every rank) when some shard is on no
  // node its rank or its buddy reads (then the disk checkpoint), false when a read failed;
  // `from_own`: the shards read on their rank's node.
  std::optional<bool> restore_same_world_snapshot(int64_t step, int& from_own);
  // Every old rank's payload (the rest, its shard) from its holder; nullopt on every rank when a
  // holder could not read one.
  std::optional<std::vector<std::string>> gather_old_shards(int64_t step, const std::vector<int>& holder);
  void apply_resharded_snapshot(std::vector<std::string>& payloads, int64_t step);
  // Shard snapshots of old rank q at shards[q] (any world size) loaded into this world's shards.
  void load_shard_snapshots(const std::vector<std::string>& shards, const std::string& where, int64_t step);
  // Local rank 0: removes its folder's shard files of this run written by a world of another size.
  void remove_other_worlds_shards();
  // Wait for the background copies of the live state (StateCapture::capture_deferred) still
  // running: before anything changes parameters or optimizer state. Adds the wait to the
  // checkpoints' or snapshots' time on the training thread.
  void finish_state_copies();
  // Every callback's hook, in order; before a callback that may change the training state
  // (Callback::changes_training_state), finish_state_copies().
  void for_each_callback(const std::function<void(Callback&)>& hook);
  uint64_t snapshot_fingerprint() const;
  // Apply an opened checkpoint archive (`file` names it in errors). Collective at zero_stage >= 1
  // when the checkpoint is sharded.
  void apply_checkpoint(torch::serialize::InputArchive& root, const CheckpointInfo& info,
                        const std::string& file);
  // apply_checkpoint()'s state.pt part; `sharded`: the parameter names the shards hold (null: a
  // consolidated checkpoint, optimizer state included).
  void apply_state(torch::serialize::InputArchive& root, const CheckpointInfo& info, const std::string& file,
                   const std::vector<std::string>* sharded);
  // Sharded checkpoints (trainer_sharded_checkpoint.cpp): save (collective), and the shards'
  // part of a load (collective at zero_stage >= 1).
  std::string save_sharded_checkpoint();
  void write_shards(const std::string& dir);
  void load_shards(const CheckpointInfo& info);
  // This rank's shard copied, and a function that serializes the copy in the sharded checkpoint's
  // per-rank format (`held`: the names of the parameters it holds); the load of such bytes
  // (collective at zero_stage >= 1).
  std::function<std::string()> snapshot_shard(std::vector<std::string>* held);
  void load_shard_bytes(const std::string& bytes, const std::string& where, int64_t step);
  // Collective: an all-reduce of per-rank failure flags. If any rank failed, every rank throws: a
  // failing rank its own exception, the others a gz::Error quoting the lowest failing rank's.
  void agree(std::exception_ptr error, const std::string& what);
  // Collective: root's value / string on every rank.
  int64_t broadcast_value(int64_t value, int root = 0);
  std::string broadcast_string(const std::string& text, int root);

  TrainConfig config_;
  comm::CommPtr group_;
  int rank_ = 0;
  int world_ = 1;
  TrainState state_;
  ModelPtr model_;
  DatasetPtr train_data_, test_data_;
  std::vector<CallbackPtr> callbacks_;
  std::vector<CallbackPtr> user_callbacks_;
  bool default_callbacks_ = true;
  int64_t crash_at_step_ = -1;
  std::vector<size_t> step_samples_;
  int64_t session_id_ = 0;
  bool restored_snapshot_ = false;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gz::train
