// Small convolutional classifier for 28x28 grayscale images (the Fashion-MNIST demo model).
#pragma once

#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include "gz/train/models/model.h"

namespace gz::train {

/// @brief conv(in->32, 3x3, pad 1) ReLU maxpool2, conv(32->64, 3x3, pad 1) ReLU maxpool2, flatten,
/// linear(64*(s/4)^2 -> 128) ReLU, linear(128 -> num_classes). 421,642 parameters at 1x28x28, 10 classes.
class CnnImpl : public ModelImpl {
 public:
  explicit CnnImpl(const ModelOptions& options);
  torch::Tensor forward(torch::Tensor input) override;
  std::shared_ptr<ModelImpl> clone_model() const override;

 private:
  ModelOptions options_;
  torch::nn::Conv2d conv1_{nullptr};
  torch::nn::Conv2d conv2_{nullptr};
  torch::nn::Linear fc1_{nullptr};
  torch::nn::Linear fc2_{nullptr};
};

}  // namespace gz::train
