#include "gz/train/models/resnet.h"

#include <torch/torch.h>

#include "gz/core/error.h"
#include "train/models/copy_state.h"

namespace gz::train {
namespace nn = torch::nn;
namespace {

nn::Conv2d conv(int64_t in, int64_t out, int64_t k, int64_t stride) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, k).stride(stride).padding(k / 2).bias(false));
}

// Kaiming-normal (fan_out, ReLU) for convs, BN weight 1 / bias 0: torchvision's ResNet init.
void init_weights(nn::Module& root) {
  torch::NoGradGuard no_grad;
  for (auto& m : root.modules(/*include_self=*/false)) {  // true needs a shared_ptr owner
    if (auto* c = m->as<nn::Conv2dImpl>()) {
      nn::init::kaiming_normal_(c->weight, 0.0, torch::kFanOut, torch::kReLU);
    } else if (auto* b = m->as<nn::BatchNorm2dImpl>()) {
      nn::init::ones_(b->weight);
      nn::init::zeros_(b->bias);
    }
  }
}

}  // namespace

ResidualBlockImpl::ResidualBlockImpl(int64_t in_planes, int64_t planes, int64_t stride, bool bottleneck) {
  const int64_t out = planes * expansion(bottleneck);
  body_ = nn::Sequential();
  if (bottleneck) {
    body_->push_back(conv(in_planes, planes, 1, 1));
    body_->push_back(nn::BatchNorm2d(planes));
    body_->push_back(nn::ReLU(nn::ReLUOptions(true)));
    body_->push_back(conv(planes, planes, 3, stride));
    body_->push_back(nn::BatchNorm2d(planes));
    body_->push_back(nn::ReLU(nn::ReLUOptions(true)));
    body_->push_back(conv(planes, out, 1, 1));
    body_->push_back(nn::BatchNorm2d(out));
  } else {
    body_->push_back(conv(in_planes, planes, 3, stride));
    body_->push_back(nn::BatchNorm2d(planes));
    body_->push_back(nn::ReLU(nn::ReLUOptions(true)));
    body_->push_back(conv(planes, out, 3, 1));
    body_->push_back(nn::BatchNorm2d(out));
  }
  register_module("body", body_);
  shortcut_ = nn::Sequential();
  if (stride != 1 || in_planes != out) {
    shortcut_->push_back(conv(in_planes, out, 1, stride));
    shortcut_->push_back(nn::BatchNorm2d(out));
  }
  register_module("shortcut", shortcut_);
}

torch::Tensor ResidualBlockImpl::forward(torch::Tensor x) {
  auto identity = shortcut_->is_empty() ? x : shortcut_->forward(x);
  return torch::relu(body_->forward(x) + identity);
}

ResNetImpl::ResNetImpl(const ModelOptions& o, int depth) : options_(o), depth_(depth) {
  std::vector<int64_t> blocks;
  bool bottleneck = false;
  switch (depth) {
    case 18: blocks = {2, 2, 2, 2}; break;
    case 34: blocks = {3, 4, 6, 3}; break;
    case 50: blocks = {3, 4, 6, 3}; bottleneck = true; break;
    default: GZ_THROW(InvalidArgument, "resnet: depth ", depth, " not one of 18, 34, 50");
  }
  GZ_CHECK_ARG(o.in_channels > 0 && o.num_classes > 0 && o.input_size > 0, "resnet", depth, ": in_channels ",
               o.in_channels, ", num_classes ", o.num_classes, ", input_size ", o.input_size);
  stem_ = nn::Sequential();
  if (o.input_size >= 64) {
    stem_->push_back(conv(o.in_channels, 64, 7, 2));
    stem_->push_back(nn::BatchNorm2d(64));
    stem_->push_back(nn::ReLU(nn::ReLUOptions(true)));
    stem_->push_back(nn::MaxPool2d(nn::MaxPool2dOptions(3).stride(2).padding(1)));
  } else {
    stem_->push_back(conv(o.in_channels, 64, 3, 1));
    stem_->push_back(nn::BatchNorm2d(64));
    stem_->push_back(nn::ReLU(nn::ReLUOptions(true)));
  }
  register_module("stem", stem_);
  stages_ = nn::Sequential();
  int64_t in_planes = 64;
  for (size_t s = 0; s < blocks.size(); ++s) {
    const int64_t planes = int64_t{64} << s;
    for (int64_t b = 0; b < blocks[s]; ++b) {
      const int64_t stride = (s > 0 && b == 0) ? 2 : 1;
      stages_->push_back(ResidualBlock(in_planes, planes, stride, bottleneck));
      in_planes = planes * ResidualBlockImpl::expansion(bottleneck);
    }
  }
  register_module("stages", stages_);
  fc_ = register_module("fc", nn::Linear(in_planes, o.num_classes));
  init_weights(*this);
}

torch::Tensor ResNetImpl::forward(torch::Tensor x) {
  x = stages_->forward(stem_->forward(x));
  x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
  return fc_->forward(x);
}

std::shared_ptr<ModelImpl> ResNetImpl::clone_model() const {
  auto copy = std::make_shared<ResNetImpl>(options_, depth_);
  model_detail::copy_state(*this, *copy);
  return copy;
}

}  // namespace gz::train
