#include "tensor_span.h"

#include <c10/util/Exception.h>

namespace gz::python {

gz::DType reduce_dtype(const at::Tensor& t, const char* op) {
  switch (t.scalar_type()) {
    case at::kFloat: return gz::DType::f32;
    case at::kDouble: return gz::DType::f64;
    case at::kHalf: return gz::DType::f16;
    case at::kBFloat16: return gz::DType::bf16;
    case at::kChar: return gz::DType::i8;
    case at::kByte: return gz::DType::u8;
    case at::kInt: return gz::DType::i32;
    case at::kLong: return gz::DType::i64;
    default:
      TORCH_CHECK(false, "gz backend: ", op, " does not support dtype ", t.scalar_type(),
                  " (supported: float32, float64, float16, bfloat16, int8, uint8, int32, int64)");
  }
}

gz::comm::ReduceOp reduce_op(const c10d::ReduceOp& op, const char* what) {
  switch (static_cast<c10d::ReduceOp::RedOpType>(op)) {
    case c10d::ReduceOp::SUM: return gz::comm::ReduceOp::sum;
    case c10d::ReduceOp::AVG: return gz::comm::ReduceOp::avg;
    case c10d::ReduceOp::PRODUCT: return gz::comm::ReduceOp::prod;
    case c10d::ReduceOp::MIN: return gz::comm::ReduceOp::min;
    case c10d::ReduceOp::MAX: return gz::comm::ReduceOp::max;
    case c10d::ReduceOp::BAND:
    case c10d::ReduceOp::BOR:
    case c10d::ReduceOp::BXOR:
      TORCH_CHECK(false, "gz backend: ", what,
                  " does not support bitwise reductions (BAND/BOR/BXOR); supported: SUM, AVG, PRODUCT, MIN, MAX");
    case c10d::ReduceOp::PREMUL_SUM:
      TORCH_CHECK(false, "gz backend: ", what,
                  " does not support PREMUL_SUM (an NCCL-only op); multiply first, then use SUM");
    default:
      TORCH_CHECK(false, "gz backend: ", what, ": unknown reduce op ", static_cast<int>(op.op_));
  }
}

void check_cpu(const at::Tensor& t, const char* op) {
  TORCH_CHECK(t.defined(), "gz backend: ", op, ": undefined tensor");
  TORCH_CHECK(t.device().is_cpu(), "gz backend: ", op, " supports CPU tensors only, got a tensor on ", t.device());
  TORCH_CHECK(t.layout() == at::kStrided, "gz backend: ", op, " supports dense tensors only, got layout ",
              t.layout());
}

void check_same(const std::vector<at::Tensor>& ts, const at::Tensor& t0, const char* op, const char* what) {
  for (const auto& t : ts) {
    check_cpu(t, op);
    TORCH_CHECK(t.scalar_type() == t0.scalar_type(), "gz backend: ", op, ": ", what, " dtypes differ (",
                t.scalar_type(), " vs ", t0.scalar_type(), ")");
    TORCH_CHECK(t.numel() == t0.numel(), "gz backend: ", op, ": ", what, " sizes differ (", t.numel(), " vs ",
                t0.numel(), " elements)");
  }
}

}  // namespace gz::python
