#include "gz/train/models/mobilenet_v2.h"

#include <torch/torch.h>

#include <algorithm>

#include "gz/core/error.h"
#include "train/models/copy_state.h"

namespace gz::train {
namespace nn = torch::nn;
namespace {

// Conv + BN (+ ReLU6) appended to `seq`.
void conv_bn(nn::Sequential& seq, int64_t in, int64_t out, int64_t k, int64_t stride, int64_t groups, bool relu) {
  seq->push_back(nn::Conv2d(nn::Conv2dOptions(in, out, k).stride(stride).padding(k / 2).groups(groups).bias(false)));
  seq->push_back(nn::BatchNorm2d(out));
  if (relu) seq->push_back(nn::ReLU6(nn::ReLU6Options(true)));
}

// Round channels to a multiple of 8 without going below 90% of the requested value (the paper's rule).
int64_t make_divisible(double v, int64_t divisor = 8) {
  int64_t r = std::max<int64_t>(divisor, static_cast<int64_t>(v + divisor / 2.0) / divisor * divisor);
  if (r < 0.9 * v) r += divisor;
  return r;
}

}  // namespace

InvertedResidualImpl::InvertedResidualImpl(int64_t in, int64_t out, int64_t stride, int64_t t)
    : residual_(stride == 1 && in == out) {
  const int64_t hidden = in * t;
  body_ = nn::Sequential();
  if (t != 1) conv_bn(body_, in, hidden, 1, 1, 1, true);
  conv_bn(body_, hidden, hidden, 3, stride, hidden, true);
  conv_bn(body_, hidden, out, 1, 1, 1, false);
  register_module("body", body_);
}

torch::Tensor InvertedResidualImpl::forward(torch::Tensor x) {
  return residual_ ? x + body_->forward(x) : body_->forward(x);
}

MobileNetV2Impl::MobileNetV2Impl(const ModelOptions& o) : options_(o) {
  GZ_CHECK_ARG(o.in_channels > 0 && o.num_classes > 0 && o.input_size > 0, "mobilenet_v2: in_channels ",
               o.in_channels, ", num_classes ", o.num_classes, ", input_size ", o.input_size);
  struct Stage { int64_t t, c, n, s; };
  const Stage stages[] = {{1, 16, 1, 1}, {6, 24, 2, 2}, {6, 32, 3, 2}, {6, 64, 4, 2},
                          {6, 96, 3, 1}, {6, 160, 3, 2}, {6, 320, 1, 1}};
  const double width = 1.0;
  int64_t in = make_divisible(32 * width);
  const int64_t last = make_divisible(1280 * std::max(1.0, width));
  features_ = nn::Sequential();
  conv_bn(features_, o.in_channels, in, 3, o.input_size < 64 ? 1 : 2, 1, true);
  for (const auto& st : stages) {
    const int64_t out = make_divisible(st.c * width);
    for (int64_t i = 0; i < st.n; ++i) {
      features_->push_back(InvertedResidual(in, out, i == 0 ? st.s : 1, st.t));
      in = out;
    }
  }
  conv_bn(features_, in, last, 1, 1, 1, true);
  register_module("features", features_);
  dropout_ = register_module("dropout", nn::Dropout(0.2));
  classifier_ = register_module("classifier", nn::Linear(last, o.num_classes));
  // torchvision's init: Kaiming-normal fan_out convs, unit BN, N(0, 0.01) classifier.
  torch::NoGradGuard no_grad;
  for (auto& m : modules(/*include_self=*/false)) {
    if (auto* c = m->as<nn::Conv2dImpl>()) {
      nn::init::kaiming_normal_(c->weight, 0.0, torch::kFanOut);
    } else if (auto* b = m->as<nn::BatchNorm2dImpl>()) {
      nn::init::ones_(b->weight);
      nn::init::zeros_(b->bias);
    }
  }
  nn::init::normal_(classifier_->weight, 0.0, 0.01);
  nn::init::zeros_(classifier_->bias);
}

torch::Tensor MobileNetV2Impl::forward(torch::Tensor x) {
  x = features_->forward(x);
  x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
  return classifier_->forward(dropout_->forward(x));
}

std::shared_ptr<ModelImpl> MobileNetV2Impl::clone_model() const {
  auto copy = std::make_shared<MobileNetV2Impl>(options_);
  model_detail::copy_state(*this, *copy);
  return copy;
}

}  // namespace gz::train
