// Element-wise reduction kernels of the shm backend (compiled with -O3, vectorisable loops).
#pragma once

#include <cstddef>

#include "gz/comm/types.h"
#include "gz/core/dtype.h"

namespace gz::comm::shm {

/// @brief dst[i] = srcs[0][i] op srcs[1][i] op ... op srcs[n-1][i], applied in source order.
///
/// f16/bf16 accumulate in f32 and round once at the end; integers wrap. avg divides the sum by
/// `avg_divisor` (the world size; integers truncate). dst may equal any one source exactly (in
/// place); `dst2`, when not null, receives a second copy of the result (e.g. the shared segment).
void reduce_n(void* dst, void* dst2, const void* const* srcs, int n, size_t count, DType dtype, ReduceOp op,
              int avg_divisor);

}  // namespace gz::comm::shm
