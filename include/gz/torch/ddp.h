// DistributedDataParallel for LibTorch C++ modules.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <utility>

#include "gz/comm/communicator.h"
#include "gz/torch/comm_hooks.h"
#include "gz/torch/reducer.h"

namespace gz {

/// @brief Options of DistributedDataParallel.
struct DDPOptions {
  /// @brief Size of the first bucket (small so communication starts early in backward).
  size_t first_bucket_bytes = size_t(1) << 20;
  /// @brief Cap of the other buckets.
  size_t bucket_bytes = size_t(25) << 20;
  /// @brief The cap shrinks (not below first_bucket_bytes) until the gradients fill at least this
  /// many buckets, so the last bucket's all-reduce, which cannot overlap backward, stays small for
  /// small models too (gz::bucket_cap). 1 = bucket_bytes as it is.
  size_t min_buckets = 8;
  /// @brief Parameters without a gradient at the end of backward count as zero gradients instead
  /// of raising an error that names them.
  bool find_unused_parameters = false;
  /// @brief pre_forward() / forward() broadcast the module's buffers from rank 0 (the lowest active
  /// rank under join()).
  bool broadcast_buffers = true;
  /// @brief Parameters' .grad become views into the bucket buffers (saves one copy per step).
  bool gradient_as_bucket_view = true;
  /// @brief Rank whose parameters and buffers everyone starts from.
  int root_rank = 0;
  /// @brief Bucket reduction (empty = all-reduce); see fp16_compress_hook, bf16_compress_hook.
  CommHook comm_hook;
  /// @brief Gradients whose rows are mostly zero (embedding tables, dense or sparse(true)) travel
  /// as their non-zero rows, each in a bucket of its own, from the second iteration on; the
  /// optimizer still sees the dense averaged gradient. On by default (row_sparse.enabled).
  RowSparseOptions row_sparse;
};

/// @brief Data-parallel training over a group: each rank runs the same module on its own shard of
/// the batch; gradients are averaged across ranks during backward.
///
/// LibTorch modules have no virtual forward, so users call their module themselves:
/// @code
///   gz::DistributedDataParallel ddp(model.ptr(), group);
///   auto out = ddp.forward([&] { return model->forward(x); });  // or ddp.pre_forward(); model->forward(x)
///   loss_fn(out, y).backward();  // gradients are averaged across ranks when backward returns
///   optimizer.step();
/// @endcode
/// The averaging finishes inside backward (a callback queued on the autograd engine), so no
/// explicit synchronize() is needed before optimizer.step().
class DistributedDataParallel {
 public:
  /// @brief Broadcasts parameters and buffers from options.root_rank (collective).
  explicit DistributedDataParallel(std::shared_ptr<torch::nn::Module> module, comm::CommPtr group = nullptr,
                                   DDPOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  const std::shared_ptr<torch::nn::Module>& module() const { return module_; }
  const comm::CommPtr& group() const { return group_; }

  /// @brief Call before each forward: broadcasts buffers (broadcast_buffers) and, under join(),
  /// tells the other ranks this rank is still active.
  void pre_forward();
  /// @brief pre_forward(), then fn().
  template <typename Fn>
  auto forward(Fn&& fn) -> decltype(fn()) {
    pre_forward();
    return std::forward<Fn>(fn)();
  }

  /// @brief RAII scope: backward passes inside accumulate gradients locally without communication;
  /// the first backward after the scope averages the accumulated gradients.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(Reducer& r) : r_(r), prev_(r.sync_enabled()) { r_.set_sync_enabled(false); }
    ~NoSyncGuard() { r_.set_sync_enabled(prev_); }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    Reducer& r_;
    bool prev_;
  };
  NoSyncGuard no_sync() { return NoSyncGuard(*reducer_); }

  /// @brief RAII scope for uneven inputs (every rank enters it). When a rank runs out of data and
  /// leaves the scope, it shadows the others' collectives with zeros until all ranks left; the
  /// average counts active ranks only. Then every rank gets the parameters of the last active one.
  class JoinGuard {
   public:
    explicit JoinGuard(DistributedDataParallel& ddp);
    /// @brief Leave the scope now (may throw); the destructor does it otherwise.
    void finish();
    ~JoinGuard();
    JoinGuard(const JoinGuard&) = delete;
    JoinGuard& operator=(const JoinGuard&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool done_ = false;
  };
  JoinGuard join() { return JoinGuard(*this); }

  /// @brief Run `hook` first thing in every pre_forward()/forward(), also under no_sync() (empty =
  /// none). ZeroRedundancyOptimizer waits there for the parameters its last step all-gathers.
  void set_pre_forward_hook(std::function<void()> hook) { pre_forward_hook_ = std::move(hook); }

  /// @brief Replace the bucket reduction (all ranks alike, outside backward).
  void register_comm_hook(CommHook hook) { reducer_->set_comm_hook(std::move(hook)); }
  Reducer& reducer() { return *reducer_; }

 private:
  void broadcast_buffers(int root);

  std::shared_ptr<torch::nn::Module> module_;
  comm::CommPtr group_;
  DDPOptions options_;
  std::shared_ptr<Reducer> reducer_;
  std::vector<torch::Tensor> buffers_;
  std::function<void()> pre_forward_hook_;
};

}  // namespace gz
