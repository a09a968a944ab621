// Tensors -> (pointer, count, dtype) spans for the LibTorch-free communicator.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <vector>

#include "gz/comm/types.h"
#include "gz/core/dtype.h"

namespace gz::python {

/// @brief Our element type for a tensor's dtype; throws c10::Error (Python: RuntimeError)
/// naming the op for dtypes the reductions do not cover (bool, int16, complex, ...).
gz::DType reduce_dtype(const at::Tensor& t, const char* op);
/// @brief Our reduction for a c10d one; throws for BAND/BOR/BXOR/PREMUL_SUM with the reason.
gz::comm::ReduceOp reduce_op(const c10d::ReduceOp& op, const char* what);
/// @brief Throws unless the tensor is a dense CPU tensor (the "gz" backend is CPU-only).
void check_cpu(const at::Tensor& t, const char* op);
/// @brief Checks every tensor and that all have the same dtype and number of elements as t0.
void check_same(const std::vector<at::Tensor>& ts, const at::Tensor& t0, const char* op, const char* what);
/// @brief Bytes of a tensor's data (data-movement ops move any dtype as bytes).
inline size_t nbytes(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

}  // namespace gz::python
