// Element-wise kernels behind FusedAdamW and fused_dropout: plain C++ (no LibTorch), one pass over
// memory each, compiled for AVX2 with a baseline fallback chosen at load time.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gz::fused {

/// @brief Scalars of one AdamW step, already in the form the per-element update uses.
struct AdamWScalars {
  float decay = 1;     ///< 1 - lr * weight_decay
  float beta1 = 0.9f;  ///< exp_avg keeps beta1, adds (1 - beta1) * g
  float beta2 = 0.999f;
  float one_minus_beta1 = 0.1f;
  float one_minus_beta2 = 0.001f;
  float sqrt_bias_correction2 = 1;  ///< sqrt(1 - beta2^step)
  float eps = 1e-8f;
  float neg_step_size = 0;  ///< -lr / (1 - beta1^step)
};

/// @brief One AdamW step on n float32 elements, in the order of LibTorch's AdamW:
/// p *= decay; m = m*b1 + (1-b1)*g; v = v*b2 + (1-b2)*g*g; p += -step * m / (sqrt(v)/sqrt(bc2) + eps).
void adamw_f32(float* p, const float* g, float* m, float* v, size_t n, const AdamWScalars& s);

/// @brief out[i] = keep(seed, first + i) ? in[i] * scale : 0, where keep is a counter-based hash of
/// (seed, element index) compared with `threshold` (drop when the hash's top 24 bits < threshold).
/// The same (seed, first) gives the same mask, so backward recomputes it instead of storing it.
/// `in` and `out` must not overlap.
void dropout_f32(const float* in, float* out, size_t n, uint64_t first, uint64_t seed, uint32_t threshold,
                 float scale);

/// @brief The mask bit of element `index` (for tests): true when kept.
bool dropout_keep(uint64_t index, uint64_t seed, uint32_t threshold);

}  // namespace gz::fused
