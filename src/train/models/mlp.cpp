#include "gz/train/models/mlp.h"

#include <torch/torch.h>

#include "gz/core/error.h"
#include "gz/torch/fully_shard.h"
#include "train/models/copy_state.h"

namespace gz::train {

MlpImpl::MlpImpl(const ModelOptions& o) : options_(o) {
  GZ_CHECK_ARG(o.in_channels > 0 && o.input_size > 0 && o.num_classes > 0 && o.hidden > 0 && o.layers >= 0,
               "mlp: in_channels ", o.in_channels, ", input_size ", o.input_size, ", num_classes ",
               o.num_classes, ", hidden ", o.hidden, ", layers ", o.layers);
  in_ = register_module("in", torch::nn::Linear(o.in_channels * o.input_size * o.input_size, o.hidden));
  layers_ = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.layers; ++i) layers_->push_back(torch::nn::Linear(o.hidden, o.hidden));
  classifier_ = register_module("classifier", torch::nn::Linear(o.hidden, o.num_classes));
}

torch::Tensor MlpImpl::forward(torch::Tensor x) {
  x = torch::relu(run_unit(*in_, [&] { return in_->forward(x.flatten(1)); }));
  for (const auto& m : *layers_) {
    auto* layer = m->as<torch::nn::LinearImpl>();
    x = torch::relu(run_unit(*layer, [&] { return layer->forward(x); }));
  }
  return classifier_->forward(x);
}

std::shared_ptr<ModelImpl> MlpImpl::clone_model() const {
  auto copy = std::make_shared<MlpImpl>(options_);
  model_detail::copy_state(*this, *copy);
  return copy;
}

std::vector<std::shared_ptr<torch::nn::Module>> MlpImpl::shard_units() const {
  std::vector<std::shared_ptr<torch::nn::Module>> out{in_.ptr()};
  for (size_t i = 0; i < layers_->size(); ++i) out.push_back(layers_->ptr(i));
  return out;
}

}  // namespace gz::train
