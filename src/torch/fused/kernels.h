// Kernels behind FusedAdamW, fused_dropout and max_pool2d_relu: plain C++ (no LibTorch), one pass over
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

/// @brief Window index marking an output that ReLU zeroed (no gradient flows back).
constexpr uint8_t kPoolNoGrad = 0xff;

/// @brief relu(max_pool2d(x, 2)) on `planes` contiguous h x w planes: y is (h/2) x (w/2) per plane
/// (floor, like LibTorch). `arg` receives, per output, the winner's position in its 2x2 window
/// (0..3, row-major) or kPoolNoGrad when the max was <= 0. The max is the first strict maximum in
/// row-major order, and NaN wins, as in LibTorch's max_pool2d.
void maxpool2x2_relu_fwd(const float* x, float* y, uint8_t* arg, size_t planes, size_t h, size_t w);

/// @brief Gradient of maxpool2x2_relu_fwd: writes every element of gx (h x w per plane): gy at each
/// window's winner, 0 elsewhere (including rows and columns the floor dropped).
void maxpool2x2_relu_bwd(const float* gy, const uint8_t* arg, float* gx, size_t planes, size_t h, size_t w);

/// @brief The same two kernels without SIMD (what CPUs without AVX2 run); for tests.
void maxpool2x2_relu_fwd_portable(const float* x, float* y, uint8_t* arg, size_t planes, size_t h, size_t w);
void maxpool2x2_relu_bwd_portable(const float* gy, const uint8_t* arg, float* gx, size_t planes, size_t h,
                                  size_t w);
/// @brief Whether maxpool2x2_relu_fwd/bwd run the AVX2 code on this CPU.
bool maxpool_uses_avx2();

}  // namespace gz::fused
