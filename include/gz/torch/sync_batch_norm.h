// BatchNorm whose training statistics cover the whole group's batch.
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include "gz/comm/communicator.h"

namespace gz {

/// @brief Options of SyncBatchNorm (BatchNorm2d's, minus the group).
struct SyncBatchNormOptions {
  explicit SyncBatchNormOptions(int64_t num_features) : num_features(num_features) {}
  int64_t num_features;
  double eps = 1e-5;
  double momentum = 0.1;
  bool affine = true;
  bool track_running_stats = true;
};

/// @brief Drop-in for BatchNorm1d/2d/3d: in training mode the per-channel mean, variance and count
/// are all-reduced over the group, and backward all-reduces the gradient sums, so N ranks with batch
/// b behave like one BatchNorm over N x b samples. Eval mode uses the running statistics.
/// Parameters and buffers have BatchNorm2d's names (weight, bias, running_mean, running_var,
/// num_batches_tracked), so state dicts carry over.
class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  SyncBatchNormImpl(const SyncBatchNormOptions& options, comm::CommPtr group = nullptr);
  SyncBatchNormImpl(int64_t num_features, comm::CommPtr group = nullptr)
      : SyncBatchNormImpl(SyncBatchNormOptions(num_features), std::move(group)) {}
  void reset() override;
  /// @brief input: [N, C, ...].
  torch::Tensor forward(const torch::Tensor& input);

  /// @brief A SyncBatchNorm with bn's options, parameters and running statistics.
  static std::shared_ptr<SyncBatchNormImpl> from_batch_norm(const torch::nn::BatchNorm2dImpl& bn,
                                                            comm::CommPtr group = nullptr);

  SyncBatchNormOptions options;
  comm::CommPtr group;
  torch::Tensor weight, bias, running_mean, running_var, num_batches_tracked;
};
TORCH_MODULE(SyncBatchNorm);

/// @brief Copy of `seq` with every BatchNorm2d replaced by a SyncBatchNorm carrying its state (the
/// other modules are shared, not copied). LibTorch modules reach their children through typed
/// members, so only containers can be converted generically; use SyncBatchNormImpl::from_batch_norm
/// for typed members.
torch::nn::Sequential convert_sync_batchnorm(const torch::nn::Sequential& seq, comm::CommPtr group = nullptr);

}  // namespace gz
