#include "flat_tensors.h"

#include "gz/core/error.h"
#include "gz/torch/tensor_adapter.h"

namespace gz::averaging {

std::vector<torch::Tensor> averaged_tensors(const std::vector<torch::Tensor>& params,
                                            const std::vector<torch::Tensor>& buffers, bool with_buffers) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) {
    if (!c10::isFloatingType(p.scalar_type()))
      GZ_THROW(InvalidArgument, "model averaging: a parameter of type ", p.scalar_type(),
               " cannot be averaged");
    out.push_back(p);
  }
  if (with_buffers)
    for (const auto& b : buffers)
      if (b.defined() && c10::isFloatingType(b.scalar_type())) out.push_back(b);
  return out;
}

FlatTensors::FlatTensors(std::vector<torch::Tensor> tensors, comm::Communicator& group) {
  // One flat buffer per (dtype, device), in first-seen order: the same on every rank.
  std::vector<std::pair<c10::ScalarType, c10::Device>> keys;
  std::vector<int64_t> sizes;
  for (auto& t : tensors) {
    check_device(t, group, "model averaging");
    std::pair<c10::ScalarType, c10::Device> key{t.scalar_type(), t.device()};
    size_t k = 0;
    while (k < keys.size() && keys[k] != key) ++k;
    if (k == keys.size()) {
      keys.push_back(key);
      sizes.push_back(0);
    }
    entries_.push_back({t, k, sizes[k]});
    sizes[k] += t.numel();
  }
  for (size_t k = 0; k < keys.size(); ++k) {
    auto opts = torch::TensorOptions().dtype(keys[k].first).device(keys[k].second);
    // CPU: memory the group all-reduces in place (shm maps it into every rank).
    flats_.push_back(keys[k].second.is_cpu() ? alloc_buffer_tensor(group, sizes[k], opts)
                                             : torch::zeros({sizes[k]}, opts));
  }
}

void FlatTensors::pack() {
  torch::NoGradGuard no_grad;
  for (auto& e : entries_)
    flats_[e.flat].narrow(0, e.offset, e.tensor.numel()).view_as(e.tensor).copy_(e.tensor);
}

void FlatTensors::unpack() {
  torch::NoGradGuard no_grad;
  for (auto& e : entries_)
    e.tensor.copy_(flats_[e.flat].narrow(0, e.offset, e.tensor.numel()).view_as(e.tensor));
}

void FlatTensors::add_to_tensors() {
  torch::NoGradGuard no_grad;
  for (auto& e : entries_)
    e.tensor.add_(flats_[e.flat].narrow(0, e.offset, e.tensor.numel()).view_as(e.tensor));
}

void FlatTensors::allreduce_avg(comm::Communicator& group, CommStats* stats) {
  for (auto& f : flats_) {
    group.allreduce(f.data_ptr(), static_cast<size_t>(f.numel()), to_dtype(f.scalar_type()),
                    comm::ReduceOp::avg);
    if (stats) stats->add(static_cast<uint64_t>(f.numel() * f.element_size()));
  }
}

}  // namespace gz::averaging
