// How a c10d reduction (ReduceOp x tensor dtype) runs on our communicator, whose reductions cover
// sum/avg/min/max/prod over f32, f64, f16, bf16, i8, u8, i32, i64.
#pragma once

#include <ATen/ATen.h>

#include <torch/csrc/distributed/c10d/Types.hpp>

#include "gz/comm/communicator.h"

namespace gz::python {

/// @brief The mapping chosen for one reduction, fixed when the op is issued (so a dtype or op we
/// cannot reduce raises on the caller's thread, not later in the Work).
struct ReducePlan {
  enum class Kind {
    native,   ///< our reduction on the tensor's memory (complex: as pairs of reals)
    widened,  ///< int16: reduced as int32 (the same result modulo 2^16), then narrowed back
    bitwise,  ///< BAND/BOR/BXOR on integers: all-gather, then folded locally
  };
  Kind kind = Kind::native;
  DType dtype = DType::f32;                 ///< wire element type (native, widened)
  comm::ReduceOp op = comm::ReduceOp::sum;  ///< native, widened
  int64_t reals_per_element = 1;            ///< complex: 2
  c10d::ReduceOp::RedOpType bitop = c10d::ReduceOp::BAND;
  bool premul = false;  ///< PREMUL_SUM: scale by the factor, then sum
  double premul_factor = 1.0;
  at::Tensor premul_tensor;  ///< when the factor is a tensor
};

/// @brief Plan the reduction `op` of tensors like `t`; throws c10::Error (Python: RuntimeError)
/// naming `what`, the op and the dtype when neither our kernels nor a fallback cover it.
ReducePlan plan_reduction(const at::Tensor& t, const c10d::ReduceOp& op, const char* what);

/// @brief In place on a contiguous CPU tensor: `buf` becomes the reduction over the group.
void allreduce_planned(comm::Communicator& c, const at::Tensor& buf, const ReducePlan& p,
                       const comm::OpOptions& o);
/// @brief Reduce to `root` in place on a contiguous tensor; other ranks' `buf` is left unspecified.
void reduce_planned(comm::Communicator& c, const at::Tensor& buf, const ReducePlan& p, int root,
                    const comm::OpOptions& o);
/// @brief `in` (contiguous, size() blocks of out.numel()) reduced; this rank's block into `out`
/// (contiguous).
void reduce_scatter_planned(comm::Communicator& c, const at::Tensor& in, const at::Tensor& out,
                            const ReducePlan& p, const comm::OpOptions& o);

/// @brief Throws unless the tensor is a defined, dense CPU tensor (the "gz" backend is CPU-only).
void check_cpu(const at::Tensor& t, const char* op);
/// @brief Checks every tensor of `ts` and that all have t0's dtype (and number of elements).
void check_same(const std::vector<at::Tensor>& ts, const at::Tensor& t0, const char* op, const char* what,
                bool same_numel = true);
/// @brief Bytes of a tensor's data (data-movement ops move any dtype as bytes).
inline size_t nbytes(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

}  // namespace gz::python
