// MobileNetV2 (Sandler et al. 2018), width multiplier 1.0.
#pragma once

#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>

#include "gz/train/models/model.h"

namespace gz::train {

/// @brief Inverted residual: 1x1 expansion (skipped when t = 1), 3x3 depthwise, 1x1 linear
/// projection, BatchNorm after each and ReLU6 after the first two; residual when the shape is kept.
class InvertedResidualImpl : public torch::nn::Module {
 public:
  InvertedResidualImpl(int64_t in, int64_t out, int64_t stride, int64_t expand_ratio);
  torch::Tensor forward(torch::Tensor x);

 private:
  bool residual_;
  torch::nn::Sequential body_{nullptr};
};
TORCH_MODULE(InvertedResidual);

/// @brief MobileNetV2 classifier: 3,504,872 parameters at 3x224x224 and 1000 classes (as
/// torchvision). For input_size < 64 the stem conv has stride 1 instead of 2 (small images).
/// Classifier dropout is 0.2 as in the paper (ModelOptions::dropout is the BERT default).
class MobileNetV2Impl : public ModelImpl {
 public:
  explicit MobileNetV2Impl(const ModelOptions& options);
  torch::Tensor forward(torch::Tensor input) override;
  std::shared_ptr<ModelImpl> clone_model() const override;

 private:
  ModelOptions options_;
  torch::nn::Sequential features_{nullptr};
  torch::nn::Dropout dropout_{nullptr};
  torch::nn::Linear classifier_{nullptr};
};

}  // namespace gz::train
