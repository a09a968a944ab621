#include <torch/torch.h>

#include "gz/core/log.h"
#include "gz/train/callback.h"
#include "gz/train/trainer.h"

namespace gz::train {

struct PruningCallback::Impl {
  std::vector<std::pair<torch::Tensor, torch::Tensor>> masked;  // (weight, 0/1 mask)
};

void PruningCallback::on_step_end(Trainer& t) {
  torch::NoGradGuard no_grad;
  if (!impl_) {
    // Masks from |w| after the first step: every rank computes the same masks (same weights).
    impl_ = std::make_shared<Impl>();
    for (auto& p : t.model()->named_parameters()) {
      auto w = p.value();
      if (w.dim() < 2 || w.numel() < 2) continue;
      int64_t k = static_cast<int64_t>(sparsity_ * static_cast<double>(w.numel()));
      if (k < 1) continue;
      auto flat = w.detach().abs().reshape({-1});
      auto threshold = std::get<0>(flat.kthvalue(k));
      auto mask = (w.detach().abs() > threshold).to(w.dtype());
      impl_->masked.emplace_back(w, mask);
    }
  }
  for (auto& [w, mask] : impl_->masked) w.mul_(mask);
}

void PruningCallback::on_train_end(Trainer& t) {
  if (!impl_ || !t.is_main()) return;
  int64_t zeros = 0, total = 0;
  for (auto& [w, mask] : impl_->masked) {
    zeros += w.eq(0).sum().item<int64_t>();
    total += w.numel();
  }
  GZ_LOG(info, "pruning: ", zeros, "/", total, " weights are zero");
}

}  // namespace gz::train
