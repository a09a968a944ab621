// AdamW whose update runs in one pass over memory per parameter.
#pragma once

#include <torch/optim/adamw.h>

namespace gz {

/// @brief Drop-in torch::optim::AdamW with a fused update for float32 contiguous CPU parameters.
///
/// LibTorch's AdamW makes about nine passes over every parameter-sized tensor per step (mul_,
/// add_, addcmul_, sqrt, div, add_, addcdiv_, plus temporaries). This one reads p, grad, exp_avg and
/// exp_avg_sq once and writes them once, in the same arithmetic order, so results agree with
/// torch::optim::AdamW to rounding. State, options, save() and load() are AdamW's own: checkpoints
/// move freely between the two. Other dtypes, devices, layouts and amsgrad use LibTorch's path.
class FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;

  /// @brief One optimisation step (closure as in torch::optim::Optimizer::step).
  torch::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace gz
