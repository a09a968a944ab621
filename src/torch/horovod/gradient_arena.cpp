#include "torch/horovod/gradient_arena.h"

#include "gz/torch/tensor_adapter.h"

namespace gz::horovod {

GradientArena::GradientArena(comm::Communicator& group, const std::vector<torch::Tensor>& params)
    : params_(params) {
  torch::NoGradGuard no_grad;
  std::vector<int64_t> offset(params_.size(), -1);
  int64_t total = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].is_cpu()) continue;
    offset[i] = total;
    total += (params_[i].numel() * params_[i].element_size() + 63) / 64 * 64;
  }
  if (total == 0) return;
  arena_ = alloc_buffer_tensor(group, total, torch::kUInt8);
  views_.resize(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    if (offset[i] < 0) continue;
    const auto& p = params_[i];
    // detach(): a plain tensor on the arena's memory, not an autograd view, so zero_grad() may detach_() it.
    views_[i] = arena_.narrow(0, offset[i], p.numel() * p.element_size())
                    .view(p.scalar_type())
                    .view(p.sizes())
                    .detach();
    auto& g = p.mutable_grad();
    if (g.defined()) views_[i].copy_(g);
    g = views_[i];
  }
}

void GradientArena::rebind(size_t i) {
  if (i >= views_.size() || !views_[i].defined()) return;
  auto& g = params_[i].mutable_grad();
  if (is_bound_to(g, views_[i])) return;
  torch::NoGradGuard no_grad;
  if (g.is_sparse()) {  // nn::Embedding sparse(true) with .grad unset: densified into the slot
    views_[i].zero_();
    views_[i].add_(g);
  } else {
    views_[i].copy_(g);
  }
  g = views_[i];
}

}  // namespace gz::horovod
