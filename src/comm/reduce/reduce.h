// The reduce kernels every backend shares (shm folds many sources at once; Gloo and MPI combine
// pairs and divide averages locally). Compiled with -O3; AVX2 and F16C are picked at run time.
#pragma once

#include <cstddef>
#include <functional>

#include "gz/comm/types.h"
#include "gz/core/dtype.h"

namespace gz::comm::reduce {

/// @brief dst[i] = srcs[0][i] op srcs[1][i] op ... op srcs[n-1][i], applied in source order.
///
/// f16/bf16 accumulate in f32 and round once at the end; integers wrap. avg divides the sum by
/// `avg_divisor` (the world size; integers truncate). dst may equal any one source exactly (in
/// place); `dst2`, when not null, receives a second copy of the result (e.g. the shared segment).
void reduce_n(void* dst, void* dst2, const void* const* srcs, int n, size_t count, DType dtype, ReduceOp op,
              int avg_divisor);

/// @brief Gloo's reduction-function form: out[i] = a[i] op b[i]; out may be a or b.
using ReduceFn = std::function<void(void* out, const void* a, const void* b, size_t n)>;
/// @brief The pairwise function for (dtype, op); avg combines as sum (divide once at the end,
/// with divide_in_place). f16/bf16 round back to 16 bits after each pair, as on the wire.
ReduceFn make_reduce_fn(DType dtype, ReduceOp op);

/// @brief data[i] /= divisor (avg = sum / world size; integers truncate toward zero).
void divide_in_place(void* data, size_t n, DType dtype, int divisor);

}  // namespace gz::comm::reduce
