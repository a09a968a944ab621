#include "reduce_plan.h"

#include <c10/util/Exception.h>
#include <torch/version.h>

#include "gz/torch/tensor_adapter.h"  // to_dtype: the dtypes our kernels reduce

namespace gz::python {

namespace {

const char* op_name(c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM:
      return "SUM";
    case c10d::ReduceOp::AVG:
      return "AVG";
    case c10d::ReduceOp::PRODUCT:
      return "PRODUCT";
    case c10d::ReduceOp::MIN:
      return "MIN";
    case c10d::ReduceOp::MAX:
      return "MAX";
    case c10d::ReduceOp::BAND:
      return "BAND";
    case c10d::ReduceOp::BOR:
      return "BOR";
    case c10d::ReduceOp::BXOR:
      return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM:
      return "PREMUL_SUM";
    default:
      return "UNKNOWN";
  }
}

comm::ReduceOp arithmetic(c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::AVG:
      return comm::ReduceOp::avg;
    case c10d::ReduceOp::PRODUCT:
      return comm::ReduceOp::prod;
    case c10d::ReduceOp::MIN:
      return comm::ReduceOp::min;
    case c10d::ReduceOp::MAX:
      return comm::ReduceOp::max;
    default:
      return comm::ReduceOp::sum;  // SUM, PREMUL_SUM (after scaling)
  }
}

bool is_integral(at::ScalarType s) { return at::isIntegralType(s, /*includeBool=*/true); }

}  // namespace

ReducePlan plan_reduction(const at::Tensor& t, const c10d::ReduceOp& rop, const char* what) {
  const auto op = static_cast<c10d::ReduceOp::RedOpType>(rop.op_);
  const auto st = t.scalar_type();
  ReducePlan p;
  TORCH_CHECK(op <= c10d::ReduceOp::PREMUL_SUM, "gz backend: ", what, ": unknown ReduceOp ",
              static_cast<int>(op));
  auto unsupported = [&](const char* why) {
    TORCH_CHECK(false, "gz backend: ", what, " does not support ReduceOp.", op_name(op), " on ", st, ": ",
                why);
  };
  if (op == c10d::ReduceOp::PREMUL_SUM) {
    // Multiply by the factor, then sum (NCCL's PREMUL_SUM; a float factor or a one-element tensor).
    auto* s = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(rop.supplement_.get());
    TORCH_CHECK(s, "gz backend: ", what, ": PREMUL_SUM without its factor");
    TORCH_CHECK(at::isFloatingType(st) || at::isComplexType(st), "gz backend: ", what,
                ": PREMUL_SUM needs a floating-point tensor, got ", st);
    p.premul = true;
#if TORCH_VERSION_MAJOR >= 2
    const bool has_tensor = s->tensor_factor.defined();  // 2.x: one tensor
    const at::Tensor factor = s->tensor_factor;
#else
    const bool has_tensor = !s->tensor_factors.empty();  // 1.13: a vector of them
    const at::Tensor factor = has_tensor ? s->tensor_factors[0] : at::Tensor();
#endif
    if (has_tensor) {
      p.premul_tensor = factor.to(at::kCPU);
      TORCH_CHECK(p.premul_tensor.numel() == 1, "gz backend: ", what,
                  ": PREMUL_SUM factor must have one element");
    } else {
      p.premul_factor = s->double_factor;
    }
  }
  if (op == c10d::ReduceOp::BAND || op == c10d::ReduceOp::BOR || op == c10d::ReduceOp::BXOR) {
    if (!is_integral(st)) unsupported("bitwise reductions need an integer or bool tensor");
    if (st == at::kBool && op != c10d::ReduceOp::BXOR) {
      // On 0/1 bytes, AND is min and OR is max: our kernels do them in place.
      p.dtype = DType::u8;
      p.op = op == c10d::ReduceOp::BAND ? comm::ReduceOp::min : comm::ReduceOp::max;
      return p;
    }
    p.kind = ReducePlan::Kind::bitwise;
    p.bitop = op;
    return p;
  }
  switch (st) {
    case at::kBool:
      // torch's bool reductions are logical: SUM and MAX = any, PRODUCT and MIN = all.
      if (op == c10d::ReduceOp::AVG) unsupported("the average of booleans is not a boolean");
      p.dtype = DType::u8;
      p.op = (op == c10d::ReduceOp::SUM || op == c10d::ReduceOp::MAX) ? comm::ReduceOp::max
                                                                      : comm::ReduceOp::min;
      return p;
    case at::kShort:
      p.kind = ReducePlan::Kind::widened;
      p.dtype = DType::i32;
      p.op = arithmetic(op);
      return p;
    case at::kComplexFloat:
    case at::kComplexDouble:
      // Element-wise sums of complex numbers are sums of their real and imaginary parts.
      if (op != c10d::ReduceOp::SUM && op != c10d::ReduceOp::AVG && op != c10d::ReduceOp::PREMUL_SUM)
        unsupported("complex numbers have no order, and their product is not element-wise on the parts");
      p.dtype = st == at::kComplexFloat ? DType::f32 : DType::f64;
      p.reals_per_element = 2;
      p.op = arithmetic(op);
      return p;
    default:
      break;
  }
  try {
    p.dtype = gz::to_dtype(st, what);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "gz backend: ", e.what(), " (also: bool, int16, complex64, complex128)");
  }
  p.op = arithmetic(op);
  return p;
}

namespace {

// Every rank's copy of `buf`, folded with the bitwise op into `buf`.
void bitwise_allreduce(comm::Communicator& c, const at::Tensor& buf, const ReducePlan& p,
                       const comm::OpOptions& o) {
  const int w = c.size();
  at::Tensor all = at::empty({w, buf.numel()}, buf.options());
  c.allgather(buf.data_ptr(), all.data_ptr(), nbytes(buf), DType::u8, o);
  at::Tensor acc = all[0];
  for (int r = 1; r < w; ++r) {
    if (p.bitop == c10d::ReduceOp::BAND)
      acc = at::bitwise_and(acc, all[r]);
    else if (p.bitop == c10d::ReduceOp::BOR)
      acc = at::bitwise_or(acc, all[r]);
    else
      acc = at::bitwise_xor(acc, all[r]);
  }
  buf.view({-1}).copy_(acc);
}

void scale_for_premul(const at::Tensor& buf, const ReducePlan& p) {
  if (!p.premul) return;
  if (p.premul_tensor.defined())
    buf.mul_(p.premul_tensor.reshape({}));
  else
    buf.mul_(p.premul_factor);
}

// The wire span of a contiguous tensor under a native plan.
size_t wire_count(const at::Tensor& t, const ReducePlan& p) {
  return static_cast<size_t>(t.numel() * p.reals_per_element);
}

}  // namespace

void allreduce_planned(comm::Communicator& c, const at::Tensor& buf, const ReducePlan& p,
                       const comm::OpOptions& o) {
  switch (p.kind) {
    case ReducePlan::Kind::native:
      scale_for_premul(buf, p);
      c.allreduce(buf.data_ptr(), wire_count(buf, p), p.dtype, p.op, o);
      return;
    case ReducePlan::Kind::widened: {
      at::Tensor wide = buf.to(at::kInt);
      c.allreduce(wide.data_ptr(), static_cast<size_t>(wide.numel()), p.dtype, p.op, o);
      buf.copy_(wide);
      return;
    }
    case ReducePlan::Kind::bitwise:
      bitwise_allreduce(c, buf, p, o);
      return;
  }
}

void reduce_planned(comm::Communicator& c, const at::Tensor& buf, const ReducePlan& p, int root,
                    const comm::OpOptions& o) {
  if (p.kind != ReducePlan::Kind::native) {
    allreduce_planned(c, buf, p, o);  // every rank computes it; only the root's result matters
    return;
  }
  scale_for_premul(buf, p);
  c.reduce(buf.data_ptr(), wire_count(buf, p), p.dtype, p.op, root, o);
}

void reduce_scatter_planned(comm::Communicator& c, const at::Tensor& in, const at::Tensor& out,
                            const ReducePlan& p, const comm::OpOptions& o) {
  if (p.kind != ReducePlan::Kind::native) {
    at::Tensor all = in.clone();
    allreduce_planned(c, all, p, o);
    out.view({-1}).copy_(all.view({-1}).narrow(0, c.rank() * out.numel(), out.numel()));
    return;
  }
  at::Tensor src = in;
  if (p.premul) {
    src = in.clone();  // the caller's input stays as it was
    scale_for_premul(src, p);
  }
  c.reduce_scatter(src.data_ptr(), out.data_ptr(), wire_count(out, p), p.dtype, p.op, o);
}

void check_cpu(const at::Tensor& t, const char* op) {
  TORCH_CHECK(t.defined(), "gz backend: ", op, ": undefined tensor");
  TORCH_CHECK(t.device().is_cpu(), "gz backend: ", op, " supports CPU tensors only, got a tensor on ",
              t.device());
  TORCH_CHECK(t.layout() == at::kStrided, "gz backend: ", op, " supports dense tensors only, got layout ",
              t.layout());
}

void check_same(const std::vector<at::Tensor>& ts, const at::Tensor& t0, const char* op, const char* what,
                bool same_numel) {
  for (const auto& t : ts) {
    check_cpu(t, op);
    TORCH_CHECK(t.scalar_type() == t0.scalar_type(), "gz backend: ", op, ": ", what, " dtypes differ (",
                t.scalar_type(), " vs ", t0.scalar_type(), ")");
    TORCH_CHECK(!same_numel || t.numel() == t0.numel(), "gz backend: ", op, ": ", what, " sizes differ (",
                t.numel(), " vs ", t0.numel(), " elements)");
  }
}

}  // namespace gz::python
