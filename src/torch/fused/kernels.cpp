#include "torch/fused/kernels.h"

#include <cmath>

// Both loops are memory- or integer-bound and auto-vectorise; AVX2 doubles the width and adds the
// 32-bit multiply the hash needs. target_clones picks the variant once, at load time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define GZ_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define GZ_CLONES
#endif

namespace gz::fused {
namespace {

// Two keyed rounds of a 32-bit avalanche mix (xor-shift-multiply). Each round is a bijection, so
// for fixed keys the element index maps to distinct, well-mixed words.
inline uint32_t mix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x7feb352du;
  h ^= h >> 15;
  h *= 0x846ca68bu;
  h ^= h >> 16;
  return h;
}

inline uint32_t hash_index(uint32_t lo, uint32_t k0, uint32_t k1) {
  return mix32(mix32(lo * 0x9E3779B1u + k0) ^ k1);
}

// Keys for one 2^32-element block: the block number is folded into the seed.
inline void keys(uint64_t seed, uint64_t block, uint32_t& k0, uint32_t& k1) {
  uint64_t s = seed ^ (block * 0xD1B54A32D192ED03ull);
  k0 = mix32(static_cast<uint32_t>(s));
  k1 = mix32(static_cast<uint32_t>(s >> 32) ^ 0x5bd1e995u);
}

GZ_CLONES void dropout_block(const float* __restrict in, float* __restrict out, size_t n, uint32_t lo,
                             uint32_t k0, uint32_t k1, uint32_t threshold, float scale) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t h = hash_index(lo + static_cast<uint32_t>(i), k0, k1) >> 8;
    // Multiply by 0 or scale (not a select of the product): branch-free, so it vectorises, and
    // NaN/inf inputs propagate the way torch::dropout's input * mask does.
    out[i] = in[i] * (h >= threshold ? scale : 0.0f);
  }
}

}  // namespace

GZ_CLONES void adamw_f32(float* __restrict p, const float* __restrict g, float* __restrict m,
                         float* __restrict v, size_t n, const AdamWScalars& s) {
  const float decay = s.decay, b1 = s.beta1, b2 = s.beta2, c1 = s.one_minus_beta1, c2 = s.one_minus_beta2;
  const float sbc2 = s.sqrt_bias_correction2, eps = s.eps, step = s.neg_step_size;
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float mi = m[i] * b1 + c1 * gi;
    const float vi = v[i] * b2 + c2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / sbc2 + eps;
    p[i] = p[i] * decay + step * (mi / denom);
  }
}

void dropout_f32(const float* in, float* out, size_t n, uint64_t first, uint64_t seed, uint32_t threshold,
                 float scale) {
  size_t done = 0;
  while (done < n) {
    const uint64_t index = first + done;
    const uint64_t block = index >> 32;
    const uint32_t lo = static_cast<uint32_t>(index);
    // Stay inside one 2^32 block so the 32-bit counter never wraps within a call.
    const size_t room = static_cast<size_t>((uint64_t(1) << 32) - lo);
    const size_t len = n - done < room ? n - done : room;
    uint32_t k0, k1;
    keys(seed, block, k0, k1);
    dropout_block(in + done, out + done, len, lo, k0, k1, threshold, scale);
    done += len;
  }
}

bool dropout_keep(uint64_t index, uint64_t seed, uint32_t threshold) {
  uint32_t k0, k1;
  keys(seed, index >> 32, k0, k1);
  return (hash_index(static_cast<uint32_t>(index), k0, k1) >> 8) >= threshold;
}

}  // namespace gz::fused
