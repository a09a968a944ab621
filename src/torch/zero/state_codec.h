// Access to the fields of LibTorch's per-parameter optimizer states, so ZeRO can cut a parameter's
// state into shards and put shards back together without knowing the optimizer.
#pragma once

#include <torch/optim/optimizer.h>

#include <memory>
#include <utility>
#include <vector>

#include "torch/torch_compat.h"

namespace gz::zero {

/// @brief The fields of one parameter's state: tensors shaped like the parameter (elementwise
/// state), and the step counter if the optimizer keeps one.
struct StateFields {
  std::vector<std::pair<const char*, torch::Tensor*>> tensors;
  int64_t* step = nullptr;
};

/// @brief Fields of `state` for the elementwise optimizers ZeRO supports: SGD, Adam, AdamW (so
/// gz::FusedAdamW), Adagrad, RMSprop. Throws gz::InvalidArgument for another state type.
StateFields state_fields(torch::optim::OptimizerParamState& state);

/// @brief A fresh (empty) per-parameter state of the type `opt` keeps (same optimizers as
/// state_fields()); throws gz::InvalidArgument for another optimizer.
std::unique_ptr<torch::optim::OptimizerParamState> new_state(const torch::optim::Optimizer& opt);

using torch_compat::state_key;  // the optimizer's state-map key of a parameter (torch_compat.h)

}  // namespace gz::zero
