// Top-k sparsification with error feedback: the k largest |values| of a bucket and their indices,
// all-gathered; what was not sent waits in the residual for the next step.
#include <algorithm>
#include <cmath>

#include "gz/core/error.h"
#include "gz/torch/compression.h"
#include "hook_state.h"

namespace gz {
namespace {
using compression::HookState;

// Message layout (bytes): [k x int32 index][pad to 8][k x value in the gradients' type], padded to
// 8 bytes so every rank's part of the all-gathered buffer is aligned for both views.
struct TopkLayout {
  int64_t k, value_size;
  int64_t values_offset() const { return (k * 4 + 7) / 8 * 8; }
  int64_t bytes() const { return (values_offset() + k * value_size + 7) / 8 * 8; }
  torch::Tensor indices(const torch::Tensor& msg) const { return msg.narrow(0, 0, k * 4).view(torch::kInt); }
  torch::Tensor values(const torch::Tensor& msg, c10::ScalarType t) const {
    return msg.narrow(0, values_offset(), k * value_size).view(t);
  }
};

void topk_reduce(HookState& s, comm::Communicator& group, GradBucket& bucket) {
  torch::NoGradGuard no_grad;
  auto& buf = bucket.buffer;
  if (bucket.divisor != 1) buf.div_(bucket.divisor);
  const auto slices = compression::slices_of(bucket);
  if (s.options.error_feedback) s.residuals.add_to(bucket, slices);
  const int64_t n = buf.numel();
  GZ_CHECK_ARG(n < (int64_t(1) << 31), "topk: a bucket of ", n, " elements does not fit int32 indices");
  // k depends on the bucket's size only, so every rank sends the same amount.
  const int64_t k = std::clamp<int64_t>(
      static_cast<int64_t>(std::ceil(s.options.topk_ratio * static_cast<double>(n))), 1, n);
  const auto type = buf.scalar_type();
  const TopkLayout l{k, static_cast<int64_t>(c10::elementSize(type))};
  const int world = group.size();
  auto recv = torch::zeros({world * l.bytes()}, torch::kByte);
  auto mine = recv.narrow(0, group.rank() * l.bytes(), l.bytes());
  auto idx = std::get<1>(buf.abs().topk(k, 0, /*largest=*/true, /*sorted=*/false));
  l.indices(mine).copy_(idx);
  l.values(mine, type).copy_(buf.index_select(0, idx));
  group.allgather(mine.data_ptr(), recv.data_ptr(), static_cast<size_t>(l.bytes()), DType::u8);
  s.count(mine);
  // Error feedback: everything but the sent coordinates stays with this rank.
  if (s.options.error_feedback) s.residuals.store(slices, buf.index_fill(0, idx, 0));
  // Every rank adds the same pairs in the same order: the same result everywhere.
  buf.zero_();
  for (int r = 0; r < world; ++r) {
    auto part = recv.narrow(0, r * l.bytes(), l.bytes());
    buf.index_add_(0, l.indices(part).to(torch::kLong), l.values(part, type));
  }
}

}  // namespace

CommHook topk_hook(const CompressionOptions& options, std::shared_ptr<CommStats> stats) {
  GZ_CHECK_ARG(options.topk_ratio > 0 && options.topk_ratio <= 1, "topk_ratio = ", options.topk_ratio);
  auto state = std::make_shared<HookState>(options, std::move(stats));
  return [state](comm::Communicator& group, GradBucket& bucket) {
    const bool warming_up = state->begin(bucket);
    if (compression::reduce_rows_uncompressed(group, bucket, *state)) return;
    if (warming_up || !c10::isFloatingType(bucket.buffer.scalar_type()))
      return compression::plain_allreduce(group, bucket, *state);
    topk_reduce(*state, group, bucket);
  };
}

}  // namespace gz
