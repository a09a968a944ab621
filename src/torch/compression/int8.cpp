// 8-bit min-max quantisation ("ByteGrad"): per chunk a min, a max and one byte per element; the
// quantised buckets are all-gathered and summed exactly by every rank.
#include <algorithm>

#include "gz/core/error.h"
#include "gz/torch/compression.h"
#include "hook_state.h"

namespace gz {
namespace {
using compression::HookState;

// Message layout (bytes): [nch x (min, max) as f32][numel x u8], padded to 8 bytes so that every
// rank's header in the all-gathered buffer is aligned for its f32 view.
struct Layout {
  int64_t numel, chunk, nch;
  int64_t header_bytes() const { return nch * 2 * 4; }
  int64_t bytes() const { return (header_bytes() + numel + 7) / 8 * 8; }
};

// Quantise x (f32, flat) into msg. Per chunk: lo = min, hi = max, q = round((x - lo) * 255 / (hi - lo)).
void quantise(const torch::Tensor& x, const Layout& l, const torch::Tensor& msg) {
  auto header = msg.narrow(0, 0, l.header_bytes()).view(torch::kFloat).view({l.nch, 2});
  auto q = msg.narrow(0, l.header_bytes(), l.numel);
  const int64_t full = l.numel / l.chunk, tail = l.numel - full * l.chunk;
  auto one = [](const torch::Tensor& v, const torch::Tensor& hdr, const torch::Tensor& out) {
    // v: [rows, cols]; hdr: [rows, 2]; out: [rows, cols] bytes.
    auto lo = std::get<0>(v.min(1, true)), hi = std::get<0>(v.max(1, true));
    hdr.narrow(1, 0, 1).copy_(lo);
    hdr.narrow(1, 1, 1).copy_(hi);
    auto range = hi - lo;
    // A constant chunk (range 0) sends zeros: dequantised as lo.
    auto inv = torch::where(range > 0, 255.0 / range, torch::zeros_like(range));
    out.copy_((v - lo).mul_(inv).round_().clamp_(0, 255).to(torch::kByte));
  };
  if (full > 0)
    one(x.narrow(0, 0, full * l.chunk).view({full, l.chunk}), header.narrow(0, 0, full),
        q.narrow(0, 0, full * l.chunk).view({full, l.chunk}));
  if (tail > 0)
    one(x.narrow(0, full * l.chunk, tail).view({1, tail}), header.narrow(0, full, 1),
        q.narrow(0, full * l.chunk, tail).view({1, tail}));
}

// out (f32, flat) += dequantised msg: lo + q * ((hi - lo) / 255).
void add_dequantised(const torch::Tensor& msg, const Layout& l, const torch::Tensor& out) {
  auto header = msg.narrow(0, 0, l.header_bytes()).view(torch::kFloat).view({l.nch, 2});
  auto q = msg.narrow(0, l.header_bytes(), l.numel);
  const int64_t full = l.numel / l.chunk, tail = l.numel - full * l.chunk;
  auto one = [](const torch::Tensor& qv, const torch::Tensor& hdr, const torch::Tensor& o) {
    auto lo = hdr.narrow(1, 0, 1), hi = hdr.narrow(1, 1, 1);
    auto step = (hi - lo).div_(255.0);
    o.add_(qv.to(torch::kFloat).mul_(step).add_(lo));
  };
  if (full > 0)
    one(q.narrow(0, 0, full * l.chunk).view({full, l.chunk}), header.narrow(0, 0, full),
        out.narrow(0, 0, full * l.chunk).view({full, l.chunk}));
  if (tail > 0)
    one(q.narrow(0, full * l.chunk, tail).view({1, tail}), header.narrow(0, full, 1),
        out.narrow(0, full * l.chunk, tail).view({1, tail}));
}

void reduce(HookState& s, comm::Communicator& group, GradBucket& bucket) {
  torch::NoGradGuard no_grad;
  auto& buf = bucket.buffer;
  if (bucket.divisor != 1) buf.div_(bucket.divisor);
  const auto slices = compression::slices_of(bucket);
  if (s.options.error_feedback) s.residuals.add_to(bucket, slices);
  // Quantise and sum in f32 whatever the gradients' type.
  auto x = buf.to(torch::kFloat).contiguous();
  const Layout l{x.numel(), s.options.int8_chunk, (x.numel() + s.options.int8_chunk - 1) / s.options.int8_chunk};
  const int world = group.size();
  auto recv = torch::empty({world * l.bytes()}, torch::kByte);
  auto mine = recv.narrow(0, group.rank() * l.bytes(), l.bytes());
  quantise(x, l, mine);
  if (s.options.error_feedback) {
    // What this rank's bytes stand for; the rest is its quantisation error, kept for next step.
    auto own = torch::zeros_like(x);
    add_dequantised(mine, l, own);
    s.residuals.store(slices, x.sub(own).to(buf.scalar_type()));
  }
  group.allgather(mine.data_ptr(), recv.data_ptr(), static_cast<size_t>(l.bytes()), DType::u8);
  s.count(mine);
  // Every rank adds the same messages in the same order: the same result everywhere.
  auto sum = torch::zeros_like(x);
  for (int r = 0; r < world; ++r) add_dequantised(recv.narrow(0, r * l.bytes(), l.bytes()), l, sum);
  buf.copy_(sum);
}

}  // namespace

CommHook int8_hook(const CompressionOptions& options, std::shared_ptr<CommStats> stats) {
  GZ_CHECK_ARG(options.int8_chunk >= 1, "int8_chunk = ", options.int8_chunk);
  auto state = std::make_shared<HookState>(options, std::move(stats));
  return [state](comm::Communicator& group, GradBucket& bucket) {
    if (state->begin(bucket) || !c10::isFloatingType(bucket.buffer.scalar_type()))
      return compression::plain_allreduce(group, bucket, *state);
    reduce(*state, group, bucket);
  };
}

}  // namespace gz
