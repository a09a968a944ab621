// The sharded checkpoint format shared by ZeRO stages 1-2, stage 3 and plain (whole) models: a
// directory with one file per rank (its block of every flat group: parameters and optimizer
// state) and a manifest.json that rank 0 writes last (the commit mark). Loading reshards: each
// rank reads, per parameter, the slices it needs from whichever shard files hold them.
#pragma once

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gz/comm/communicator.h"
#include "gz/torch/sharded_checkpoint.h"
#include "torch/zero/shard_layout.h"

namespace gz::zero {

/// @brief The manifest's "format" and the shard files' version (written and checked by
/// sharded_format.cpp and sharded_load.cpp; one definition: both may share a unity translation unit).
inline constexpr const char* kShardedFormat = "gz-sharded-1";
inline constexpr int64_t kShardedVersion = 1;

/// @brief One flat group (a ZeRO bucket, a stage-3 unit, or one whole parameter) as this rank
/// holds it.
struct FlatGroup {
  std::string name;
  std::vector<std::string> params;           ///< parameter names, in flat order
  std::vector<std::vector<int64_t>> shapes;  ///< per parameter
  ShardBucket layout;                        ///< offsets, numels, shard (elements per rank)
  torch::Tensor block;                       ///< this rank's block (layout.shard elements)
  torch::Tensor key;                         ///< the optimizer state's key for this block
  size_t opt_group = 0;                      ///< parameter group (options) of the block
};

/// @brief What one rank saves or loads.
struct ShardSet {
  int rank = 0, world = 1;
  std::vector<FlatGroup> groups;
  torch::optim::Optimizer* state_opt = nullptr;    ///< holds the state, keyed by FlatGroup::key
  torch::optim::Optimizer* options_opt = nullptr;  ///< whose param_groups carry the options
};

/// @brief Collective over `group` (null: one rank): every rank writes its file, rank 0 the
/// manifest; throws gz::Error on every rank when any rank failed.
void save_shards(const ShardSet& set, comm::Communicator* group, const std::string& dir,
                 const ShardedCheckpointMeta& meta);

/// @brief Not collective: this rank's shard for an in-memory snapshot, copied now (its blocks and
/// state tensors); the function returned serializes the copy, on any thread, while training goes
/// on: the archive its shard file would hold (the options included, whatever the rank) and, under
/// "gz_manifest", the manifest as this rank sees it (the other shards' sizes unknown: restored by
/// load_shard_bytes_collective() on this rank of a job of the same world size only).
std::function<std::string()> shard_snapshot(const ShardSet& set, const ShardedCheckpointMeta& meta);

/// @brief load_shards_collective() from every rank's own shard_bytes() (same world and layout).
/// `where` names the bytes in errors.
void load_shard_bytes_collective(ShardSet& set, comm::Communicator* group, const std::string& bytes,
                                 const std::string& where, const ShardedCheckpointMeta& expect,
                                 const std::string& who);

/// @brief load_shards_collective() from the shard snapshots of a world of any size (resharding):
/// `shards[q]` is old rank q's shard_snapshot() bytes (empty: not given to this rank; an error if
/// this rank's blocks need it). The manifest and the options are the first given shard's; each
/// shard is parsed only when this rank's blocks overlap it.
void load_shard_snapshots_collective(ShardSet& set, comm::Communicator* group,
                                     const std::vector<std::string>& shards, const std::string& where,
                                     const ShardedCheckpointMeta& expect, const std::string& who);

/// @brief Not collective: this rank's blocks and their state from a checkpoint of any world size;
/// nothing changes when it throws. `before_install` (optional) runs once everything is read, before
/// anything changes: a collective caller agrees with its peers there.
void load_shards(ShardSet& set, const std::string& dir, const ShardedCheckpointMeta& expect,
                 const std::function<void()>& before_install = nullptr);

/// @brief load_shards() on every rank of `group` (null: this rank alone), all or nothing: once
/// every rank has read what it needs they agree; if any rank failed none installs anything, the
/// failed ranks throw their own error and the others one naming the lowest failed rank. `who`
/// starts the message ("ZeroRedundancyOptimizer::load_sharded").
void load_shards_collective(ShardSet& set, comm::Communicator* group, const std::string& dir,
                            const ShardedCheckpointMeta& expect, const std::string& who);

}  // namespace gz::zero
