// The gradient reducer behind DistributedDataParallel: buckets, autograd hooks, overlap, join.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "gz/comm/communicator.h"
#include "gz/core/timeline.h"
#include "gz/torch/comm_hooks.h"

namespace torch::autograd {
struct Node;
}

namespace gz {

/// @brief Knobs of the Reducer (see DDPOptions for their meaning).
struct ReducerOptions {
  size_t first_bucket_bytes = size_t(1) << 20;
  size_t bucket_bytes = size_t(25) << 20;
  size_t min_buckets = 8;
  bool find_unused_parameters = false;
  bool gradient_as_bucket_view = true;
  CommHook comm_hook;  ///< empty = allreduce_hook()
  RowSparseOptions row_sparse;
};

/// @brief Buckets fixed by the caller instead of planned by the Reducer (gradient sharding, ZeRO):
/// the layout, its padding and where bucket memory lives. No rebuild follows.
struct BucketPlan {
  /// @brief Parameter indices (as in Reducer::params()) of each bucket in launch order: every
  /// parameter exactly once, one dtype per bucket.
  std::vector<std::vector<size_t>> layout;
  /// @brief Each bucket's flat size is rounded up to a multiple of this; the tail stays zero (so a
  /// reduce-scatter can split the bucket into equal blocks).
  int64_t pad_multiple = 1;
  /// @brief Bucket memory exists only from a bucket's first gradient until its hook has returned:
  /// each parameter's .grad moves into it (and is gone), and no .grad is written back: the hook
  /// keeps what it needs (ZeRO stage 2: this rank's block).
  bool transient = false;
};

/// @brief Averages gradients of a set of parameters across a group during backward: when
/// loss.backward() returns, every parameter's .grad holds the average over the ranks (or what the
/// comm hook made of it). Gradients travel in buckets (gz/torch/bucket_plan.h), each reduced while
/// backward goes on, in the same order on every rank; the buckets are rebuilt once, from the
/// gradient-ready order of the first synchronised iteration. Every rank must run the same backward
/// passes with sync on and off alike.
class Reducer : public std::enable_shared_from_this<Reducer> {
 public:
  using NamedParams = std::vector<std::pair<std::string, torch::Tensor>>;

  /// @brief Build buckets and install the hooks (parameters that do not require grad are skipped).
  static std::shared_ptr<Reducer> create(NamedParams params, comm::CommPtr group, ReducerOptions options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  /// @brief Off inside no_sync(): gradients accumulate locally, no communication.
  void set_sync_enabled(bool on) { sync_enabled_ = on; }
  bool sync_enabled() const { return sync_enabled_; }
  /// @brief Replace the bucket reduction (outside backward). Throws gz::Error while another
  /// component owns the hook (own_comm_hook()).
  void set_comm_hook(CommHook hook);
  /// @brief Install `hook` for good (replacing any earlier owner's): later set_comm_hook() calls
  /// fail naming `owner` (ZeRO's reduce-scatter: any other hook would leave it nothing to step).
  void own_comm_hook(CommHook hook, std::string owner);

  /// @brief Join mode (DDP join()): every synchronised iteration starts with an exchange of who is
  /// still active; the divisor is the number of active ranks.
  void set_join_mode(bool on);
  bool join_mode() const { return join_mode_; }
  /// @brief Under join mode, at the start of an iteration: tell the others this rank is active.
  /// Returns the lowest active rank (the root for buffer broadcasts). `broadcast_buffers` says
  /// whether this iteration broadcasts buffers (joined ranks shadow that broadcast).
  int announce_active(bool broadcast_buffers);
  /// @brief For a rank out of data: shadow the active ranks' collectives with zeros until every rank
  /// has joined, then broadcast parameters and buffers from the last rank that was active.
  /// `buffers` are the module buffers broadcast by active ranks each iteration (may be empty).
  void join_and_shadow(const std::vector<torch::Tensor>& buffers);

  /// @brief Parameter indices of each bucket, in launch order.
  std::vector<std::vector<size_t>> bucket_layout() const;
  /// @brief Whether parameter i's gradient travels as rows (decided when buckets are rebuilt).
  bool row_sparse(size_t i) const { return row_sparse_.at(i) != 0; }
  /// @brief Rows all ranks exchanged for parameter i in the last step; -1 when it went dense or is
  /// not row-sparse.
  int64_t last_rows_exchanged(size_t i) const;
  /// @brief Replace the buckets by `plan` (all ranks alike, outside backward; waits for running
  /// bucket ops). Gradients bound to the old buckets move to the new ones (not in transient mode).
  void set_bucket_plan(BucketPlan plan);
  /// @brief Flat size of bucket `b` (padded).
  int64_t bucket_numel(size_t b) const { return buckets_.at(b).numel; }
  /// @brief Whether bucket `b` holds gradient memory now (always, unless BucketPlan::transient).
  bool bucket_allocated(size_t b) const { return buckets_.at(b).grad.buffer.defined(); }
  /// @brief How many times buckets were rebuilt (0 before the first synchronised iteration ends).
  int num_rebuilds() const { return num_rebuilds_; }
  const std::vector<std::string>& param_names() const { return names_; }
  const std::vector<torch::Tensor>& params() const { return params_; }
  const comm::CommPtr& group() const { return group_; }

 private:
  struct Bucket {
    std::vector<size_t> params;
    int64_t numel = 0;  // padded flat size
    GradBucket grad;
    size_t pending = 0;
    comm::WorkPtr work;
  };
  class ReadyHook;

  Reducer(NamedParams params, comm::CommPtr group, ReducerOptions options);
  void install_hooks();
  void build_buckets(const std::vector<size_t>& order);
  void on_grad_ready(size_t index);
  void begin_iteration();
  /// @brief Put parameter `index`'s gradient (zeros without one) into its bucket; `observed`: its
  /// hook fired (it counts for the ready order the buckets are rebuilt from).
  void mark_ready(size_t index, bool observed);
  void launch_ready_buckets();
  void finalize_backward();
  void settle(Bucket& b, std::exception_ptr* first_error) noexcept;
  void wait_all_buckets() noexcept;
  void rebuild_buckets(int root);
  void bind_grad(size_t index);
  void allocate_buckets(const std::vector<std::vector<size_t>>& layout);
  void mark_ready_transient(size_t index);

  comm::CommPtr group_;
  ReducerOptions options_;
  std::string hook_owner_;  // own_comm_hook(): who installed the hook for good
  std::vector<std::string> names_;
  std::vector<torch::Tensor> params_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hook_keys_;

  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;
  std::vector<uint8_t> row_sparse_;   // per parameter: its own bucket, rows on the wire
  std::vector<torch::Tensor> views_;  // per parameter: its slice of the bucket buffer, param-shaped
  std::vector<int64_t> offsets_;      // per parameter: its offset in its bucket
  int64_t pad_multiple_ = 1;          // BucketPlan
  bool transient_ = false;            // BucketPlan

  bool sync_enabled_ = true;
  bool join_mode_ = false;
  bool iter_active_ = false;
  bool announced_ = false;
  std::vector<uint8_t> ready_;
  size_t next_launch_ = 0;
  std::vector<size_t> ready_order_;
  torch::Tensor used_;  // u8 per parameter (find_unused_parameters)
  bool rebuilt_ = false;
  int num_rebuilds_ = 0;
  int active_root_ = 0;
  int last_active_root_ = -1;
  double divisor_ = 1;  // read by bucket jobs on the progress thread, written before they are issued
  Timeline* timeline_ = Timeline::process();  // GZ_TIMELINE: per-step events, else null
};

}  // namespace gz
