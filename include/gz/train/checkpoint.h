// Checkpoint directories: work_dir/checkpoints/checkpoint-<step>/{state.pt, manifest.json}, written
// atomically (temp dir, fsync, rename), rotated to a limit, never deleting the best one.
#pragma once

#include <torch/nn/module.h>
#include <torch/serialize/archive.h>

#include <cstdint>
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
  std::string state_file() const { return dir + "/state.pt"; }
};

/// @brief Saves, lists, rotates and loads checkpoints under one directory.
class CheckpointManager {
 public:
  /// @brief `keep` = save_total_limit; best by `metric` (empty = no best tracking).
  CheckpointManager(std::string root, int64_t keep, std::string metric, bool greater_is_better);

  /// @brief Write `archive` as checkpoint-<step> atomically (replacing one of the same step), then
  /// rotate. Returns the directory. Throws gz::SystemError / gz::Error naming the path.
  std::string save(torch::serialize::OutputArchive& archive, int64_t step, int64_t epoch,
                   const std::map<std::string, double>& metrics);
  /// @brief Complete checkpoints, oldest first (temp dirs and dirs without a valid manifest skipped).
  std::vector<CheckpointInfo> list() const;
  std::optional<CheckpointInfo> latest() const;
  /// @brief The checkpoint with the best metric among those kept (none if no metric recorded).
  std::optional<CheckpointInfo> best() const;
  /// @brief Remove leftovers of interrupted saves (temp dirs).
  void remove_temp_dirs() const;
  const std::string& root() const { return root_; }

  /// @brief Read a checkpoint dir (or its state.pt, or a plain archive file) into `archive`.
  /// Truncated / unreadable files throw gz::Error naming the file.
  static CheckpointInfo open(const std::string& path, torch::serialize::InputArchive& archive);
  /// @brief Parse manifest.json of a checkpoint dir; throws gz::Error naming it.
  static CheckpointInfo read_manifest(const std::string& dir);

 private:
  bool better(double a, double b) const { return greater_ ? a > b : a < b; }
  void rotate() const;
  std::string root_;
  int64_t keep_;
  std::string metric_;
  bool greater_;
};

/// @brief Write parameters and buffers of `module` under their names.
void save_module_state(const torch::nn::Module& module, torch::serialize::OutputArchive& archive);
/// @brief Copy saved parameters and buffers into `module`, checking every name and shape first
/// (nothing is changed on mismatch). `file` names the source in gz::Error messages.
void load_module_state(torch::nn::Module& module, torch::serialize::InputArchive& archive, const std::string& file);

}  // namespace gz::train
