// ResNet-18/34/50 (He et al. 2015, torchvision layout with the stride on the 3x3 conv).
#pragma once

#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <vector>

#include "gz/train/models/model.h"

namespace gz::train {

/// @brief Residual block: two 3x3 convs (basic, expansion 1) or 1x1-3x3-1x1 (bottleneck,
/// expansion 4), BatchNorm after each conv, projection shortcut when shape changes.
class ResidualBlockImpl : public torch::nn::Module {
 public:
  ResidualBlockImpl(int64_t in_planes, int64_t planes, int64_t stride, bool bottleneck);
  torch::Tensor forward(torch::Tensor x);
  static int64_t expansion(bool bottleneck) { return bottleneck ? 4 : 1; }

 private:
  torch::nn::Sequential body_{nullptr};
  torch::nn::Sequential shortcut_{nullptr};  // empty = identity
};
TORCH_MODULE(ResidualBlock);

/// @brief ResNet classifier. The stem is conv 7x7/2 + max pool for input_size >= 64 (ImageNet),
/// and conv 3x3/1 without max pool for smaller images (CIFAR, Fashion-MNIST), so that 28-32 px
/// inputs keep enough resolution. Parameter counts at 3x224x224, 1000 classes match torchvision
/// (resnet18 11,689,512; resnet34 21,797,672; resnet50 25,557,032).
class ResNetImpl : public ModelImpl {
 public:
  /// @param depth 18, 34 or 50.
  ResNetImpl(const ModelOptions& options, int depth);
  torch::Tensor forward(torch::Tensor input) override;
  std::shared_ptr<ModelImpl> clone_model() const override;

 private:
  ModelOptions options_;
  int depth_;
  torch::nn::Sequential stem_{nullptr};
  torch::nn::Sequential stages_{nullptr};
  torch::nn::Linear fc_{nullptr};
};

}  // namespace gz::train
