#include "gz/torch/autocast.h"

#include <ATen/autocast_mode.h>

#include "gz/core/error.h"
#include "torch/torch_compat.h"

namespace gz {

using torch_compat::autocast_dtype;
using torch_compat::autocast_enabled;
using torch_compat::set_autocast_dtype;
using torch_compat::set_autocast_enabled;

AutocastGuard::AutocastGuard(c10::DeviceType device, c10::ScalarType dtype, bool enabled)
    : device_(device), enabled_(enabled) {
  if (!enabled_) return;
  if (device == c10::DeviceType::CPU) {
    if (dtype != c10::ScalarType::BFloat16)
      GZ_THROW(InvalidArgument, "autocast on CPU supports bf16 only (fp16 needs CUDA)");
  } else if (device == c10::DeviceType::CUDA) {
    if (dtype != c10::ScalarType::BFloat16 && dtype != c10::ScalarType::Half)
      GZ_THROW(InvalidArgument, "autocast on CUDA supports fp16 and bf16");
  } else {
    GZ_THROW(InvalidArgument, "autocast: unsupported device");
  }
  prev_enabled_ = autocast_enabled(device);
  prev_dtype_ = autocast_dtype(device);
  set_autocast_dtype(device, dtype);
  set_autocast_enabled(device, true);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!enabled_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  set_autocast_enabled(device_, prev_enabled_);
  set_autocast_dtype(device_, prev_dtype_);
}

}  // namespace gz
