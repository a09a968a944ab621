// Horovod-style data parallelism: wrap the optimizer; gradients are averaged by name, in the order
// all ranks agree on, fused into one buffer per cycle.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "gz/comm/communicator.h"
#include "gz/core/deadline.h"
#include "gz/core/timeline.h"
#include "gz/torch/row_sparse.h"
#include "gz/torch/comm_hooks.h"
#include "gz/torch/comm_stats.h"
#include "gz/torch/compression.h"

namespace torch::autograd {
struct Node;
}

namespace gz {

using NamedParameters = std::vector<std::pair<std::string, torch::Tensor>>;

/// @brief Knobs of DistributedOptimizer.
struct DistributedOptimizerOptions {
  /// @brief Wire format of gradients (Horovod's Compression): none, fp16, bf16 cast the fused
  /// buffer; powersgd, int8, topk reduce it with the compressing hooks of gz/torch/compression.h
  /// (state per parameter name, so it survives changing fusion groups).
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
  /// @brief Fusion buffer size: ready tensors are packed together up to this many bytes per all-reduce.
  size_t fusion_bytes = size_t(64) << 20;
  /// @brief Warn (naming tensors and missing ranks) when a tensor submitted by some ranks is still
  /// missing on others after this long; fail with gz::TimeoutError after stall_error (0 = the
  /// group's timeout).
  Duration stall_warning = std::chrono::seconds(60);
  Duration stall_error = Duration(0);
  /// @brief Minimum time between negotiation cycles (Horovod's HOROVOD_CYCLE_TIME): gradients that
  /// become ready within one cycle are fused into one all-reduce. The last cycle of a step starts
  /// as soon as every local gradient is ready.
  std::chrono::microseconds cycle_time{1000};
  /// @brief Replay the last step's schedule (Horovod's response cache, taken further): once a step
  /// has been negotiated, the next one all-reduces the same groups in the same order, each as soon
  /// as this rank holds all of its gradients, with one allgather per group to confirm every rank
  /// holds it, instead of a negotiation every cycle_time. A group some rank lacks (a gradient
  /// skipped, a new order) switches the rest of the step back to negotiation cycles.
  bool replay_schedule = true;
  /// @brief Replayed groups are merged, in order, into buckets of up to this many bytes (the first
  /// up to 1 MiB, so communication starts early in backward), as DDP's bucket_cap.
  size_t replay_bucket_bytes = size_t(25) << 20;
  /// @brief The replay cap shrinks (not below 1 MiB) until the gradients fill at least this many
  /// buckets, as DDPOptions::min_buckets.
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
/// Each parameter's gradient is submitted by name when ready (autograd hook). Negotiation cycles
/// run on the group's progress thread: every rank publishes which tensors it has ready (allgather
/// of a bitmap over name-sorted tensors), tensors ready everywhere are packed into the fusion buffer
/// in name order and all-reduced. Ranks producing gradients in different orders therefore neither
/// deadlock nor mix tensors. A tensor missing on some ranks is reported with those ranks' numbers.
class DistributedOptimizer {
 public:
  DistributedOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer, NamedParameters named_parameters,
                       Compression compression = Compression::none, int backward_passes_per_step = 1,
                       comm::CommPtr group = nullptr);
  DistributedOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer, NamedParameters named_parameters,
                       const DistributedOptimizerOptions& options, comm::CommPtr group = nullptr);
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
  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  const comm::CommPtr& group() const { return group_; }
  /// @brief Negotiation cycles run in the last synchronised step (for tests and tuning).
  int last_cycles() const { return last_cycles_; }
  /// @brief Whether the last synchronised step ran entirely from the replayed schedule.
  bool last_step_replayed() const { return last_replayed_; }
  /// @brief Whether tensor `name`'s gradient travels as rows (false before the first step ends).
  bool row_sparse(const std::string& name) const;
  /// @brief Rows all ranks exchanged for `name` in the last step; -1 when dense or not row-sparse.
  int64_t last_rows_exchanged(const std::string& name) const;

 private:
  class Hook;
  void on_ready(size_t index);
  void bind_arena();
  void run_cycles();
  void reduce_fused(const std::vector<size_t>& idx);
  void run_hook(const torch::Tensor& flat, std::vector<torch::Tensor> gradients, std::vector<size_t> ids);
  void record_schedule(const std::vector<std::vector<size_t>>& executed);
  void decide_row_sparse();

  std::shared_ptr<torch::optim::Optimizer> optimizer_;
  comm::CommPtr group_;
  DistributedOptimizerOptions options_;
  std::vector<std::string> names_;     // sorted: the agreed order
  std::vector<torch::Tensor> params_;  // same order
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hook_keys_;
  std::shared_ptr<std::atomic<DistributedOptimizer*>> alive_;
  torch::Tensor fusion_;
  torch::Tensor arena_;               // CPU gradients, one slot each in name order (alloc_buffer)
  std::vector<torch::Tensor> views_;  // per parameter: its arena slot, param-shaped (undefined: not CPU)

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> passes_;          // backward passes seen per tensor this step
  std::vector<uint8_t> submitted_;   // guarded by mu_
  size_t num_submitted_ = 0;         // guarded by mu_
  bool closing_ = false;             // guarded by mu_: synchronize() was called, backward is over
  // The schedule replayed this step: groups of tensor indices (a partition, identical on every rank
  // because it is built from agreed groups), each tensor's group, and per group how many of its
  // tensors this rank has not submitted yet. Written only between steps; guarded by mu_.
  std::vector<std::vector<size_t>> plan_;
  std::vector<size_t> plan_group_of_;
  std::vector<size_t> plan_left_;
  comm::WorkPtr loop_;
  CommHook hook_;           // empty: all-reduce (cast per `compression`)
  size_t hook_bucket_ = 0;  // groups handed to hook_ this step (progress thread only)
  int last_cycles_ = 0;
  bool last_replayed_ = false;
  bool row_sparse_decided_ = false;
  std::vector<uint8_t> row_sparse_;           // per tensor (name order): rows on the wire
  std::vector<RowSparseState> row_state_;     // used on the progress thread only
  Timeline* timeline_ = Timeline::process();  // GZ_TIMELINE: per-step events, else null
};

/// @brief Broadcast parameters (in place) from root; every rank passes the same names in the same order.
void broadcast_parameters(const NamedParameters& params, int root = 0, const comm::CommPtr& group = nullptr);
/// @brief Broadcast a module's parameters and buffers from root.
void broadcast_parameters(torch::nn::Module& module, int root = 0, const comm::CommPtr& group = nullptr);
/// @brief Make every rank's optimizer state (moments, step counts, hyper-parameters) equal to root's.
void broadcast_optimizer_state(torch::optim::Optimizer& optimizer, int root = 0,
                               const comm::CommPtr& group = nullptr);

}  // namespace gz
