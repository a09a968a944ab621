// RAII owners of the CUDA objects the NCCL backend uses: device guard, stream, event, device and
// pinned host buffers. Destructors never throw; they run on whichever device is current, so the
// owner frees them under a DeviceGuard for their device.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "gz/core/error.h"

namespace gz::comm::nccl_detail {

/// @brief Throw gz::Error naming the CUDA call and error (and the caller's context) on failure.
inline void cuda_check(cudaError_t e, const char* call, const std::string& context) {
  if (e != cudaSuccess)
    GZ_THROW(Error, context, ": CUDA ", call, " failed: ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

/// @brief Makes `device` current on this thread for the scope and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = -1;
    if (prev_ != device) cuda_check(cudaSetDevice(device), "cudaSetDevice", "nccl");
  }
  ~DeviceGuard() {
    int cur = -1;
    if (prev_ >= 0 && cudaGetDevice(&cur) == cudaSuccess && cur != prev_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

class CudaStream {
 public:
  CudaStream() = default;
  /// @brief A stream that does not synchronise implicitly with the legacy default stream.
  static CudaStream create_non_blocking() {
    CudaStream s;
    cuda_check(cudaStreamCreateWithFlags(&s.s_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", "nccl");
    return s;
  }
  CudaStream(CudaStream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  CudaStream& operator=(CudaStream&& o) noexcept {
    std::swap(s_, o.s_);
    return *this;
  }
  ~CudaStream() {
    if (s_) cudaStreamDestroy(s_);
  }
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

class CudaEvent {
 public:
  CudaEvent() = default;
  static CudaEvent create() {
    CudaEvent e;
    cuda_check(cudaEventCreateWithFlags(&e.e_, cudaEventDisableTiming), "cudaEventCreateWithFlags", "nccl");
    return e;
  }
  CudaEvent(CudaEvent&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  CudaEvent& operator=(CudaEvent&& o) noexcept {
    std::swap(e_, o.e_);
    return *this;
  }
  ~CudaEvent() {
    if (e_) cudaEventDestroy(e_);
  }
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

/// @brief cudaMalloc'ed memory (or none for 0 bytes).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes) cuda_check(cudaMalloc(&p_, bytes), "cudaMalloc", "nccl");
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  void* get() const { return p_; }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

/// @brief Page-locked host memory (cudaMallocHost), for small async device<->host copies.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes) {
    if (bytes) cuda_check(cudaMallocHost(&p_, bytes), "cudaMallocHost", "nccl");
  }
  PinnedBuffer(PinnedBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  ~PinnedBuffer() {
    if (p_) cudaFreeHost(p_);
  }
  void* get() const { return p_; }

 private:
  void* p_ = nullptr;
};

}  // namespace gz::comm::nccl_detail
