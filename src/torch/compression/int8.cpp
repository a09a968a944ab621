// 8-bit min-max quantisation ("ByteGrad"): per chunk a min, a max and one byte per element; the
// quantised buckets are all-gathered and summed exactly by every rank.
#include <algorithm>
#include <cmath>

#include "gz/core/error.h"
#include "gz/torch/compression.h"
#include "hook_state.h"

namespace gz {
namespace {
using compression::HookState;

// Message layout (bytes): [nch x (min, max) as f32][numel x u8], padded to 8 bytes so that every
// rank's header in the all-gathered buffer is aligned for its f32 view.
struct Int8Layout {
  int64_t numel, chunk, nch;
  int64_t header_bytes() const { return nch * 2 * 4; }
  int64_t bytes() const { return (header_bytes() + numel + 7) / 8 * 8; }
};

// Quantise x (f32, flat, CPU) into msg, chunk by chunk: lo = min, hi = max,
// q = round((x - lo) * 255 / (hi - lo)). Plain loops: one pass for the range, one to quantise.
void quantise(const float* x, const Int8Layout& l, uint8_t* msg) {
  auto* header = reinterpret_cast<float*>(msg);
  uint8_t* q = msg + l.header_bytes();
  for (int64_t c = 0; c < l.nch; ++c) {
    const int64_t begin = c * l.chunk, n = std::min(l.chunk, l.numel - begin);
    const float* v = x + begin;
    float lo = v[0], hi = v[0];
    for (int64_t i = 1; i < n; ++i) {
      lo = std::min(lo, v[i]);
      hi = std::max(hi, v[i]);
    }
    header[2 * c] = lo;
    header[2 * c + 1] = hi;
    // A constant chunk (range 0) sends zeros: dequantised as lo. So does a range so small that
    // 255 / range overflows (denormals), whose error is below any float anyway.
    float inv = hi > lo ? 255.0f / (hi - lo) : 0.0f;
    if (!std::isfinite(inv)) inv = 0.0f;
    uint8_t* out = q + begin;
    for (int64_t i = 0; i < n; ++i) {
      const float f = (v[i] - lo) * inv + 0.5f;  // >= 0.5 unless NaN: truncation rounds
      out[i] = static_cast<uint8_t>(f > 0.0f ? std::min(f, 255.0f) : 0.0f);  // NaN (a NaN input) -> 0
    }
  }
}

// out (f32, flat, CPU) += dequantised msg: lo + q * ((hi - lo) / 255). The same arithmetic on every
// rank, so every rank gets the same sum.
void add_dequantised(const uint8_t* msg, const Int8Layout& l, float* out) {
  const auto* header = reinterpret_cast<const float*>(msg);
  const uint8_t* q = msg + l.header_bytes();
  for (int64_t c = 0; c < l.nch; ++c) {
    const int64_t begin = c * l.chunk, n = std::min(l.chunk, l.numel - begin);
    const float lo = header[2 * c], step = (header[2 * c + 1] - lo) / 255.0f;
    float* o = out + begin;
    const uint8_t* qc = q + begin;
    for (int64_t i = 0; i < n; ++i) o[i] += lo + static_cast<float>(qc[i]) * step;
  }
}

void int8_reduce(HookState& s, comm::Communicator& group, GradBucket& bucket) {
  torch::NoGradGuard no_grad;
  auto& buf = bucket.buffer;
  if (bucket.divisor != 1) buf.div_(bucket.divisor);
  const auto slices = compression::slices_of(bucket);
  if (s.options.error_feedback) s.residuals.add_to(bucket, slices);
  // Quantise and sum in f32 on the CPU whatever the gradients' type and device (a no-op for f32
  // CPU buckets).
  auto x = buf.to(torch::kCPU, torch::kFloat).contiguous();
  const Int8Layout l{x.numel(), s.options.int8_chunk,
                     (x.numel() + s.options.int8_chunk - 1) / s.options.int8_chunk};
  const int world = group.size();
  auto recv = torch::empty({world * l.bytes()}, torch::kByte);
  auto* all = recv.data_ptr<uint8_t>();
  uint8_t* mine = all + group.rank() * l.bytes();
  quantise(x.data_ptr<float>(), l, mine);
  if (s.options.error_feedback) {
    // What this rank's bytes stand for; the rest is its quantisation error, kept for next step.
    auto own = torch::zeros_like(x);
    add_dequantised(mine, l, own.data_ptr<float>());
    s.residuals.store(slices, x.sub(own).to(buf.device(), buf.scalar_type()));
  }
  group.allgather(mine, all, static_cast<size_t>(l.bytes()), DType::u8);
  if (s.stats) s.stats->add(static_cast<uint64_t>(l.bytes()));
  // Every rank adds the same messages in the same order: the same result everywhere.
  auto sum = torch::zeros_like(x);
  for (int r = 0; r < world; ++r) add_dequantised(all + r * l.bytes(), l, sum.data_ptr<float>());
  buf.copy_(sum);
}

}  // namespace

CommHook int8_hook(const CompressionOptions& options, std::shared_ptr<CommStats> stats) {
  GZ_CHECK_ARG(options.int8_chunk >= 1, "int8_chunk = ", options.int8_chunk);
  auto state = std::make_shared<HookState>(options, std::move(stats));
  return [state](comm::Communicator& group, GradBucket& bucket) {
    const bool warming_up = state->begin(bucket);
    if (compression::reduce_rows_uncompressed(group, bucket, *state)) return;
    if (warming_up || !c10::isFloatingType(bucket.buffer.scalar_type()))
      return compression::plain_allreduce(group, bucket, *state);
    int8_reduce(*state, group, bucket);
  };
}

}  // namespace gz
