// Checkpoint directories: work_dir/checkpoints/checkpoint-<step>/{state.pt, manifest.json} (and
// shards/ in a sharded one: a file per rank and their manifest), written atomically (temp dir,
// fsync, rename; an existing step is swapped with RENAME_EXCHANGE), rotated to a limit, never
// deleting the best one.
#pragma once

#include <torch/nn/module.h>
#include <torch/serialize/archive.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace gz::train {

/// @brief What manifest.json says about one checkpoint.
struct CheckpointInfo {
  std::string dir;        ///< the checkpoint directory
  int64_t step = 0;
  int64_t epoch = 0;
  int64_t state_bytes = 0;  ///< size of state.pt when written (truncation check)
  std::map<std::string, double> metrics;
  /// @brief The model's trained parameters and the optimizer state are in shards_dir() (a sharded
  /// checkpoint of gz/torch/sharded_checkpoint.h, one file per rank); state.pt holds the rest.
  bool sharded = false;
  std::string state_file() const { return dir + "/state.pt"; }
  std::string shards_dir() const { return dir + "/shards"; }
};

/// @brief A checkpoint being written (CheckpointManager::begin): its files go into tmp_dir, which
/// commit() turns into dir.
struct PendingCheckpoint {
  std::string tmp_dir;
  std::string dir;
  int64_t step = 0;
  std::string shards_dir() const { return tmp_dir + "/shards"; }
};

/// @brief Fault injection for tests of the replace path; production code leaves these unset.
struct CheckpointTestHooks {
  /// @brief Act as if the file system refused renameat2(RENAME_EXCHANGE) (EINVAL), so save() takes
  /// the fallback path.
  bool refuse_rename_exchange = false;
  /// @brief Called in the middle of replacing an existing checkpoint of the same step: after the
  /// exchange (old one still under its temp name), or between the fallback's two renames. Throw
  /// from it to simulate a crash there.
  std::function<void()> mid_replace;
  /// @brief Called on every rank with the shard folder of a sharded save before the shards are
  /// written (a test makes one rank's write fail there).
  std::function<void(const std::string& shards_dir)> before_shards;
  /// @brief Replaces the Trainer's check that this rank sees the shard folder (a test makes one
  /// rank act as if the work_dir were its node's own).
  std::function<bool(const std::string& shards_dir)> shards_visible;
  /// @brief Called on the background writer's thread (async_checkpoint) with the directory of
  /// the checkpoint it is about to write (a test slows it down, or throws to make it fail).
  std::function<void(const std::string& dir)> in_background_write;
  /// @brief Called on the thread that copies the live parameters and optimizer state for a
  /// background checkpoint write or a snapshot, before it copies (a test slows it down: the next
  /// optimizer step must wait for it); at zero_stage > 0, on the thread that serializes a shard
  /// snapshot's copy and sends it to the buddy, before it serializes.
  std::function<void()> in_state_copy;
};

/// @brief Saves, lists, rotates and loads checkpoints under one directory.
///
/// Replacing a checkpoint of the same step (a resumed run saving it again) never leaves a moment
/// without a complete checkpoint of that step: the new directory is swapped in with
/// renameat2(RENAME_EXCHANGE). Where the file system refuses that, the old one is first renamed to
/// checkpoint-<step>.replaced, which list() accepts as that step while checkpoint-<step> is
/// missing and remove_temp_dirs() puts back or deletes.
class CheckpointManager {
 public:
  /// @brief `keep` = save_total_limit; best by `metric` (empty = no best tracking).
  CheckpointManager(std::string root, int64_t keep, std::string metric, bool greater_is_better);

  /// @brief Write `archive` as checkpoint-<step> atomically (replacing one of the same step), then
  /// rotate. Returns the directory. Throws gz::SystemError / gz::Error naming the path.
  std::string save(torch::serialize::OutputArchive& archive, int64_t step, int64_t epoch,
                   const std::map<std::string, double>& metrics);
  /// @brief save() in two halves, for checkpoints whose files others write too (the shards of a
  /// sharded checkpoint): begin() creates the temp dir (with shards/ when `sharded`); commit()
  /// writes `archive` as state.pt and the manifest, then puts the dir in place and rotates, as
  /// save() does; abort() removes the temp dir (older checkpoints stay as they were).
  PendingCheckpoint begin(int64_t step, bool sharded);
  std::string commit(const PendingCheckpoint& pending, torch::serialize::OutputArchive& archive,
                     int64_t epoch, const std::map<std::string, double>& metrics, bool sharded);
  void abort(const PendingCheckpoint& pending) const;
  /// @brief The directory the checkpoint of `step` has once written (checkpoint-<step>).
  std::string path_of(int64_t step) const;
  /// @brief The test hooks (before_shards is called by the Trainer).
  const CheckpointTestHooks& test_hooks() const { return hooks_; }
  /// @brief Complete checkpoints, oldest first, one per step (temp dirs and dirs without a valid
  /// manifest skipped with a warning).
  std::vector<CheckpointInfo> list() const;
  std::optional<CheckpointInfo> latest() const;
  /// @brief The checkpoint of `step` in this process's view of the directory, if listed.
  std::optional<CheckpointInfo> find(int64_t step) const;
  /// @brief The newest checkpoint that opens (valid manifest, state.pt of the recorded size and
  /// readable), read into `archive`. Newer damaged ones are skipped with a warning naming them and
  /// the reason. None if no checkpoint opens.
  std::optional<CheckpointInfo> open_latest(torch::serialize::InputArchive& archive) const;
  /// @brief The checkpoint with the best metric among those kept (none if no metric recorded).
  std::optional<CheckpointInfo> best() const;
  /// @brief Clean up after interrupted saves: remove temp dirs; put back a checkpoint-<step>.replaced
  /// whose checkpoint-<step> is missing, delete it otherwise. Call on one process only.
  void remove_temp_dirs() const;
  const std::string& root() const { return root_; }
  /// @brief Install fault-injection hooks (tests only).
  void set_test_hooks(CheckpointTestHooks hooks) { hooks_ = std::move(hooks); }

  /// @brief Read a checkpoint dir (or its state.pt, or a plain archive file) into `archive`.
  /// Truncated / unreadable files throw gz::Error naming the file; a sharded checkpoint's shards
  /// must be there too, of its step and the sizes their manifest records (not read here).
  static CheckpointInfo open(const std::string& path, torch::serialize::InputArchive& archive);
  /// @brief Parse manifest.json of a checkpoint dir; throws gz::Error naming it.
  static CheckpointInfo read_manifest(const std::string& dir);

 private:
  bool better(double a, double b) const { return greater_ ? a > b : a < b; }
  void rotate() const;
  void replace_dir(const std::string& tmp_dir, const std::string& final_dir);
  std::string root_;
  int64_t keep_;
  std::string metric_;
  bool greater_;
  CheckpointTestHooks hooks_;
};

/// @brief A parameter or buffer of a module under its name (named_parameters(), named_buffers()).
struct NamedTensor {
  std::string name;
  torch::Tensor tensor;
  bool buffer = false;
};
/// @brief `module`'s parameters, then its buffers, detached (not copied; on their device).
std::vector<NamedTensor> module_tensors(const torch::nn::Module& module);
/// @brief Write `tensors` as save_module_state writes a module's (on the CPU, under their names).
void save_module_state(const std::vector<NamedTensor>& tensors, torch::serialize::OutputArchive& archive);
/// @brief Write parameters and buffers of `module` under their names.
void save_module_state(const torch::nn::Module& module, torch::serialize::OutputArchive& archive);
/// @brief Copy saved parameters and buffers into `module`, checking every name and shape first
/// (nothing is changed on mismatch). `file` names the source in gz::Error messages. `elsewhere`:
/// names another file holds (a sharded checkpoint's parameters), skipped when `archive` lacks them.
void load_module_state(torch::nn::Module& module, torch::serialize::InputArchive& archive,
                       const std::string& file, const std::vector<std::string>& elsewhere = {});

}  // namespace gz::train
