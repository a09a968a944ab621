#include "gz/torch/autocast.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include "gz/core/error.h"

namespace gz {

namespace {
// LibTorch 2.4 replaced the per-device autocast functions (cpu_/gpu_) with ones taking the device
// type and deprecated the old names; 1.13 has only the old ones.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
bool autocast_enabled(c10::DeviceType d) { return at::autocast::is_autocast_enabled(d); }
void set_autocast_enabled(c10::DeviceType d, bool on) { at::autocast::set_autocast_enabled(d, on); }
c10::ScalarType autocast_dtype(c10::DeviceType d) { return at::autocast::get_autocast_dtype(d); }
void set_autocast_dtype(c10::DeviceType d, c10::ScalarType t) { at::autocast::set_autocast_dtype(d, t); }
#else
bool autocast_enabled(c10::DeviceType d) {
  return d == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
}
void set_autocast_enabled(c10::DeviceType d, bool on) {
  if (d == c10::DeviceType::CPU)
    at::autocast::set_cpu_enabled(on);
  else
    at::autocast::set_enabled(on);
}
c10::ScalarType autocast_dtype(c10::DeviceType d) {
  return d == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype()
                                   : at::autocast::get_autocast_gpu_dtype();
}
void set_autocast_dtype(c10::DeviceType d, c10::ScalarType t) {
  if (d == c10::DeviceType::CPU)
    at::autocast::set_autocast_cpu_dtype(t);
  else
    at::autocast::set_autocast_gpu_dtype(t);
}
#endif
}  // namespace

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
