#include "gz/torch/autocast.h"

#include <ATen/autocast_mode.h>

#include "gz/core/error.h"

namespace gz {

AutocastGuard::AutocastGuard(c10::DeviceType device, c10::ScalarType dtype, bool enabled)
    : device_(device), enabled_(enabled) {
  if (!enabled_) return;
  if (device == c10::DeviceType::CPU) {
    if (dtype != c10::ScalarType::BFloat16)
      GZ_THROW(InvalidArgument, "autocast on CPU supports bf16 only (fp16 needs CUDA)");
    prev_enabled_ = at::autocast::is_cpu_enabled();
    prev_dtype_ = at::autocast::get_autocast_cpu_dtype();
    at::autocast::set_autocast_cpu_dtype(dtype);
    at::autocast::set_cpu_enabled(true);
  } else if (device == c10::DeviceType::CUDA) {
    if (dtype != c10::ScalarType::BFloat16 && dtype != c10::ScalarType::Half)
      GZ_THROW(InvalidArgument, "autocast on CUDA supports fp16 and bf16");
    prev_enabled_ = at::autocast::is_enabled();
    prev_dtype_ = at::autocast::get_autocast_gpu_dtype();
    at::autocast::set_autocast_gpu_dtype(dtype);
    at::autocast::set_enabled(true);
  } else {
    GZ_THROW(InvalidArgument, "autocast: unsupported device");
  }
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!enabled_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  if (device_ == c10::DeviceType::CPU) {
    at::autocast::set_cpu_enabled(prev_enabled_);
    at::autocast::set_autocast_cpu_dtype(prev_dtype_);
  } else {
    at::autocast::set_enabled(prev_enabled_);
    at::autocast::set_autocast_gpu_dtype(prev_dtype_);
  }
}

}  // namespace gz
