// ZeroRedundancyOptimizer's state, shared by its step path (zero_redundancy_optimizer.cpp) and its
// checkpoint path (zero_checkpoint.cpp).
#pragma once

#include <torch/optim/optimizer.h>

#include <atomic>
#include <memory>
#include <vector>

#include "gz/torch/ddp.h"
#include "gz/torch/reducer.h"
#include "gz/torch/zero_redundancy_optimizer.h"
#include "torch/zero/shard_layout.h"

namespace gz {

struct ZeroRedundancyOptimizer::Impl {
  comm::CommPtr group;
  int rank = 0, world = 1;
  std::shared_ptr<Reducer> reducer;
  std::shared_ptr<torch::optim::Optimizer> local;
  ZeroOptions options;

  std::vector<torch::Tensor> params;        // the Reducer's parameters (the model's, requiring grad)
  std::vector<std::vector<size_t>> groups;  // per optimizer group: its parameters, in the group's order
  std::vector<zero::ShardBucket> buckets;
  std::vector<std::vector<size_t>> bucket_of_group;  // per optimizer group: its buckets
  std::vector<torch::Tensor> flat;                   // per bucket: every parameter, back to back, padded
  std::vector<torch::Tensor> views;                  // per parameter: its view into flat (what it should be)
  std::vector<torch::Tensor> shard_params;  // per bucket: this rank's block of flat (local optimizer's)
  std::vector<torch::Tensor> shard_grads;   // per bucket: the averaged gradient of that block
  std::vector<uint8_t> fresh;               // per bucket: reduced since the last step (set by the hook)
  std::vector<comm::WorkPtr> gathers;       // per bucket: the parameter all-gather in flight
  // Set when a step launched all-gathers and nothing has waited for them yet; a bucket reduced in
  // that state means a forward ran on half-gathered parameters.
  std::atomic<bool> gathers_unwaited{false};
  int64_t steps = 0;

  // consolidate_state_dict(): per parameter, its unsharded state (root only), valid for `steps`.
  std::vector<std::unique_ptr<torch::optim::OptimizerParamState>> consolidated;
  int64_t consolidated_at = -1;
  int consolidated_root = 0;

  /// @brief Wait for the all-gathers in flight; rethrows the first failure.
  void wait_gathers();
  /// @brief Parameters someone re-pointed (torch::load's set_, set_data) go back into flat.
  void rebind_params();
  /// @brief The local optimizer's parameters become the model's (for the unsharded format) or
  /// this rank's blocks.
  void use_model_params();
  void use_shard_params();
  /// @brief From the local optimizer's per-parameter state (keyed by model parameters): the state
  /// of this rank's blocks, installed in the local optimizer (its parameters are the model's now).
  void shard_state_from_model_params();
  /// @brief Collective: consolidated[] on `root`.
  void consolidate(int root);
};

}  // namespace gz
