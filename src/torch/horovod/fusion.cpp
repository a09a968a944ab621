#include "torch/horovod/fusion.h"

#include <algorithm>

#include "gz/core/error.h"
#include "gz/torch/compression.h"
#include "gz/torch/tensor_adapter.h"

namespace gz::horovod {

namespace {
// Gradients at least this big are all-reduced where they are: packing them would cost two copies
// of the tensor and save only one collective's fixed cost (Horovod, too, skips the fusion buffer
// for a lone tensor).
constexpr int64_t kInPlaceBytes = int64_t(1) << 20;

c10::ScalarType wire_type(Compression c, c10::ScalarType grad) {
  if (!c10::isFloatingType(grad)) return grad;
  switch (c) {
    case Compression::fp16:
      return c10::ScalarType::Half;
    case Compression::bf16:
      return c10::ScalarType::BFloat16;
    default:
      return grad;
  }
}

CommHook hook_of(const DistributedOptimizerOptions& o) {
  if (o.comm_hook) return o.comm_hook;
  if (o.compression != Compression::powersgd && o.compression != Compression::int8 &&
      o.compression != Compression::topk)
    return nullptr;
  CompressionOptions co = o.compression_options;
  co.method = o.compression;
  return make_comm_hook(co, o.stats);
}
}  // namespace

bool Fusion::reduced_in_place(Compression c, c10::ScalarType type, int64_t bytes) {
  return wire_type(c, type) == type && bytes >= kInPlaceBytes;
}

Fusion::Fusion(comm::CommPtr group, const std::vector<torch::Tensor>& params,
               const std::vector<std::string>& names, const DistributedOptimizerOptions& options)
    : group_(std::move(group)),
      params_(params),
      names_(names),
      compression_(options.compression),
      hook_(hook_of(options)),
      stats_(options.stats),
      row_options_(options.row_sparse),
      row_sparse_(params.size(), 0),
      row_state_(params.size()) {
  // One fusion buffer for the whole run, big enough for the largest tensor that may pass through
  // it. CPU gradients live contiguous in the arena, so those reduced_in_place() never do and need
  // no room here (for bert-small that is 5 MB of buffer instead of 64 MiB, in /dev/shm on every
  // rank).
  size_t largest = 0, total = 0;
  for (const auto& p : params_) {
    const int64_t b = p.numel() * static_cast<int64_t>(p.element_size());
    if (p.is_cpu() && reduced_in_place(compression_, p.scalar_type(), b)) continue;
    largest = std::max(largest, static_cast<size_t>(b));
    total += static_cast<size_t>(b);
  }
  const size_t bytes = std::min(std::max(options.fusion_bytes, largest), std::max<size_t>(total, 8));
  // Memory the group can all-reduce in place (shm: mapped by every rank), so a fused all-reduce
  // costs no staging copies. Same size on every rank: the same named parameters everywhere.
  fusion_ = alloc_buffer_tensor(*group_, static_cast<int64_t>(bytes), torch::kUInt8);
}

size_t Fusion::dense_bytes(size_t i) const {
  if (row_sparse_[i]) return 0;
  return static_cast<size_t>(params_[i].numel() * params_[i].element_size());
}

void Fusion::average(const torch::Tensor& t, c10::ScalarType grad_type) {
  const auto wtype = t.scalar_type();
  const auto count = static_cast<size_t>(t.numel());
  const double world = group_->size();
  if (stats_) stats_->add(static_cast<uint64_t>(t.numel() * t.element_size()));
  if (!c10::isFloatingType(wtype)) {
    group_->allreduce(t.data_ptr(), count, to_dtype(wtype), comm::ReduceOp::sum);
    t.div_(world, "trunc");
  } else if (wtype != grad_type) {
    // Compressed: divide first, which keeps the sum inside the narrow wire type's range.
    t.div_(world);
    group_->allreduce(t.data_ptr(), count, to_dtype(wtype), comm::ReduceOp::sum);
  } else {
    // The backend's avg divides inside the reduction: one pass over the buffer fewer.
    group_->allreduce(t.data_ptr(), count, to_dtype(wtype), comm::ReduceOp::avg);
  }
}

void Fusion::run_hook(const torch::Tensor& flat, std::vector<torch::Tensor> gradients,
                      std::vector<size_t> ids) {
  GradBucket b;
  b.index = hook_bucket_++;
  b.buffer = flat;
  b.divisor = group_->size();
  b.gradients = std::move(gradients);
  b.param_ids = std::move(ids);
  hook_(*group_, b);
}

bool Fusion::in_place(const torch::Tensor& g) const {
  return g.is_contiguous() &&
         reduced_in_place(compression_, g.scalar_type(), g.numel() * static_cast<int64_t>(g.element_size()));
}

void Fusion::reduce(const std::vector<size_t>& idx) {
  const auto start = Clock::now();
  const double cpu0 = timeline_ ? Timeline::thread_cpu_us() : 0;
  struct Record {  // one span per call, recorded however it leaves
    const Fusion* self;
    const std::vector<size_t>& idx;
    Clock::time_point start;
    double cpu0;
    ~Record() {
      if (!self->timeline_) return;
      int64_t bytes = 0;
      for (size_t i : idx) bytes += self->params_[i].numel() * self->params_[i].element_size();
      self->timeline_->span("comm", "group of " + std::to_string(idx.size()), start, Clock::now(),
                            "\"bytes\":" + std::to_string(bytes) +
                                ",\"cpu_us\":" + std::to_string(Timeline::thread_cpu_us() - cpu0));
    }
  } record{this, idx, start, cpu0};
  torch::NoGradGuard no_grad;
  size_t k = 0;
  while (k < idx.size()) {
    const size_t i = idx[k];
    const auto& g = params_[i].grad();
    if (row_sparse_[i]) {  // rows on the wire, full precision (they are few)
      allreduce_row_sparse(*group_, g, group_->size(), row_state_[i], row_options_);
      ++k;
    } else if (in_place(g)) {
      if (hook_)
        run_hook(g.view({-1}), {g}, {i});
      else
        average(g, g.scalar_type());
      ++k;
    } else {
      k = reduce_packed(idx, k);
    }
  }
}

size_t Fusion::reduce_packed(const std::vector<size_t>& idx, size_t k) {
  // One fused collective per run of same-dtype tensors that fits the fusion buffer.
  const auto gtype = params_[idx[k]].grad().scalar_type();
  const auto wtype = wire_type(compression_, gtype);
  const int64_t cap = fusion_.numel() / static_cast<int64_t>(c10::elementSize(wtype));
  auto buf = torch::from_blob(fusion_.data_ptr(), {cap}, torch::TensorOptions().dtype(wtype));
  const size_t start = k;
  int64_t off = 0;
  std::vector<torch::Tensor> views;
  for (; k < idx.size(); ++k) {
    const auto& g = params_[idx[k]].grad();
    if (g.scalar_type() != gtype || off + g.numel() > cap || row_sparse_[idx[k]]) break;
    if (k > start && in_place(g)) break;
    views.push_back(buf.narrow(0, off, g.numel()).view(g.sizes()));
    views.back().copy_(g);
    off += g.numel();
  }
  // The buffer holds every tensor that can come here (see the constructor); fail, never spin.
  if (k == start)
    GZ_THROW(Error, "DistributedOptimizer: gradient of '", names_[idx[k]], "' (",
             params_[idx[k]].grad().numel() * c10::elementSize(wtype),
             " bytes on the wire) does not fit the ", fusion_.numel(), "-byte fusion buffer");
  if (hook_)
    run_hook(buf.narrow(0, 0, off), views, std::vector<size_t>(idx.begin() + start, idx.begin() + k));
  else
    average(buf.narrow(0, 0, off), gtype);
  for (size_t j = start; j < k; ++j) params_[idx[j]].mutable_grad().copy_(views[j - start]);
  return k;
}

void Fusion::decide_row_sparse() {
  // Every gradient is averaged, the same on every rank; rank 0's choice is broadcast anyway so no
  // rank can take the other path (the collectives differ). Read by later loops and, after
  // synchronize(), by the training thread.
  decided_ = true;
  if (!row_options_.enabled) return;
  std::vector<uint8_t> flags(params_.size(), 0);
  if (group_->rank() == 0)
    for (size_t i = 0; i < params_.size(); ++i)
      flags[i] = is_row_sparse_candidate(params_[i].grad(), row_options_) ? 1 : 0;
  if (group_->size() > 1) group_->broadcast(flags.data(), flags.size(), DType::u8, 0);
  row_sparse_ = std::move(flags);
}

}  // namespace gz::horovod
