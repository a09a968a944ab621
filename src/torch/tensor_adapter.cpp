#include "gz/torch/tensor_adapter.h"

#include "gz/core/error.h"

namespace gz {

DType to_dtype(c10::ScalarType type, const char* op) {
  switch (type) {
    case c10::ScalarType::Float: return DType::f32;
    case c10::ScalarType::Double: return DType::f64;
    case c10::ScalarType::Half: return DType::f16;
    case c10::ScalarType::BFloat16: return DType::bf16;
    case c10::ScalarType::Char: return DType::i8;
    case c10::ScalarType::Byte: return DType::u8;
    case c10::ScalarType::Int: return DType::i32;
    case c10::ScalarType::Long: return DType::i64;
    default:
      GZ_THROW(InvalidArgument, op, ": unsupported tensor dtype ", c10::toString(type),
               " (supported: float, double, half, bfloat16, int8, uint8, int32, int64)");
  }
}

c10::ScalarType to_scalar_type(DType type) {
  switch (type) {
    case DType::f32: return c10::ScalarType::Float;
    case DType::f64: return c10::ScalarType::Double;
    case DType::f16: return c10::ScalarType::Half;
    case DType::bf16: return c10::ScalarType::BFloat16;
    case DType::i8: return c10::ScalarType::Char;
    case DType::u8: return c10::ScalarType::Byte;
    case DType::i32: return c10::ScalarType::Int;
    case DType::i64: return c10::ScalarType::Long;
  }
  GZ_THROW(InvalidArgument, "unknown DType ", static_cast<int>(type));
}

void check_device(const torch::Tensor& tensor, const comm::Communicator& group, const char* op) {
  if (!tensor.defined()) GZ_THROW(InvalidArgument, op, ": undefined tensor");
  if (tensor.is_sparse()) GZ_THROW(InvalidArgument, op, ": sparse tensors are not supported");
  if (tensor.device().is_cpu()) return;
  if (tensor.device().is_cuda()) {
    if (group.backend() == "nccl") return;
    GZ_THROW(InvalidArgument, op, ": rank ", group.rank(), ": tensor is on ", tensor.device().str(),
             " but the group's backend is '", group.backend(),
             "'; use a group created with backend \"nccl\" for CUDA tensors or move the tensor to CPU");
  }
  GZ_THROW(InvalidArgument, op, ": unsupported device ", tensor.device().str());
}

TensorSpan::TensorSpan(const torch::Tensor& tensor, const comm::Communicator& group, const char* op,
                       bool write_back)
    : orig_(tensor), dtype_(DType::f32), write_back_(write_back) {
  check_device(tensor, group, op);
  dtype_ = to_dtype(tensor.scalar_type(), op);
  work_ = tensor.is_contiguous() ? tensor : tensor.contiguous();
}

void TensorSpan::finish() {
  if (write_back_ && !work_.is_same(orig_)) {
    torch::NoGradGuard no_grad;
    orig_.copy_(work_);
  }
}

torch::Tensor alloc_buffer_tensor(comm::Communicator& group, int64_t numel,
                                  const torch::TensorOptions& options) {
  const size_t bytes =
      static_cast<size_t>(numel) * c10::elementSize(c10::typeMetaToScalarType(options.dtype()));
  auto mem = group.alloc_buffer(bytes);
  return torch::from_blob(
      mem.get(), {numel}, [mem](void*) {}, options.requires_grad(false));
}

bool is_bound_to(const torch::Tensor& grad, const torch::Tensor& view) {
  // A sparse gradient (nn::Embedding with sparse=true) is never bound; LibTorch 2.x throws on its
  // data_ptr() ("Tensor that doesn't have storage") where 1.13 returned null.
  return grad.defined() && grad.layout() == torch::kStrided && grad.data_ptr() == view.data_ptr() &&
         grad.sizes() == view.sizes() && grad.strides() == view.strides();
}

}  // namespace gz
