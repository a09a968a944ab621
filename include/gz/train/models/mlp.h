// Plain multilayer perceptron over flattened inputs, sized by options (memory and scaling tests).
#pragma once

#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>

#include "gz/train/models/model.h"
#include "gz/train/models/shard_units.h"

namespace gz::train {

/// @brief flatten, linear(in_channels*input_size^2 -> hidden) ReLU, `layers` x [linear(hidden ->
/// hidden) ReLU], linear(hidden -> num_classes). Its size is set by `hidden` and `layers`
/// (hidden^2 parameters per layer), so a test can make a model of any size with synthetic images.
/// Fully sharded (zero_stage 3), every layer but the classifier is a unit.
class MlpImpl : public ModelImpl, public ShardUnits {
 public:
  explicit MlpImpl(const ModelOptions& options);
  torch::Tensor forward(torch::Tensor input) override;
  std::shared_ptr<ModelImpl> clone_model() const override;
  /// @brief The input layer and the hidden layers, in forward order.
  std::vector<std::shared_ptr<torch::nn::Module>> shard_units() const override;

 private:
  ModelOptions options_;
  torch::nn::Linear in_{nullptr};
  torch::nn::ModuleList layers_{nullptr};
  torch::nn::Linear classifier_{nullptr};
};

}  // namespace gz::train
