// Tensor -> (pointer, count, DType) spans for the LibTorch-free communication layer.
#pragma once

#include <torch/types.h>

#include "gz/comm/communicator.h"
#include "gz/core/dtype.h"

namespace gz {

/// @brief DType of a torch scalar type (float, double, half, bfloat16, int8, uint8, int32, int64);
/// other types throw gz::InvalidArgument naming `op`.
DType to_dtype(c10::ScalarType type, const char* op = "collective");
/// @brief Torch scalar type of a DType.
c10::ScalarType to_scalar_type(DType type);

/// @brief A tensor seen as one contiguous span. Contiguous tensors are used in place; others go
/// through a contiguous staging copy that finish() writes back (when `write_back`).
/// CUDA tensors are only accepted for groups whose backend is "nccl".
class TensorSpan {
 public:
  TensorSpan(const torch::Tensor& tensor, const comm::Communicator& group, const char* op,
             bool write_back = true);
  void* data() const { return work_.data_ptr(); }
  size_t count() const { return static_cast<size_t>(work_.numel()); }
  DType dtype() const { return dtype_; }
  /// @brief The contiguous tensor the span points into.
  const torch::Tensor& tensor() const { return work_; }
  /// @brief Copy a staged result back into the original tensor (no-op when used in place).
  void finish();

 private:
  torch::Tensor orig_;
  torch::Tensor work_;
  DType dtype_;
  bool write_back_;
};

/// @brief Memory from group.alloc_buffer() as a flat tensor of `numel` elements (zero-filled);
/// the tensor keeps the memory alive. Collective, like alloc_buffer. CPU only.
torch::Tensor alloc_buffer_tensor(comm::Communicator& group, int64_t numel,
                                  const torch::TensorOptions& options);

/// @brief True when `grad` is exactly `view` (same memory, shape and strides): a gradient bound to
/// its slot of a communication buffer, maybe re-wrapped by the optimizer or autograd.
bool is_bound_to(const torch::Tensor& grad, const torch::Tensor& view);

/// @brief Throws gz::InvalidArgument unless `tensor` may be used with `group` (device check).
void check_device(const torch::Tensor& tensor, const comm::Communicator& group, const char* op);

}  // namespace gz
