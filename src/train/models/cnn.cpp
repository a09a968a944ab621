#include "gz/train/models/cnn.h"

#include <torch/torch.h>

#include "gz/core/error.h"
#include "gz/torch/fully_shard.h"
#include "gz/torch/fused_pool.h"
#include "train/models/copy_state.h"

namespace gz::train {

CnnImpl::CnnImpl(const ModelOptions& options) : options_(options) {
  GZ_CHECK_ARG(options.in_channels > 0 && options.num_classes > 0, "cnn: in_channels ", options.in_channels,
               ", num_classes ", options.num_classes);
  GZ_CHECK_ARG(options.input_size >= 4, "cnn: input_size ", options.input_size, " < 4");
  const int64_t side = options.input_size / 2 / 2;  // two 2x2 max pools, floor like PyTorch
  conv1_ = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(options.in_channels, 32, 3).padding(1)));
  conv2_ = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).padding(1)));
  fc1_ = register_module("fc1", torch::nn::Linear(64 * side * side, 128));
  fc2_ = register_module("fc2", torch::nn::Linear(128, options.num_classes));
}

torch::Tensor CnnImpl::forward(torch::Tensor x) {
  // relu(max_pool(x)) == max_pool(relu(x)) (both monotone); pooling first runs ReLU on 4x fewer values.
  auto pool_relu = [this](const torch::Tensor& t) {
    return options_.fused_kernels ? max_pool2d_relu(t) : torch::relu(torch::max_pool2d(t, 2));
  };
  // Each layer may be a unit when fully sharded (zero_stage 3 picks them by size).
  x = pool_relu(run_unit(*conv1_, [&] { return conv1_->forward(x); }));
  x = pool_relu(run_unit(*conv2_, [&] { return conv2_->forward(x); }));
  x = torch::relu(run_unit(*fc1_, [&] { return fc1_->forward(x.flatten(1)); }));
  return run_unit(*fc2_, [&] { return fc2_->forward(x); });
}

std::shared_ptr<ModelImpl> CnnImpl::clone_model() const {
  auto copy = std::make_shared<CnnImpl>(options_);
  model_detail::copy_state(*this, *copy);
  return copy;
}

}  // namespace gz::train
