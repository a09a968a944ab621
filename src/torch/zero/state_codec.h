// Access to the fields of LibTorch's per-parameter optimizer states, so ZeRO can cut a parameter's
// state into shards and put shards back together without knowing the optimizer.
#pragma once

#include <torch/optim/optimizer.h>

#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

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

/// @brief The optimizer's state-map key of parameter `p` (a string in LibTorch 1.x, the
/// TensorImpl pointer in 2.x).
template <typename Map>
typename Map::key_type state_key(const Map&, const torch::Tensor& p) {
  using Key = typename Map::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream os;
    os << p.unsafeGetTensorImpl();
    return os.str();
  } else {
    return reinterpret_cast<Key>(p.unsafeGetTensorImpl());
  }
}

}  // namespace gz::zero
