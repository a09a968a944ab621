// The one place in the LibTorch layer (src/torch, and the tests that reach into it) that knows
// which LibTorch it is compiled against. Everything else calls these and compiles on 1.13 (Debian
// 12) and 2.x (Debian 13's 2.6, pip's wheels) alike. python/src/torch_compat.h is the same for
// the Python binding.
//
// Differences kept here:
// - The optimizer's per-parameter state map is keyed by the parameter's TensorImpl: as a string
//   (its address printed) in 1.x, as the pointer itself in 2.x.
// - Not a difference, checked for fully_shard: the StorageImpl calls of src/torch/fsdp/
//   flat_storage.h (set_data_ptr_noswap, set_nbytes(size_t), allocator()) exist in 1.13 and 2.x
//   alike (2.x adds a SymInt set_nbytes); custom autograd Functions, FunctionPostHook and
//   Engine::queue_callback are the same too. Neither has forward pre-hooks on C++ modules (Python
//   modules only), so models mark their fully sharded units with gz::run_unit().
// - Autocast's per-device functions: 2.4 replaced the cpu_/gpu_ variants with ones taking the
//   device type and deprecated the old names; 1.13 has only the old ones.
#pragma once

#include <ATen/autocast_mode.h>
#include <torch/optim/optimizer.h>
#include <torch/version.h>

#include <sstream>
#include <string>
#include <type_traits>

namespace gz::torch_compat {

/// @brief The key of parameter `p` in a state map of LibTorch's optimizers (`Optimizer::state()`):
/// a string in LibTorch 1.x, the TensorImpl pointer in 2.x. Deduced from the map's key type, so
/// the rule holds whichever release changed it.
template <typename Map>
typename Map::key_type state_key(const Map&, const at::Tensor& p) {
  using Key = typename Map::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream os;
    os << p.unsafeGetTensorImpl();
    return os.str();
  } else {
    return reinterpret_cast<Key>(p.unsafeGetTensorImpl());
  }
}

/// @brief `opt`'s state of parameter `p`, or nullptr when it has none yet (before its first step).
inline torch::optim::OptimizerParamState* param_state(torch::optim::Optimizer& opt, const at::Tensor& p) {
  auto& state = opt.state();
  auto it = state.find(state_key(state, p));
  return it == state.end() ? nullptr : it->second.get();
}

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
inline bool autocast_enabled(c10::DeviceType d) { return at::autocast::is_autocast_enabled(d); }
inline void set_autocast_enabled(c10::DeviceType d, bool on) { at::autocast::set_autocast_enabled(d, on); }
inline c10::ScalarType autocast_dtype(c10::DeviceType d) { return at::autocast::get_autocast_dtype(d); }
inline void set_autocast_dtype(c10::DeviceType d, c10::ScalarType t) { at::autocast::set_autocast_dtype(d, t); }
#else
inline bool autocast_enabled(c10::DeviceType d) {
  return d == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
}
inline void set_autocast_enabled(c10::DeviceType d, bool on) {
  if (d == c10::DeviceType::CPU)
    at::autocast::set_cpu_enabled(on);
  else
    at::autocast::set_enabled(on);
}
inline c10::ScalarType autocast_dtype(c10::DeviceType d) {
  return d == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype() : at::autocast::get_autocast_gpu_dtype();
}
inline void set_autocast_dtype(c10::DeviceType d, c10::ScalarType t) {
  if (d == c10::DeviceType::CPU)
    at::autocast::set_autocast_cpu_dtype(t);
  else
    at::autocast::set_autocast_gpu_dtype(t);
}
#endif

}  // namespace gz::torch_compat
