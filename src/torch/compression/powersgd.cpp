// PowerSGD: one step of subspace (power) iteration per training step, warm-started from the last
// step's Q, with error feedback (Vogels, Karimireddy, Jaggi: "PowerSGD: Practical Low-Rank Gradient
// Compression for Distributed Optimization", NeurIPS 2019; the layout follows PyTorch's hook).
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <vector>

#include "gz/core/error.h"
#include "gz/torch/compression.h"
#include "gz/torch/tensor_adapter.h"
#include "hook_state.h"

namespace gz {
namespace {
using compression::HookState;
using compression::Slice;

struct PowerSGDState : HookState {
  using HookState::HookState;
  std::unordered_map<uint64_t, torch::Tensor> q;  // per compressed parameter: m x r, the same on every rank
};

// One gradient viewed as a matrix M (n x m) and its factors' places in the two message buffers.
struct Matrix {
  const Slice* slice;
  int64_t n, m, r;
  int64_t p_off, q_off;
};

// Columns of p (n x r) orthonormal, in place (modified Gram-Schmidt). A column that is zero or
// (nearly) in the span of the earlier ones becomes zero: what is left of it after the projections
// is rounding noise pointing anywhere, and normalising that noise would count part of the span
// twice (a gradient of rank < r is then no longer reproduced exactly). Every rank holds the same p
// (all-reduced), so every rank decides alike.
void orthogonalize(const torch::Tensor& p) {
  const int64_t r = p.size(1);
  // Relative size below which a column counts as dependent: well above the dtype's rounding.
  const double tol = p.scalar_type() == torch::kDouble ? 1e-10 : 1e-4;
  std::vector<double> before(static_cast<size_t>(r));
  for (int64_t i = 0; i < r; ++i) before[static_cast<size_t>(i)] = p.narrow(1, i, 1).norm().item<double>();
  for (int64_t i = 0; i < r; ++i) {
    auto col = p.narrow(1, i, 1);
    const double norm = col.norm().item<double>();
    if (std::isfinite(norm) && norm > 1e-30 && norm > tol * before[static_cast<size_t>(i)])
      col.div_(norm);
    else
      col.zero_();
    if (i + 1 < r) {
      auto rest = p.narrow(1, i + 1, r - i - 1);
      rest.sub_(torch::mm(col, torch::mm(col.t(), rest)));
    }
  }
}

// A random start for Q, the same on every rank: seeded by the option's seed and the parameter id.
torch::Tensor random_q(uint64_t seed, uint64_t key, int64_t m, int64_t r, const torch::TensorOptions& opts) {
  auto gen = at::detail::createCPUGenerator(seed * 0x9E3779B97F4A7C15ULL + key + 1);
  return torch::randn({m, r}, gen, torch::TensorOptions().dtype(opts.dtype())).to(opts.device());
}

// The bucket's tensors split into matrices worth compressing at this rank (2+ dimensions, PyTorch's
// rule) and the rest, which travel uncompressed in front of the P factors, in the same all-reduce.
struct PowerSgdLayout {
  std::vector<Matrix> mats;
  std::vector<const Slice*> plain;
  int64_t plain_n = 0, p_n = 0, q_n = 0;
};

PowerSgdLayout layout_of(const PowerSGDState& s, const std::vector<Slice>& slices) {
  PowerSgdLayout l;
  for (const auto& sl : slices) {
    const int64_t n = sl.sizes.size() >= 2 ? sl.sizes[0] : 0;
    const int64_t m = n > 0 ? sl.numel / n : 0;
    const int64_t r = std::min({s.options.powersgd_rank, n, m});
    if (n == 0 || m == 0 ||
        static_cast<double>((n + m) * r) * s.options.powersgd_min_compression_rate >=
            static_cast<double>(n * m)) {
      l.plain.push_back(&sl);
      l.plain_n += sl.numel;
      continue;
    }
    l.mats.push_back({&sl, n, m, r, l.p_n, l.q_n});
    l.p_n += n * r;
    l.q_n += m * r;
  }
  return l;
}

// One bucket's reduction: its buffer (divided by the divisor), the layout, the two messages.
struct Pass {
  PowerSGDState& s;
  comm::Communicator& group;
  torch::Tensor& buf;
  const PowerSgdLayout& l;
  torch::Tensor first;  // [uncompressed | P factors]

  torch::Tensor matrix(const Matrix& mt) const {
    return buf.narrow(0, mt.slice->offset, mt.slice->numel).view({mt.n, mt.m});
  }
  torch::Tensor p_of(const Matrix& mt) const {
    return first.narrow(0, l.plain_n + mt.p_off, mt.n * mt.r).view({mt.n, mt.r});
  }

  // All-reduce the uncompressed tensors and P = M Q (Q warm-started).
  void plain_and_p() {
    first = torch::empty({l.plain_n + l.p_n}, buf.options());
    int64_t off = 0;
    for (const Slice* sl : l.plain) {
      first.narrow(0, off, sl->numel).copy_(buf.narrow(0, sl->offset, sl->numel));
      off += sl->numel;
    }
    for (const auto& mt : l.mats) {
      auto& q = s.q[mt.slice->key];
      // A new parameter, no warm start, or a Q that collapsed (all zero: a zero gradient everywhere;
      // not finite: an overflow): start again from a random Q. Q is the same on every rank.
      bool fresh = !q.defined() || q.size(0) != mt.m || q.size(1) != mt.r || !s.options.powersgd_warm_start;
      if (!fresh) {
        const double qmax = q.abs().max().item<double>();
        fresh = !(qmax > 0 && std::isfinite(qmax));
      }
      if (fresh) q = random_q(s.options.seed, mt.slice->key, mt.m, mt.r, buf.options());
      auto p = p_of(mt);
      torch::mm_out(p, matrix(mt), q);
    }
    group.allreduce(first.data_ptr(), static_cast<size_t>(first.numel()), to_dtype(first.scalar_type()),
                    comm::ReduceOp::sum);
    s.count(first);
    off = 0;
    for (const Slice* sl : l.plain) {
      buf.narrow(0, sl->offset, sl->numel).copy_(first.narrow(0, off, sl->numel));
      off += sl->numel;
    }
  }

  // Orthogonalise P, all-reduce Q = M^T P, and M ~ P Q^T.
  void q_and_product() {
    auto second = torch::empty({l.q_n}, buf.options());  // the Q factors
    for (const auto& mt : l.mats) {
      auto p = p_of(mt);
      orthogonalize(p);
      auto q = second.narrow(0, mt.q_off, mt.m * mt.r).view({mt.m, mt.r});
      torch::mm_out(q, matrix(mt).t(), p);
    }
    group.allreduce(second.data_ptr(), static_cast<size_t>(second.numel()), to_dtype(second.scalar_type()),
                    comm::ReduceOp::sum);
    s.count(second);
    // Inputs were divided by the divisor, so the summed Q is the average's: M ~ P Q^T is the
    // projection of the averaged gradient onto the span of P.
    for (const auto& mt : l.mats) {
      auto q = second.narrow(0, mt.q_off, mt.m * mt.r).view({mt.m, mt.r});
      auto out = matrix(mt);
      torch::mm_out(out, p_of(mt), q.t());
      s.q[mt.slice->key].copy_(q);
    }
  }
};

void powersgd_reduce(PowerSGDState& s, comm::Communicator& group, GradBucket& bucket) {
  torch::NoGradGuard no_grad;
  auto& buf = bucket.buffer;
  if (bucket.divisor != 1) buf.div_(bucket.divisor);
  const auto slices = compression::slices_of(bucket);
  torch::Tensor acc;
  if (s.options.error_feedback) {
    s.residuals.add_to(bucket, slices);
    acc = buf.clone();
  }
  const PowerSgdLayout l = layout_of(s, slices);
  Pass pass{s, group, buf, l, {}};
  pass.plain_and_p();
  if (!l.mats.empty()) pass.q_and_product();
  // As PyTorch's hook, for every tensor: the error is this rank's input minus its share of the
  // common result (inputs are already divided, the result is their sum: its share is 1 / size).
  // Summed over ranks that is the compression error of the sum; the uncompressed tensors' parts
  // (each rank's input minus the mean) cancel in that sum.
  if (s.options.error_feedback) s.residuals.store(slices, acc.sub_(buf / group.size()));
}

}  // namespace

CommHook powersgd_hook(const CompressionOptions& options, std::shared_ptr<CommStats> stats) {
  GZ_CHECK_ARG(options.powersgd_rank >= 1, "powersgd_rank = ", options.powersgd_rank);
  GZ_CHECK_ARG(options.powersgd_min_compression_rate > 0,
               "powersgd_min_compression_rate = ", options.powersgd_min_compression_rate);
  auto state = std::make_shared<PowerSGDState>(options, std::move(stats));
  return [state](comm::Communicator& group, GradBucket& bucket) {
    const bool warming_up = state->begin(bucket);
    if (compression::reduce_rows_uncompressed(group, bucket, *state)) return;
    if (warming_up || !c10::isFloatingType(bucket.buffer.scalar_type()))
      return compression::plain_allreduce(group, bucket, *state);
    powersgd_reduce(*state, group, bucket);
  };
}

}  // namespace gz
