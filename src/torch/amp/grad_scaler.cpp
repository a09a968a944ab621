#include "gz/torch/grad_scaler.h"

#include <torch/torch.h>

#include "gz/core/error.h"

namespace gz {

GradScaler::GradScaler(GradScalerOptions options) : options_(options), scale_(options.init_scale) {
  GZ_CHECK_ARG(options_.init_scale > 0, "GradScaler init_scale ", options_.init_scale);
  GZ_CHECK_ARG(options_.growth_factor > 1, "GradScaler growth_factor ", options_.growth_factor);
  GZ_CHECK_ARG(options_.backoff_factor > 0 && options_.backoff_factor < 1, "GradScaler backoff_factor ",
               options_.backoff_factor);
  GZ_CHECK_ARG(options_.growth_interval >= 1, "GradScaler growth_interval ", options_.growth_interval);
}

torch::Tensor GradScaler::scale(const torch::Tensor& loss) const {
  if (!options_.enabled) return loss;
  return loss * scale_;
}

bool GradScaler::unscale_(const std::vector<torch::Tensor>& params) {
  if (!options_.enabled) return false;
  if (unscaled_) GZ_THROW(InvalidArgument, "GradScaler::unscale_ called twice before update()");
  torch::NoGradGuard no_grad;
  const double inv = 1.0 / scale_;
  bool inf = false;
  for (const auto& p : params) {
    auto& g = p.grad();
    if (!g.defined()) continue;
    // Check in float32: an fp16 gradient times inv could underflow but never creates inf.
    if (!inf && !torch::isfinite(g).all().item<bool>()) inf = true;
    g.mul_(inv);
  }
  unscaled_ = true;
  found_inf_ = inf;
  return inf;
}

void GradScaler::unscale_(torch::optim::Optimizer& opt) {
  std::vector<torch::Tensor> params;
  for (auto& group : opt.param_groups())
    for (auto& p : group.params()) params.push_back(p);
  unscale_(params);
}

bool GradScaler::step(torch::optim::Optimizer& opt) {
  if (!options_.enabled) {
    opt.step();
    return true;
  }
  if (!unscaled_) unscale_(opt);
  if (found_inf_) return false;
  opt.step();
  return true;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  if (found_inf_) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
  } else if (++growth_tracker_ >= options_.growth_interval) {
    scale_ *= options_.growth_factor;
    growth_tracker_ = 0;
  }
  unscaled_ = false;
  found_inf_ = false;
}

void GradScaler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("scale", torch::tensor({scale_}, torch::kFloat64));
  archive.write("growth_tracker", torch::tensor({growth_tracker_}, torch::kInt64));
}

void GradScaler::load(torch::serialize::InputArchive& archive) {
  torch::Tensor s, g;
  archive.read("scale", s);
  archive.read("growth_tracker", g);
  if (s.numel() != 1 || g.numel() != 1) GZ_THROW(InvalidArgument, "GradScaler state has the wrong shape");
  scale_ = s.item<double>();
  growth_tracker_ = g.item<int64_t>();
  unscaled_ = false;
  found_inf_ = false;
}

}  // namespace gz
