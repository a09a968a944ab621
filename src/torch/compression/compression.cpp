// Compression names, the hook factory, and the pieces every compressing hook shares.
#include "gz/torch/compression.h"

#include "gz/core/error.h"
#include "gz/torch/tensor_adapter.h"
#include "hook_state.h"

namespace gz {

const char* to_string(Compression c) {
  switch (c) {
    case Compression::none:
      return "none";
    case Compression::fp16:
      return "fp16";
    case Compression::bf16:
      return "bf16";
    case Compression::powersgd:
      return "powersgd";
    case Compression::int8:
      return "int8";
    case Compression::topk:
      return "topk";
  }
  return "?";
}

Compression parse_compression(const std::string& name) {
  for (auto c : {Compression::none, Compression::fp16, Compression::bf16, Compression::powersgd,
                 Compression::int8, Compression::topk})
    if (name == to_string(c)) return c;
  GZ_THROW(InvalidArgument, "unknown compression '", name, "' (known: none fp16 bf16 powersgd int8 topk)");
}

CommHook make_comm_hook(const CompressionOptions& options, std::shared_ptr<CommStats> stats) {
  switch (options.method) {
    case Compression::none:
      return allreduce_hook(std::move(stats));
    case Compression::fp16:
      return fp16_compress_hook(std::move(stats));
    case Compression::bf16:
      return bf16_compress_hook(std::move(stats));
    case Compression::powersgd:
      return powersgd_hook(options, std::move(stats));
    case Compression::int8:
      return int8_hook(options, std::move(stats));
    case Compression::topk:
      return topk_hook(options, std::move(stats));
  }
  GZ_THROW(InvalidArgument, "make_comm_hook: bad compression method");
}

namespace compression {

std::vector<Slice> slices_of(const GradBucket& bucket) {
  const auto& buf = bucket.buffer;
  std::vector<Slice> out;
  if (bucket.gradients.empty()) {
    // A bucket from a custom caller: one tensor, keyed apart from every parameter id.
    out.push_back({(uint64_t(1) << 63) | bucket.index, 0, buf.numel(), buf.sizes()});
    return out;
  }
  GZ_CHECK_ARG(bucket.param_ids.size() == bucket.gradients.size(), "GradBucket: ", bucket.param_ids.size(),
               " param_ids for ", bucket.gradients.size(), " gradients");
  int64_t off = 0;
  for (size_t i = 0; i < bucket.gradients.size(); ++i) {
    const auto& g = bucket.gradients[i];
    out.push_back({bucket.param_ids[i], off, g.numel(), g.sizes()});
    off += g.numel();
  }
  GZ_CHECK_ARG(off == buf.numel(), "GradBucket: gradients hold ", off, " elements, the buffer ", buf.numel());
  return out;
}

void Residuals::add_to(const GradBucket& bucket, const std::vector<Slice>& slices) {
  for (const auto& s : slices) {
    auto part = bucket.buffer.narrow(0, s.offset, s.numel);
    auto it = res_.find(s.key);
    if (it == res_.end() || it->second.numel() != s.numel || it->second.scalar_type() != part.scalar_type()) {
      res_[s.key] = torch::zeros({s.numel}, part.options());
      continue;
    }
    part.add_(it->second);
  }
}

void Residuals::store(const std::vector<Slice>& slices, const torch::Tensor& error) {
  for (const auto& s : slices) {
    auto& r = res_[s.key];
    auto part = error.narrow(0, s.offset, s.numel);
    if (!r.defined() || r.numel() != s.numel || r.scalar_type() != part.scalar_type())
      r = part.clone();
    else
      r.copy_(part);
  }
}

void plain_allreduce(comm::Communicator& group, GradBucket& bucket, HookState& state) {
  auto& buf = bucket.buffer;
  if (bucket.divisor != 1) buf.div_(bucket.divisor);
  group.allreduce(buf.data_ptr(), static_cast<size_t>(buf.numel()), to_dtype(buf.scalar_type()),
                  comm::ReduceOp::sum);
  state.count(buf);
}

bool reduce_rows_uncompressed(comm::Communicator& group, GradBucket& bucket, HookState& state) {
  if (!reduce_rows(group, bucket)) return false;
  if (state.stats) state.stats->add(rows_wire_bytes(bucket));
  return true;
}

}  // namespace compression
}  // namespace gz
