#include "gz/torch/collectives.h"

#include "gz/core/error.h"
#include "gz/torch/process_group.h"
#include "gz/torch/tensor_adapter.h"

namespace gz {

namespace {
// Synchronous bodies; the async forms run them on the progress thread via submit().
void do_allreduce(comm::Communicator& g, const torch::Tensor& t, comm::ReduceOp op) {
  TensorSpan s(t, g, "allreduce");
  g.allreduce(s.data(), s.count(), s.dtype(), op);
  s.finish();
}

void do_broadcast(comm::Communicator& g, const torch::Tensor& t, int root) {
  TensorSpan s(t, g, "broadcast");
  g.broadcast(s.data(), s.count(), s.dtype(), root);
  s.finish();
}

void do_allgather(comm::Communicator& g, const torch::Tensor& t, const torch::Tensor& out) {
  TensorSpan in(t, g, "allgather", false);
  if (out.numel() != t.numel() * g.size() || out.scalar_type() != t.scalar_type())
    GZ_THROW(InvalidArgument, "allgather: rank ", g.rank(), ": output has ", out.numel(), " elements of ",
             c10::toString(out.scalar_type()), ", expected ", t.numel() * g.size(), " of ",
             c10::toString(t.scalar_type()));
  TensorSpan o(out, g, "allgather");
  g.allgather(in.data(), o.data(), in.count(), in.dtype());
  o.finish();
}

void do_reduce_scatter(comm::Communicator& g, const torch::Tensor& in, const torch::Tensor& out,
                       comm::ReduceOp op) {
  if (in.numel() % g.size() != 0 || out.numel() * g.size() != in.numel() ||
      out.scalar_type() != in.scalar_type())
    GZ_THROW(InvalidArgument, "reduce_scatter: rank ", g.rank(), ": input of ", in.numel(),
             " elements cannot be split into ", g.size(), " blocks of ", out.numel(), " (",
             c10::toString(in.scalar_type()), " -> ", c10::toString(out.scalar_type()), ")");
  TensorSpan i(in, g, "reduce_scatter", false);
  TensorSpan o(out, g, "reduce_scatter");
  g.reduce_scatter(i.data(), o.data(), o.count(), i.dtype(), op);
  o.finish();
}
}  // namespace

void allreduce(const torch::Tensor& tensor, comm::ReduceOp op, const comm::CommPtr& group) {
  do_allreduce(*resolve_group(group), tensor, op);
}

void broadcast(const torch::Tensor& tensor, int root, const comm::CommPtr& group) {
  do_broadcast(*resolve_group(group), tensor, root);
}

std::vector<torch::Tensor> allgather(const torch::Tensor& tensor, const comm::CommPtr& group) {
  auto g = resolve_group(group);
  std::vector<int64_t> shape{g->size()};
  for (auto d : tensor.sizes()) shape.push_back(d);
  auto out = torch::empty(shape, tensor.options());
  do_allgather(*g, tensor, out);
  return out.unbind(0);
}

torch::Tensor allgather_cat(const torch::Tensor& tensor, const comm::CommPtr& group) {
  auto g = resolve_group(group);
  auto t = tensor.dim() == 0 ? tensor.reshape({1}) : tensor;
  check_device(t, *g, "allgather");
  // Exchange dim-0 sizes first so ranks may contribute different numbers of rows.
  int64_t rows = t.size(0);
  std::vector<int64_t> all_rows(g->size());
  g->allgather(&rows, all_rows.data(), 1, DType::i64);
  int64_t row_elems = 1;
  for (int64_t d = 1; d < t.dim(); ++d) row_elems *= t.size(d);
  std::vector<size_t> counts;
  int64_t total_rows = 0;
  for (auto r : all_rows) {
    counts.push_back(static_cast<size_t>(r * row_elems));
    total_rows += r;
  }
  auto shape = t.sizes().vec();
  shape[0] = total_rows;
  auto out = torch::empty(shape, t.options());
  TensorSpan in(t, *g, "allgather", false);
  g->allgatherv(in.data(), out.data_ptr(), counts, in.dtype());
  return out;
}

torch::Tensor reduce_scatter(const torch::Tensor& input, comm::ReduceOp op, const comm::CommPtr& group) {
  auto g = resolve_group(group);
  if (input.dim() == 0 || input.size(0) % g->size() != 0)
    GZ_THROW(InvalidArgument, "reduce_scatter: rank ", g->rank(), ": dim 0 of the input (",
             input.dim() ? input.size(0) : 0, ") is not divisible by the group size ", g->size());
  auto shape = input.sizes().vec();
  shape[0] /= g->size();
  auto out = torch::empty(shape, input.options());
  do_reduce_scatter(*g, input, out, op);
  return out;
}

void barrier(const comm::CommPtr& group) { resolve_group(group)->barrier(); }

comm::WorkPtr allreduce_async(const torch::Tensor& tensor, comm::ReduceOp op, const comm::CommPtr& group) {
  auto g = resolve_group(group);
  check_device(tensor, *g, "allreduce");
  to_dtype(tensor.scalar_type(), "allreduce");
  comm::Communicator* gp = g.get();
  return g->submit([gp, tensor, op] { do_allreduce(*gp, tensor, op); });
}

comm::WorkPtr broadcast_async(const torch::Tensor& tensor, int root, const comm::CommPtr& group) {
  auto g = resolve_group(group);
  check_device(tensor, *g, "broadcast");
  to_dtype(tensor.scalar_type(), "broadcast");
  comm::Communicator* gp = g.get();
  return g->submit([gp, tensor, root] { do_broadcast(*gp, tensor, root); });
}

comm::WorkPtr allgather_async(const torch::Tensor& tensor, const torch::Tensor& out, const comm::CommPtr& group) {
  auto g = resolve_group(group);
  check_device(tensor, *g, "allgather");
  to_dtype(tensor.scalar_type(), "allgather");
  comm::Communicator* gp = g.get();
  return g->submit([gp, tensor, out] { do_allgather(*gp, tensor, out); });
}

comm::WorkPtr reduce_scatter_async(const torch::Tensor& input, const torch::Tensor& out, comm::ReduceOp op,
                                   const comm::CommPtr& group) {
  auto g = resolve_group(group);
  check_device(input, *g, "reduce_scatter");
  to_dtype(input.scalar_type(), "reduce_scatter");
  comm::Communicator* gp = g.get();
  return g->submit([gp, input, out, op] { do_reduce_scatter(*gp, input, out, op); });
}

}  // namespace gz
