#include "gz/torch/fused_adamw.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <cmath>

#include "torch/fused/kernels.h"
#include "torch/torch_compat.h"

namespace gz {
namespace {

using torch_compat::state_key;

bool fusable(const torch::Tensor& p, const torch::Tensor& g, const torch::optim::AdamWOptions& o) {
  return !o.amsgrad() && p.device().is_cpu() && p.scalar_type() == torch::kFloat &&
         g.scalar_type() == torch::kFloat && g.layout() == torch::kStrided && p.is_contiguous() &&
         g.is_contiguous() && g.device().is_cpu();
}

// LibTorch's AdamW update for one parameter (the reference; used where the fused kernel does not apply).
void reference_update(torch::Tensor& p, const torch::Tensor& grad, torch::optim::AdamWParamState& st,
                      const torch::optim::AdamWOptions& o) {
  const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
  const double bc1 = 1 - std::pow(beta1, st.step()), bc2 = 1 - std::pow(beta2, st.step());
  if (o.weight_decay() != 0) p.mul_(1 - o.lr() * o.weight_decay());
  st.exp_avg().mul_(beta1).add_(grad, 1 - beta1);
  st.exp_avg_sq().mul_(beta2).addcmul_(grad, grad, 1 - beta2);
  torch::Tensor denom;
  if (o.amsgrad()) {
    torch::max_out(st.max_exp_avg_sq(), st.exp_avg_sq(), st.max_exp_avg_sq());
    denom = (st.max_exp_avg_sq().sqrt() / std::sqrt(bc2)).add_(o.eps());
  } else {
    denom = (st.exp_avg_sq().sqrt() / std::sqrt(bc2)).add_(o.eps());
  }
  p.addcdiv_(st.exp_avg(), denom, -o.lr() / bc1);
}

}  // namespace

torch::Tensor FusedAdamW::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups_) {
    auto& o = static_cast<torch::optim::AdamWOptions&>(group.options());
    for (auto& p : group.params()) {
      const auto& grad = p.grad();
      if (!grad.defined()) continue;
      TORCH_CHECK(!grad.is_sparse(), "AdamW does not support sparse gradients");
      auto key = state_key(state_, p);
      auto it = state_.find(key);
      if (it == state_.end()) {
        auto st = std::make_unique<torch::optim::AdamWParamState>();
        st->step(0);
        st->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        st->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        if (o.amsgrad()) st->max_exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        it = state_.emplace(key, std::move(st)).first;
      }
      auto& st = static_cast<torch::optim::AdamWParamState&>(*it->second);
      st.step(st.step() + 1);
      if (!fusable(p, grad, o) || !st.exp_avg().is_contiguous() || !st.exp_avg_sq().is_contiguous()) {
        reference_update(p, grad, st, o);
        continue;
      }
      const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
      fused::AdamWScalars s;
      s.decay = static_cast<float>(1 - o.lr() * o.weight_decay());
      s.beta1 = static_cast<float>(beta1);
      s.beta2 = static_cast<float>(beta2);
      s.one_minus_beta1 = static_cast<float>(1 - beta1);
      s.one_minus_beta2 = static_cast<float>(1 - beta2);
      s.sqrt_bias_correction2 = static_cast<float>(std::sqrt(1 - std::pow(beta2, st.step())));
      s.eps = static_cast<float>(o.eps());
      s.neg_step_size = static_cast<float>(-o.lr() / (1 - std::pow(beta1, st.step())));
      float* pp = p.data_ptr<float>();
      const float* gp = grad.data_ptr<float>();
      float* mp = st.exp_avg().data_ptr<float>();
      float* vp = st.exp_avg_sq().data_ptr<float>();
      // Chunks large enough to stream, small enough to share out over LibTorch's intra-op threads.
      at::parallel_for(0, p.numel(), 1 << 16, [&](int64_t b, int64_t e) {
        fused::adamw_f32(pp + b, gp + b, mp + b, vp + b, static_cast<size_t>(e - b), s);
      });
    }
  }
  return loss;
}

}  // namespace gz
