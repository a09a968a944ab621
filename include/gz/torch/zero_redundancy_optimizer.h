// ZeRO stages 1 and 2 on DistributedDataParallel: optimizer state (and, at stage 2, gradients)
// sharded over the ranks; parameters all-gathered after every step.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "gz/torch/comm_stats.h"
#include "gz/torch/ddp.h"
#include "gz/torch/sharded_checkpoint.h"

namespace gz {

/// @brief Options of ZeroRedundancyOptimizer.
struct ZeroOptions {
  /// @brief 1: optimizer state sharded (gradients stay whole, as with DDP). 2: gradients sharded
  /// too: a bucket's gradients exist only until it is reduce-scattered; each rank keeps the block
  /// it owns.
  int stage = 1;
  /// @brief Size of the first bucket of each (parameter group, dtype), as DDPOptions.
  size_t first_bucket_bytes = size_t(1) << 20;
  /// @brief Size of the other buckets. At stage 2 a bucket's gradients are whole from its first
  /// gradient until it is reduced: smaller buckets lower that peak.
  size_t bucket_bytes = size_t(25) << 20;
  /// @brief step() returns while the parameter all-gathers still run; DDP's next pre_forward()
  /// (or synchronize()) waits for them. Off: step() waits itself.
  bool overlap_allgather = true;
  /// @brief Counts the bytes handed to the reduce-scatters and all-gathers (optional): each op's
  /// per-rank block, as CommStats counts an all-gather.
  std::shared_ptr<CommStats> stats;
};

/// @brief ZeRO (Rajbhandari et al.) for DistributedDataParallel: each rank keeps and updates the
/// optimizer state of 1/world of the parameters; stage 2 also keeps only that part of the gradients.
///
/// Wraps an ordinary optimizer built over the model's parameters (torch::optim::SGD, Adam, AdamW,
/// Adagrad, RMSprop or gz::FusedAdamW; any parameter groups):
/// @code
///   gz::DistributedDataParallel ddp(model, group);
///   auto adamw = std::make_shared<gz::FusedAdamW>(model->parameters(), torch::optim::AdamWOptions(1e-3));
///   gz::ZeroOptions zo;
///   zo.stage = 2;
///   gz::ZeroRedundancyOptimizer opt(ddp, adamw, zo);
///   // the usual loop: opt.zero_grad(); ddp.forward(...); loss.backward(); opt.step();
/// @endcode
/// Layout: the parameters are laid out in flat buckets in DDP's gradient order (one parameter
/// group and dtype per bucket) and the model's parameters become views into them. Every bucket is
/// split into `world` equal contiguous blocks; rank r owns block r of every bucket. (Whole
/// parameters per rank would balance badly: bert-small's word embedding alone is 70% of it.)
/// In backward each bucket is reduce-scattered: rank r receives the averaged gradient of its
/// block. step() runs the wrapped optimizer on this rank's blocks only (its parameters are flat
/// views of the blocks, so the update is the same elementwise arithmetic as on whole parameters)
/// and all-gathers each bucket in place as soon as its block is updated, while later blocks step.
///
/// It is an optimizer itself: param_groups() are the model's (set lr there, as with the wrapped
/// one), zero_grad() clears the model's gradients, save()/load() use the unsharded format of the
/// wrapped optimizer, so checkpoints move between ZeRO, plain DDP and other world sizes.
///
/// Gradients of several synchronised backward passes before one step() add up, as with DDP (at
/// stage 2 in this rank's shard, which step() consumes: zero_grad() does not reach it).
///
/// Limits: after backward only this rank's block of the gradients is averaged (clip with
/// clip_grad_norm_(), not with torch::nn::utils); not under ddp.join(); DDP's comm hook is
/// replaced by the reduce-scatter, and registering another one afterwards throws gz::Error;
/// parameters of a bucket are stepped together (a parameter unused on every rank still gets a
/// zero-gradient step); the DDP object must outlive this one.
class ZeroRedundancyOptimizer : public torch::optim::Optimizer {
 public:
  /// @brief Shards `local`'s parameters (they must be exactly the parameters `ddp` averages; any
  /// state it already has is sharded too). Call on every rank alike, outside backward.
  ZeroRedundancyOptimizer(DistributedDataParallel& ddp, std::shared_ptr<torch::optim::Optimizer> local,
                          ZeroOptions options = {});
  ~ZeroRedundancyOptimizer() override;
  ZeroRedundancyOptimizer(const ZeroRedundancyOptimizer&) = delete;
  ZeroRedundancyOptimizer& operator=(const ZeroRedundancyOptimizer&) = delete;

  /// @brief Update this rank's blocks with the gradients of the last synchronised backward, then
  /// all-gather the parameters (see ZeroOptions::overlap_allgather). Buckets not reduced since
  /// the last step are left as they are. Collective.
  torch::Tensor step(LossClosure closure = nullptr) override;
  /// @brief Wait for the parameter all-gathers of the last step (every parameter is whole after).
  void synchronize();
  /// @brief Whether the last step's all-gathers have not been waited for yet (synchronize(), DDP's
  /// next pre_forward()): until then the parameters may still be changing.
  bool gathers_pending() const;
  /// @brief Scale the averaged gradients so their global L2 norm is at most max_norm (as
  /// torch::nn::utils::clip_grad_norm_ over the whole model); returns the norm before. Collective.
  double clip_grad_norm_(double max_norm);

  /// @brief Collective: gather the whole optimizer state to `root`, which save() then writes.
  void consolidate_state_dict(int root = 0);
  /// @brief Write the state as the wrapped optimizer over the whole model would (keyed by the
  /// model's parameters). On more than one rank, only on the root of the consolidate_state_dict()
  /// taken since the last step.
  void save(torch::serialize::OutputArchive& archive) const override;
  /// @brief Load an unsharded state (from save(), or from the wrapped optimizer type without ZeRO,
  /// any world size): each rank keeps its blocks. Not collective.
  void load(torch::serialize::InputArchive& archive) override;

  /// @brief Sharded checkpoint (gz/torch/sharded_checkpoint.h). Collective: each rank writes its
  /// blocks of the parameters and the state into `dir` (which must exist), rank 0 the manifest;
  /// nothing is gathered.
  void save_sharded(const std::string& dir, const ShardedCheckpointMeta& meta);
  /// @brief Collective: this rank's blocks from a sharded checkpoint of any world size and stage
  /// (1-3), then the parameters are all-gathered. A missing, corrupt or foreign manifest or shard
  /// is refused with gz::Error before anything changes.
  void load_sharded(const std::string& dir, const ShardedCheckpointMeta& expect = {});
  /// @brief Not collective: copies this rank's blocks and state now; the function returned
  /// serializes the copy (any thread, while training goes on) in the format of its shard file with
  /// its own manifest (in-memory snapshots). `params` (optional) receives the names of the
  /// parameters the shards hold.
  std::function<std::string()> snapshot_shard(const ShardedCheckpointMeta& meta,
                                              std::vector<std::string>* params = nullptr);
  /// @brief Collective: every rank's blocks from its own snapshot_shard() bytes of a job of this world
  /// size, then the parameters are all-gathered; all or nothing, like load_sharded(). `where` names
  /// the bytes in errors.
  void load_shard_bytes(const std::string& bytes, const std::string& where,
                        const ShardedCheckpointMeta& expect = {});
  /// @brief Collective: every rank's blocks resharded from the snapshot_shard() bytes of a job of
  /// another world size (`shards[q]`: old rank q's; empty where this rank's blocks do not need
  /// it), then the parameters are all-gathered; all or nothing, like load_sharded().
  void load_shard_snapshots(const std::vector<std::string>& shards, const std::string& where,
                            const ShardedCheckpointMeta& expect = {});

  /// @brief The wrapped optimizer; its parameters are this rank's blocks (flat, one per bucket).
  torch::optim::Optimizer& local_optimizer();
  /// @brief This rank's averaged gradient block of every bucket (flat).
  std::vector<torch::Tensor> local_gradients() const;
  int stage() const;
  /// @brief Per bucket: the model parameter indices (in module parameters() order, among those
  /// that require grad) and this rank's flat range [first, second) of the padded bucket.
  struct BucketInfo {
    std::vector<size_t> params;
    int64_t numel = 0, padded = 0, first = 0, last = 0;
  };
  std::vector<BucketInfo> buckets() const;

  /// @brief Internal state (src/torch/zero/zero_impl.h); the DDP hooks hold it weakly.
  struct Impl;

 private:
  void gather_loaded();  // after a load: every rank's blocks all-gathered into the parameters
  std::shared_ptr<Impl> impl_;
};

/// @brief Bytes of the distinct storages of the parameter-shaped state tensors of `optimizer`
/// (SGD, Adam, AdamW, Adagrad, RMSprop; for ZeroRedundancyOptimizer its local optimizer's): what
/// the optimizer state really holds in memory.
int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);

}  // namespace gz
