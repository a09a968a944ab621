// Horovod mode's gradient memory: every CPU gradient gets a slot of one arena from alloc_buffer, in
// the agreed (name) order, so its offset is the same on every rank and big gradients are reduced
// there with no staging copies (as DDP's gradient_as_bucket_view). AccumulateGrad adds into the
// slot in place.
#pragma once

#include <torch/types.h>

#include <vector>

#include "gz/comm/communicator.h"

namespace gz::horovod {

class GradientArena {
 public:
  /// @brief Collective: every CPU parameter's .grad becomes its slot (a gradient it had is copied).
  GradientArena(comm::Communicator& group, const std::vector<torch::Tensor>& params);
  /// @brief A gradient that left its slot (zero_grad(set_to_none), or replaced by the user) moves
  /// back: copied once, then accumulated in place again. No-op for a parameter without a slot.
  void rebind(size_t i);

 private:
  const std::vector<torch::Tensor>& params_;
  torch::Tensor arena_;
  std::vector<torch::Tensor> views_;  // per parameter: its slot, param-shaped (undefined: not CPU)
};

}  // namespace gz::horovod
