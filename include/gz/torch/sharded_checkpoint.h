// Sharded checkpoints for ZeRO (stages 1-3): every rank writes its own shard in parallel, rank 0
// a manifest; loading reshards to any world size; a plain model and optimizer can load one whole
// (consolidation to the unsharded format for export). They hold the parameters the optimizer
// steps and its state, not module buffers or frozen parameters (the caller saves those).
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <string>
#include <vector>

namespace gz {

class ZeroRedundancyOptimizer;
class FullyShardedDataParallel;

/// @brief What identifies a sharded checkpoint beyond its layout.
struct ShardedCheckpointMeta {
  /// @brief Written into the manifest and every shard; loading refuses a checkpoint of another
  /// job (empty when loading: any job).
  std::string job;
  /// @brief Training step. When loading: the step expected (-1: any).
  int64_t step = -1;
};

/// @brief File names inside a sharded checkpoint directory.
constexpr const char* kShardedManifest = "manifest.json";
/// @brief "shard-<rank>-of-<world>.pt".
std::string shard_file_name(int rank, int world);

/// @brief Whether `dir` holds a sharded checkpoint's manifest (complete or not).
bool is_sharded_checkpoint(const std::string& dir);

/// @brief The step and world size a sharded checkpoint's manifest records (throws gz::Error
/// when it is missing or corrupt).
struct ShardedCheckpointInfo {
  int world = 0;
  int64_t step = 0;
  std::string job;
  /// @brief The names of the parameters the shards hold (a module's named_parameters() keys);
  /// its other parameters and its buffers are the caller's to save.
  std::vector<std::string> params;
};
ShardedCheckpointInfo read_sharded_manifest(const std::string& dir);

/// @brief A cheap completeness check without reading the shards (a checkpoint listing uses it
/// to skip a damaged one): the manifest is readable, of `expect`'s job and step (when given), and
/// every shard file is present with the size the manifest records. Throws gz::Error naming the
/// file and the reason. Loading still checks the checksums.
ShardedCheckpointInfo verify_sharded_checkpoint(const std::string& dir, const ShardedCheckpointMeta& expect);

/// @brief Collective: each rank writes its blocks of the parameters and of the optimizer state
/// into `dir` (which must exist; files written to a temp name and renamed), rank 0 the manifest
/// last. No state is gathered. Throws gz::Error on every rank when any rank failed.
void save_sharded(ZeroRedundancyOptimizer& opt, const std::string& dir, const ShardedCheckpointMeta& meta);
/// @brief Collective: this rank's blocks (state and parameters) from a checkpoint saved at any
/// world size, stage 1, 2 or 3, then the parameters are all-gathered. Refuses (gz::Error, before
/// changing anything) a missing, corrupt or foreign manifest or shard.
void load_sharded(ZeroRedundancyOptimizer& opt, const std::string& dir, const ShardedCheckpointMeta& expect);

/// @brief Stage 3: `opt` is the optimizer over fsdp.parameters(). Collective.
void save_sharded(FullyShardedDataParallel& fsdp, torch::optim::Optimizer& opt, const std::string& dir,
                  const ShardedCheckpointMeta& meta);
/// @brief Stage 3: this rank's shards and their state (the next forward gathers them).
/// Collective: every rank installs or none does.
void load_sharded(FullyShardedDataParallel& fsdp, torch::optim::Optimizer& opt, const std::string& dir,
                  const ShardedCheckpointMeta& expect);

/// @brief Consolidation (export): the whole parameters of `model` (those `opt` holds, found by
/// name) and the per-parameter state of `opt` (a plain optimizer over model's parameters) from a
/// sharded checkpoint of any world size. Save them as usual for the unsharded format.
void load_sharded_whole(torch::nn::Module& model, torch::optim::Optimizer& opt, const std::string& dir,
                        const ShardedCheckpointMeta& expect);

}  // namespace gz
