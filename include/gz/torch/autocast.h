// RAII autocast for the LibTorch C++ API (which has no torch::autocast context manager).
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace gz {

/// @brief Enables autocast to `dtype` for ops on `device` while alive (bf16 on CPU; bf16 or fp16 on
/// CUDA); restores the previous settings and clears the cast cache on destruction.
/// fp16 on CPU throws gz::InvalidArgument.
class AutocastGuard {
 public:
  AutocastGuard(c10::DeviceType device, c10::ScalarType dtype, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_;
  bool enabled_;
  bool prev_enabled_ = false;
  c10::ScalarType prev_dtype_ = c10::ScalarType::Float;
};

}  // namespace gz
