// Gloo's and MPI's local reduction steps, on the same kernels as the shm backend's.
#include "comm/reduce/reduce.h"

#include "gz/core/error.h"

namespace gz::comm::reduce {

ReduceFn make_reduce_fn(DType dtype, ReduceOp op) {
  dtype_size(dtype);  // unknown dtypes fail here, before the collective starts
  const ReduceOp pair_op = op == ReduceOp::avg ? ReduceOp::sum : op;
  return [dtype, pair_op](void* out, const void* a, const void* b, size_t n) {
    const void* srcs[2] = {a, b};
    reduce_n(out, nullptr, srcs, 2, n, dtype, pair_op, 1);
  };
}

void divide_in_place(void* data, size_t n, DType dtype, int divisor) {
  const void* src[1] = {data};
  reduce_n(data, nullptr, src, 1, n, dtype, ReduceOp::avg, divisor);
}

}  // namespace gz::comm::reduce
