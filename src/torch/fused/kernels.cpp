#include "torch/fused/kernels.h"

#include <cmath>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

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

namespace {
// One output of the 2x2 window (a b / c d): LibTorch's rule, (v > max || isnan(v)) in scan order.
inline void window(float a, float b, float c, float d, float& out, uint8_t& arg) {
  float m = a;
  int k = 0;
  if (b > m || b != b) m = b, k = 1;
  if (c > m || c != c) m = c, k = 2;
  if (d > m || d != d) m = d, k = 3;
  // relu: NaN passes (and carries the gradient), values <= 0 become 0 with no gradient.
  const bool pass = m > 0 || m != m;
  out = pass ? m : 0.0f;
  arg = static_cast<uint8_t>(pass ? k : kPoolNoGrad);
}

void pool_rows_scalar(const float* r0, const float* r1, float* y, uint8_t* arg, size_t ow) {
  for (size_t j = 0; j < ow; ++j) window(r0[2 * j], r0[2 * j + 1], r1[2 * j], r1[2 * j + 1], y[j], arg[j]);
}

void unpool_rows_scalar(const float* gy, const uint8_t* arg, float* r0, float* r1, size_t ow) {
  for (size_t j = 0; j < ow; ++j) {
    const float g = gy[j];
    const uint8_t k = arg[j];
    r0[2 * j] = k == 0 ? g : 0.0f;
    r0[2 * j + 1] = k == 1 ? g : 0.0f;
    r1[2 * j] = k == 2 ? g : 0.0f;
    r1[2 * j + 1] = k == 3 ? g : 0.0f;
  }
}

using PoolRows = void (*)(const float*, const float*, float*, uint8_t*, size_t);
using UnpoolRows = void (*)(const float*, const uint8_t*, float*, float*, size_t);

#if defined(__x86_64__) && defined(__GNUC__)
// The comparisons in a window are coin flips on real activations: a branchy loop (LibTorch's, or
// GCC's code for window() above, which it does not if-convert) pays a misprediction per compare,
// ~25 cycles per output. AVX2 does eight windows with compares and blends, no branches.
#define GZ_AVX2 __attribute__((target("avx2")))

// Even and odd elements of p[0..15], each in order.
GZ_AVX2 inline void deinterleave(const float* p, __m256& even, __m256& odd) {
  const __m256 v0 = _mm256_loadu_ps(p), v1 = _mm256_loadu_ps(p + 8);
  // Within each 128-bit lane: v0's pair then v1's pair; the 64-bit permute restores the order.
  const __m256 e = _mm256_shuffle_ps(v0, v1, _MM_SHUFFLE(2, 0, 2, 0));
  const __m256 o = _mm256_shuffle_ps(v0, v1, _MM_SHUFFLE(3, 1, 3, 1));
  even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), _MM_SHUFFLE(3, 1, 2, 0)));
  odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o), _MM_SHUFFLE(3, 1, 2, 0)));
}

// p[0..15] = e0 o0 e1 o1 ... e7 o7.
GZ_AVX2 inline void interleave(float* p, __m256 e, __m256 o) {
  const __m256 lo = _mm256_unpacklo_ps(e, o), hi = _mm256_unpackhi_ps(e, o);
  _mm256_storeu_ps(p, _mm256_permute2f128_ps(lo, hi, 0x20));
  _mm256_storeu_ps(p + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
}

// Lanes where v > m or v is NaN: LibTorch's max-pool rule, and ReLU's pass test with m = 0.
GZ_AVX2 inline __m256 greater_or_nan(__m256 v, __m256 m) {
  return _mm256_or_ps(_mm256_cmp_ps(v, m, _CMP_GT_OQ), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}

// One scan step of the window: where v wins, the maximum becomes v and its index `kv`.
GZ_AVX2 inline void take_if_greater(__m256 v, __m256i kv, __m256& m, __m256i& k) {
  const __m256 t = greater_or_nan(v, m);
  m = _mm256_blendv_ps(m, v, t);
  k = _mm256_blendv_epi8(k, kv, _mm256_castps_si256(t));
}

GZ_AVX2 void pool_rows_avx2(const float* r0, const float* r1, float* y, uint8_t* arg, size_t ow) {
  const __m256 zero = _mm256_setzero_ps();
  const __m256i k1 = _mm256_set1_epi32(1), k2 = _mm256_set1_epi32(2), k3 = _mm256_set1_epi32(3);
  const __m256i none = _mm256_set1_epi32(kPoolNoGrad);
  size_t j = 0;
  for (; j + 8 <= ow; j += 8) {
    __m256 a, b, c, d;
    deinterleave(r0 + 2 * j, a, b);
    deinterleave(r1 + 2 * j, c, d);
    __m256 m = a;
    __m256i k = _mm256_setzero_si256();
    take_if_greater(b, k1, m, k);
    take_if_greater(c, k2, m, k);
    take_if_greater(d, k3, m, k);
    const __m256 pass = greater_or_nan(m, zero);
    _mm256_storeu_ps(y + j, _mm256_and_ps(m, pass));
    k = _mm256_blendv_epi8(none, k, _mm256_castps_si256(pass));
    // Eight int32 in 0..255 -> eight bytes.
    const __m128i w16 = _mm_packus_epi32(_mm256_castsi256_si128(k), _mm256_extracti128_si256(k, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(arg + j), _mm_packus_epi16(w16, w16));
  }
  if (j < ow) {
    // The last 1..7 windows (all of them when ow < 8, as on 14x14 inputs): through padded copies,
    // not the branchy scalar loop.
    const size_t n = ow - j;
    alignas(32) float a0[16] = {}, a1[16] = {}, yt[8];
    alignas(8) uint8_t at[8];
    std::memcpy(a0, r0 + 2 * j, 2 * n * sizeof(float));
    std::memcpy(a1, r1 + 2 * j, 2 * n * sizeof(float));
    pool_rows_avx2(a0, a1, yt, at, 8);
    std::memcpy(y + j, yt, n * sizeof(float));
    std::memcpy(arg + j, at, n);
  }
}

// g where mask is all ones, else 0.
GZ_AVX2 inline __m256 pick(__m256 g, __m256i mask) { return _mm256_and_ps(g, _mm256_castsi256_ps(mask)); }

GZ_AVX2 void unpool_rows_avx2(const float* gy, const uint8_t* arg, float* r0, float* r1, size_t ow) {
  const __m256i k1 = _mm256_set1_epi32(1), k2 = _mm256_set1_epi32(2), k3 = _mm256_set1_epi32(3);
  size_t j = 0;
  for (; j + 8 <= ow; j += 8) {
    const __m256 g = _mm256_loadu_ps(gy + j);
    const __m256i k = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(arg + j)));
    interleave(r0 + 2 * j, pick(g, _mm256_cmpeq_epi32(k, _mm256_setzero_si256())),
               pick(g, _mm256_cmpeq_epi32(k, k1)));
    interleave(r1 + 2 * j, pick(g, _mm256_cmpeq_epi32(k, k2)), pick(g, _mm256_cmpeq_epi32(k, k3)));
  }
  if (j < ow) {
    const size_t n = ow - j;
    alignas(32) float gt[8] = {}, o0[16], o1[16];
    alignas(8) uint8_t at[8] = {};
    std::memcpy(gt, gy + j, n * sizeof(float));
    std::memcpy(at, arg + j, n);
    unpool_rows_avx2(gt, at, o0, o1, 8);
    std::memcpy(r0 + 2 * j, o0, 2 * n * sizeof(float));
    std::memcpy(r1 + 2 * j, o1, 2 * n * sizeof(float));
  }
}

// Decided on first use, not in a static initialiser: another translation unit's initialiser could
// run first, and __builtin_cpu_supports needs __builtin_cpu_init before main.
bool have_avx2() {
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return yes;
}
PoolRows pool_rows() { return have_avx2() ? pool_rows_avx2 : pool_rows_scalar; }
UnpoolRows unpool_rows() { return have_avx2() ? unpool_rows_avx2 : unpool_rows_scalar; }
#else
PoolRows pool_rows() { return pool_rows_scalar; }
UnpoolRows unpool_rows() { return unpool_rows_scalar; }
#endif

}  // namespace

namespace {
void pool_planes(PoolRows rows, const float* x, float* y, uint8_t* arg, size_t planes, size_t h, size_t w) {
  const size_t oh = h / 2, ow = w / 2;
  for (size_t p = 0; p < planes; ++p) {
    const float* xp = x + p * h * w;
    for (size_t i = 0; i < oh; ++i)
      rows(xp + 2 * i * w, xp + (2 * i + 1) * w, y + (p * oh + i) * ow, arg + (p * oh + i) * ow, ow);
  }
}

void unpool_planes(UnpoolRows rows, const float* gy, const uint8_t* arg, float* gx, size_t planes, size_t h,
                   size_t w) {
  const size_t oh = h / 2, ow = w / 2;
  for (size_t p = 0; p < planes; ++p) {
    float* gp = gx + p * h * w;
    for (size_t i = 0; i < oh; ++i) {
      float* r0 = gp + 2 * i * w;
      float* r1 = r0 + w;
      rows(gy + (p * oh + i) * ow, arg + (p * oh + i) * ow, r0, r1, ow);
      if (w % 2) r0[w - 1] = r1[w - 1] = 0.0f;  // the column the floor dropped
    }
    if (h % 2)
      for (size_t j = 0; j < w; ++j) gp[(h - 1) * w + j] = 0.0f;  // the row the floor dropped
  }
}
}  // namespace

void maxpool2x2_relu_fwd(const float* x, float* y, uint8_t* arg, size_t planes, size_t h, size_t w) {
  pool_planes(pool_rows(), x, y, arg, planes, h, w);
}

void maxpool2x2_relu_bwd(const float* gy, const uint8_t* arg, float* gx, size_t planes, size_t h, size_t w) {
  unpool_planes(unpool_rows(), gy, arg, gx, planes, h, w);
}

void maxpool2x2_relu_fwd_portable(const float* x, float* y, uint8_t* arg, size_t planes, size_t h, size_t w) {
  pool_planes(pool_rows_scalar, x, y, arg, planes, h, w);
}

void maxpool2x2_relu_bwd_portable(const float* gy, const uint8_t* arg, float* gx, size_t planes, size_t h,
                                  size_t w) {
  unpool_planes(unpool_rows_scalar, gy, arg, gx, planes, h, w);
}

bool maxpool_uses_avx2() { return pool_rows() != pool_rows_scalar; }

}  // namespace gz::fused
