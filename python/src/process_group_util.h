// Small helpers shared by the "gz" process group's op files.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <vector>

#include "gz/core/dtype.h"
#include "reduce_plan.h"

namespace gz::python {

/// Data-movement ops move any dtype as bytes.
inline constexpr gz::DType kBytes = gz::DType::u8;

/// Memory an op may use directly: t itself when contiguous, else a contiguous copy.
inline at::Tensor dense(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

/// After an op wrote into `buf` (from dense(t)): copy back when buf is a copy.
inline void write_back(at::Tensor& t, const at::Tensor& buf) {
  if (!buf.is_same(t)) t.copy_(buf);
}

inline void check_one(const std::vector<at::Tensor>& ts, const char* op) {
  TORCH_CHECK(ts.size() == 1, "gz backend: ", op, " takes exactly one tensor per process (got ", ts.size(),
              ")");
  check_cpu(ts[0], op);
}

inline void check_same_dtype(const std::vector<at::Tensor>& ts, const char* op) {
  for (const auto& t : ts) {
    check_cpu(t, op);
    TORCH_CHECK(t.scalar_type() == ts[0].scalar_type(), "gz backend: ", op, ": tensors of different dtypes (",
                t.scalar_type(), " and ", ts[0].scalar_type(), ")");
  }
}

}  // namespace gz::python
