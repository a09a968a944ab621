// FullyShardedDataParallel's state, shared by its forward path (fully_shard.cpp), its backward
// path (fsdp_backward.cpp) and the unit bookkeeping (fsdp_units.cpp).
#pragma once

#include <torch/csrc/autograd/function.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "gz/torch/fully_shard.h"
#include "torch/zero/shard_layout.h"

namespace gz {

/// @brief One unit: its parameters back to back in `full` (unsharded only while in use).
struct FsdpUnit {
  enum class State { sharded, gathering, whole };
  std::string name;
  const torch::nn::Module* module = nullptr;  // null for the root
  std::vector<torch::Tensor> params;          // the model's parameter tensors (views into full)
  std::vector<std::string> param_names;
  zero::ShardBucket layout;  // offsets of the parameters in the flat buffer, shard size
  torch::Tensor full;        // flat, padded; its storage holds no memory while sharded
  torch::Tensor shard;       // this rank's block (the optimizer's parameter)
  State state = State::sharded;
  comm::WorkPtr gather;  // all-gather into full, in flight while gathering

  // Backward of one pass.
  bool in_backward = false;   // its pre-backward ran, its gradients are not reduced yet
  size_t pending = 0;         // parameters whose gradient has not arrived yet
  // find_unused_parameters:
  size_t expected = 0;        // gradients to wait for in this pass (SIZE_MAX: until the end of backward)
  torch::Tensor output;       // its output in the forward now running
  bool tied = false;          // not reached here, reached on another rank: zeros, no backward through it
  bool encloses = false;      // holds another unit (its parameters are used before and after it)
  torch::Tensor grad_full;    // flat gradient the parameters' .grad are views of (kept by no_sync)
  torch::Tensor reduced;      // reduce-scatter output, added to shard's grad at the end of backward
  comm::WorkPtr reduce;       // that reduce-scatter
  bool entered = false;       // ran through run_unit() in some forward (decides "always whole")
  bool always_whole = false;  // never run through run_unit(): kept whole after the first forward
};

struct FullyShardedDataParallel::Impl : std::enable_shared_from_this<FullyShardedDataParallel::Impl> {
  comm::CommPtr group;
  int rank = 0, world = 1;
  FullyShardOptions options;
  std::shared_ptr<torch::nn::Module> module;
  std::vector<FsdpUnit> units;  // [0] = root
  std::unordered_map<const torch::nn::Module*, size_t> unit_of_module;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;  // kept alive: hooks live there
  std::vector<uintptr_t> hook_keys;                                  // per accumulator

  bool in_forward = false;
  int64_t forwards = 0;               // completed forward() calls
  std::vector<size_t> order;          // units in the order the last forward entered them
  std::vector<size_t> cur_order;      // ... the forward now running
  std::vector<int64_t> pos_in_order;  // per unit: its position in `order` (-1: not there)
  bool sync = true;                   // false under no_sync()
  bool callback_queued = false;       // the end-of-backward callback of this pass is queued
  int64_t whole_now = 0, whole_peak = 0;
  // unshard_optimizer(): the shards' state and parameters, until restore_optimizer().
  using StateMap = std::remove_reference_t<decltype(std::declval<torch::optim::Optimizer&>().state())>;
  std::unique_ptr<StateMap> stash;
  std::vector<torch::Tensor> stash_params;

  /// @brief The module's parameters that units hold, in module->parameters() order.
  std::vector<torch::Tensor> sharded_module_params() const;

  // fsdp_units.cpp: which parameters each unit holds; flat buffers and shards.
  void assign_units(const std::vector<std::shared_ptr<torch::nn::Module>>& unit_modules);
  void build_flat(FsdpUnit& u);

  // fully_shard.cpp: unit memory and the all-gathers.
  void allocate_full(FsdpUnit& u);
  void release_full(FsdpUnit& u);
  void start_gather(size_t u);
  void ensure_whole(size_t u);
  void prefetch(int64_t position);
  void wait_all_work() noexcept;
  torch::Tensor run_unit(size_t u, const std::function<torch::Tensor()>& fn);
  void mark_stale();
  void begin_forward();
  void end_forward(bool grad);
  void track(int64_t bytes);

  // fsdp_unused.cpp: find_unused_parameters.
  torch::Tensor tie_unused(const torch::Tensor& out);

  // fsdp_backward.cpp
  void install_hooks();
  void remove_hooks() noexcept;
  torch::Tensor attach_pre_backward(size_t u, const torch::Tensor& out);
  bool pre_backward(size_t u);  // false: no gradient flows on into the unit (tied)
  void on_grad_ready(size_t u, size_t param);
  void grads_ready(size_t u);
  void end_backward();
};

/// @brief The FullyShardedDataParallel running forward() on this thread, or null.
FullyShardedDataParallel::Impl*& active_fsdp();

/// @brief Bytes of a tensor's elements (communication and memory counters).
inline int64_t fsdp_bytes_of(const torch::Tensor& t) {
  return t.numel() * static_cast<int64_t>(t.element_size());
}

}  // namespace gz
