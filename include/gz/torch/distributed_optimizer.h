// Horovod-style data parallelism: wrap the optimizer; gradients are averaged by name, in an order
// all ranks agree on, as backward produces them.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gz/comm/communicator.h"
#include "gz/core/deadline.h"
#include "gz/torch/comm_hooks.h"
#include "gz/torch/comm_stats.h"
#include "gz/torch/compression.h"
#include "gz/torch/row_sparse.h"

namespace gz {

using NamedParameters = std::vector<std::pair<std::string, torch::Tensor>>;

/// @brief Knobs of DistributedOptimizer.
struct DistributedOptimizerOptions {
  /// @brief Wire format of gradients (Horovod's Compression): none, fp16, bf16 cast them;
  /// powersgd, int8, topk reduce them with the compressing hooks of gz/torch/compression.h (state
  /// per parameter, so it survives changing fusion groups).
  Compression compression = Compression::none;
  /// @brief Knobs of powersgd, int8 and topk (its `method` is ignored: `compression` decides).
  CompressionOptions compression_options;
  /// @brief Any reduction with DDP's comm-hook contract, instead of `compression`: called per
  /// fused group (GradBucket: index counts the groups of a step from 0, param_ids are the
  /// parameters' positions in name order).
  CommHook comm_hook;
  /// @brief Counts the bytes handed to collectives for gradients (optional).
  std::shared_ptr<CommStats> stats;
  /// @brief Gradients are averaged on every N-th backward pass (local accumulation in between).
  int backward_passes_per_step = 1;
  /// @brief Ready gradients are packed together up to this many bytes per collective.
  size_t fusion_bytes = size_t(64) << 20;
  /// @brief Warn (naming tensors and missing ranks) when a tensor submitted by some ranks is still
  /// missing on others after this long; fail with gz::TimeoutError after stall_error (0 = the
  /// group's timeout).
  Duration stall_warning = std::chrono::seconds(60);
  Duration stall_error = Duration(0);
  /// @brief Minimum time between negotiation cycles (Horovod's HOROVOD_CYCLE_TIME): gradients that
  /// become ready within one cycle are fused into one collective.
  std::chrono::microseconds cycle_time{1000};
  /// @brief After a negotiated step, later steps replay its groups in the same order, each
  /// confirmed once all ranks hold it (Horovod's response cache), instead of negotiating every
  /// cycle; a step in which some rank lacks a group negotiates its rest.
  bool replay_schedule = true;
  /// @brief Replayed groups are merged into buckets by DDP's rule (gz/torch/bucket_plan.h): the
  /// first up to min(this, 1 MiB), later ones up to this many bytes.
  size_t replay_bucket_bytes = size_t(25) << 20;
  /// @brief The replay cap shrinks (not below the first bucket) until the gradients fill at least
  /// this many buckets, as DDPOptions::min_buckets.
  size_t replay_min_buckets = 8;
  /// @brief Gradients whose rows are mostly zero (embedding tables) travel as their non-zero rows
  /// from the second step on (decided by rank 0 after the first); the wrapped optimizer still sees
  /// dense averaged gradients. As DDPOptions::row_sparse.
  RowSparseOptions row_sparse;
};

/// @brief Averages gradients across a group as backward produces them, then steps the optimizer.
///
/// `optimizer` may be null: gradient averaging only (synchronize()); the Python binding steps a
/// Python optimizer itself. step() and zero_grad() then throw.
///
/// Every rank must pass the same parameter names. Each gradient is submitted by name when ready;
/// the ranks agree on which named gradients all of them hold and average those, so ranks that
/// produce gradients in different orders neither deadlock nor mix tensors. A gradient some ranks
/// never submit fails the step on every rank (gz::TimeoutError) naming it and the ranks that lack
/// it. How (negotiation, schedule replay, stall inspection, fusion): src/torch/horovod/.
class DistributedOptimizer {
 public:
  DistributedOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer, NamedParameters named_parameters,
                       Compression compression = Compression::none, int backward_passes_per_step = 1,
                       comm::CommPtr group = nullptr);
  DistributedOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer, NamedParameters named_parameters,
                       const DistributedOptimizerOptions& options, comm::CommPtr group = nullptr);
  /// @brief Waits for (or aborts, past its deadline) a step still being reduced.
  ~DistributedOptimizer();
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  /// @brief Wait until every gradient of this step is averaged (rethrows failures and stalls).
  void synchronize();
  /// @brief This rank has no batch for this step (Horovod's join): every gradient becomes zero and
  /// is submitted now, as if backward_passes_per_step backward passes had produced it. Then call
  /// synchronize() as usual.
  void submit_zeros();
  /// @brief synchronize(), then the wrapped optimizer's step().
  void step();
  /// @brief Change how many backward passes make a step (between steps only), e.g. when a resumed
  /// run keeps its global batch on fewer ranks. Throws gz::InvalidArgument when n < 1.
  void set_backward_passes_per_step(int n);
  void zero_grad();
  torch::optim::Optimizer& optimizer();
  const comm::CommPtr& group() const;
  /// @brief Exchanges (negotiations and confirmations) in the last synchronised step.
  int last_cycles() const;
  /// @brief Whether the last synchronised step ran entirely from the replayed schedule.
  bool last_step_replayed() const;
  /// @brief Whether tensor `name`'s gradient travels as rows (false before the first step ends).
  bool row_sparse(const std::string& name) const;
  /// @brief Rows all ranks exchanged for `name` in the last step; -1 when dense or not row-sparse.
  int64_t last_rows_exchanged(const std::string& name) const;

  /// @brief Internal state (src/torch/distributed_optimizer.cpp).
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// @brief Broadcast parameters (in place) from root; every rank passes the same names in the same order.
void broadcast_parameters(const NamedParameters& params, int root = 0, const comm::CommPtr& group = nullptr);
/// @brief Broadcast a module's parameters and buffers from root.
void broadcast_parameters(torch::nn::Module& module, int root = 0, const comm::CommPtr& group = nullptr);
/// @brief Make every rank's optimizer state (moments, step counts, hyper-parameters) equal to root's.
void broadcast_optimizer_state(torch::optim::Optimizer& optimizer, int root = 0,
                               const comm::CommPtr& group = nullptr);

}  // namespace gz
