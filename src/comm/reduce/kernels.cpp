// Reduction kernels: blocks of the accumulator type stay in L1 while every source is folded in,
// so each source and the destination stream through memory once. f16 uses F16C when the CPU has
// it (checked once at run time), bf16 is bit manipulation the compiler vectorises.
#include "comm/reduce/reduce.h"

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define GZ_REDUCE_X86 1
#endif

#include "gz/core/error.h"

namespace gz::comm::reduce {
namespace {

constexpr size_t kBlock = 512;  // elements per accumulator block (2 KiB of f32)

// ---- codecs: storage type <-> accumulator type, a block at a time ----

struct BF16 {
  using Storage = uint16_t;
  using Acc = float;
  static void load(float* a, const uint16_t* s, size_t m) {
    for (size_t i = 0; i < m; ++i) {
      uint32_t u = static_cast<uint32_t>(s[i]) << 16;
      std::memcpy(&a[i], &u, 4);
    }
  }
  template <typename Fn>
  static void fold(float* a, const uint16_t* s, size_t m, Fn fn) {
    float t[kBlock];
    load(t, s, m);
    for (size_t i = 0; i < m; ++i) a[i] = fn(a[i], t[i]);
  }
  static void store(uint16_t* d, const float* a, size_t m) {
    for (size_t i = 0; i < m; ++i) {
      uint32_t u;
      std::memcpy(&u, &a[i], 4);
      // Round to nearest even, keep NaNs quiet (same rule as gz::float_to_bf16).
      uint32_t r = (u + 0x7fffu + ((u >> 16) & 1)) >> 16;
      uint32_t q = (u >> 16) | 0x40;
      d[i] = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? q : r);
    }
  }
};

#ifdef GZ_REDUCE_X86
__attribute__((target("avx,f16c"))) void f16_load_hw(float* a, const uint16_t* s, size_t m) {
  size_t i = 0;
  for (; i + 8 <= m; i += 8)
    _mm256_storeu_ps(a + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  for (; i < m; ++i) a[i] = half_to_float(s[i]);
}
__attribute__((target("avx,f16c"))) void f16_store_hw(uint16_t* d, const float* a, size_t m) {
  size_t i = 0;
  for (; i + 8 <= m; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(a + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < m; ++i) d[i] = float_to_half(a[i]);
}
// CPUID leaf 1, ECX bit 29. Not __builtin_cpu_supports("f16c"): clang before 15 rejects that name.
bool cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && ((c >> 29) & 1);
}
const bool kHaveF16c = __builtin_cpu_supports("avx") && cpu_has_f16c();
#else
const bool kHaveF16c = false;
#endif

struct F16 {
  using Storage = uint16_t;
  using Acc = float;
  static void load(float* a, const uint16_t* s, size_t m) {
#ifdef GZ_REDUCE_X86
    if (kHaveF16c) return f16_load_hw(a, s, m);
#endif
    for (size_t i = 0; i < m; ++i) a[i] = half_to_float(s[i]);
  }
  template <typename Fn>
  static void fold(float* a, const uint16_t* s, size_t m, Fn fn) {
    float t[kBlock];
    load(t, s, m);
    for (size_t i = 0; i < m; ++i) a[i] = fn(a[i], t[i]);
  }
  static void store(uint16_t* d, const float* a, size_t m) {
#ifdef GZ_REDUCE_X86
    if (kHaveF16c) return f16_store_hw(d, a, m);
#endif
    for (size_t i = 0; i < m; ++i) d[i] = float_to_half(a[i]);
  }
};

// ---- element ops; integers wrap (arithmetic in the unsigned type) ----

template <typename A, bool = std::is_integral_v<A>>
struct Unsigned {
  using type = A;
};
template <typename A>
struct Unsigned<A, true> {
  using type = std::make_unsigned_t<A>;
};

template <typename A>
struct Arith {
  using U = typename Unsigned<A>::type;
  static A add(A a, A b) { return static_cast<A>(static_cast<U>(a) + static_cast<U>(b)); }
  static A mul(A a, A b) { return static_cast<A>(static_cast<U>(a) * static_cast<U>(b)); }
};

// Blocked path for f16/bf16: convert a block to f32, fold every source in, round once.
template <typename C>
void run(void* dst_v, void* dst2_v, const void* const* srcs_v, int n, size_t count, ReduceOp op, int div) {
  using T = typename C::Storage;
  using A = typename C::Acc;
  T* dst = static_cast<T*>(dst_v);
  T* dst2 = static_cast<T*>(dst2_v);
  A acc[kBlock];
  for (size_t off = 0; off < count; off += kBlock) {
    const size_t m = count - off < kBlock ? count - off : kBlock;
    C::load(acc, static_cast<const T*>(srcs_v[0]) + off, m);
    for (int j = 1; j < n; ++j) {
      const T* s = static_cast<const T*>(srcs_v[j]) + off;
      switch (op) {
        case ReduceOp::sum:
        case ReduceOp::avg: C::fold(acc, s, m, [](A a, A b) { return Arith<A>::add(a, b); }); break;
        case ReduceOp::prod: C::fold(acc, s, m, [](A a, A b) { return Arith<A>::mul(a, b); }); break;
        case ReduceOp::min: C::fold(acc, s, m, [](A a, A b) { return b < a ? b : a; }); break;
        case ReduceOp::max: C::fold(acc, s, m, [](A a, A b) { return a < b ? b : a; }); break;
      }
    }
    if (op == ReduceOp::avg) {
      const A d = static_cast<A>(div);
      for (size_t i = 0; i < m; ++i) acc[i] = static_cast<A>(acc[i] / d);
    }
    C::store(dst + off, acc, m);
    if (dst2) C::store(dst2 + off, acc, m);
  }
}

// Native types: one pass, 32-byte vectors (GCC vector extensions). Each vector step loads every
// source before storing, so dst may alias a source exactly. Integer sum/prod run on the unsigned
// type (wrap-around, no signed overflow).
template <typename T, typename Op>
__attribute__((always_inline)) inline void native_loop(T* dst, T* dst2, const T* const* s, int n, size_t count, Op op,
                                                       bool avg, int div) {
  // V reads and writes memory at any alignment; values live in VA (natural alignment), so the ops,
  // which take references, never see an under-aligned vector (clang warns, and may assume 32).
  typedef T V __attribute__((vector_size(32), aligned(1), may_alias));
  typedef T VA __attribute__((vector_size(32)));
  constexpr size_t W = 32 / sizeof(T);
  const T d = static_cast<T>(div);
  size_t i = 0;
  if (n == 2) {
    for (; i + W <= count; i += W) {
      VA v = *reinterpret_cast<const V*>(s[0] + i);
      const VA x = *reinterpret_cast<const V*>(s[1] + i);
      op(v, x);
      if (avg) v = v / d;
      *reinterpret_cast<V*>(dst + i) = v;
      if (dst2) *reinterpret_cast<V*>(dst2 + i) = v;
    }
  } else {
    for (; i + W <= count; i += W) {
      VA v = *reinterpret_cast<const V*>(s[0] + i);
      for (int j = 1; j < n; ++j) {
        const VA x = *reinterpret_cast<const V*>(s[j] + i);
        op(v, x);
      }
      if (avg) v = v / d;
      *reinterpret_cast<V*>(dst + i) = v;
      if (dst2) *reinterpret_cast<V*>(dst2 + i) = v;
    }
  }
  for (; i < count; ++i) {
    T v = s[0][i];
    for (int j = 1; j < n; ++j) op(v, s[j][i]);
    if (avg) v = static_cast<T>(v / d);
    dst[i] = v;
    if (dst2) dst2[i] = v;
  }
}

// In-place element ops (a = a op b) on scalars or vectors; never pass vectors by value.
template <typename T>
struct WrapOps {
  using U = typename Unsigned<T>::type;
  template <typename X>
  static void add(X& a, const X& b) {
    if constexpr (!std::is_integral_v<T>) {
      a = a + b;
    } else if constexpr (std::is_same_v<X, T>) {
      a = static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    } else {
      typedef U VU __attribute__((vector_size(32)));
      const VU x = (VU)a, y = (VU)b;  // value bit-casts (same size), in registers
      a = (X)(x + y);
    }
  }
  template <typename X>
  static void mul(X& a, const X& b) {
    if constexpr (!std::is_integral_v<T>) {
      a = a * b;
    } else if constexpr (std::is_same_v<X, T>) {
      a = static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
    } else {
      typedef U VU __attribute__((vector_size(32)));
      const VU x = (VU)a, y = (VU)b;  // value bit-casts (same size), in registers
      a = (X)(x * y);
    }
  }
};

template <typename T>
__attribute__((always_inline)) inline void run_native(void* dst_v, void* dst2_v, const void* const* srcs_v, int n,
                                                      size_t count, ReduceOp op, int div) {
  T* dst = static_cast<T*>(dst_v);
  T* dst2 = static_cast<T*>(dst2_v);
  const T* s[64];
  std::vector<const T*> big;
  const T** sp = s;
  if (n > 64) {
    big.resize(n);
    sp = big.data();
  }
  for (int j = 0; j < n; ++j) sp[j] = static_cast<const T*>(srcs_v[j]);
  const bool avg = op == ReduceOp::avg;
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return native_loop(dst, dst2, sp, n, count, [](auto& a, const auto& b) { WrapOps<T>::add(a, b); }, avg, div);
    case ReduceOp::prod:
      return native_loop(dst, dst2, sp, n, count, [](auto& a, const auto& b) { WrapOps<T>::mul(a, b); }, false, div);
    case ReduceOp::min:
      return native_loop(dst, dst2, sp, n, count, [](auto& a, const auto& b) { a = b < a ? b : a; }, false, div);
    case ReduceOp::max:
      return native_loop(dst, dst2, sp, n, count, [](auto& a, const auto& b) { a = a < b ? b : a; }, false, div);
  }
}

// Entry points per dtype, compiled for AVX2 and for the baseline; picked once by CPU check
// (plain dispatch rather than ifunc/target_clones, which sanitizer runtimes do not survive).
#if defined(__x86_64__)
#define GZ_NATIVE_ENTRY(NAME, T)                                                                          \
  __attribute__((target("avx2"))) void NAME##_avx2(void* d, void* d2, const void* const* s, int n, size_t c, \
                                                   ReduceOp op, int div) {                                  \
    run_native<T>(d, d2, s, n, c, op, div);                                                                 \
  }                                                                                                         \
  void NAME##_base(void* d, void* d2, const void* const* s, int n, size_t c, ReduceOp op, int div) {        \
    run_native<T>(d, d2, s, n, c, op, div);                                                                 \
  }                                                                                                         \
  void NAME(void* d, void* d2, const void* const* s, int n, size_t c, ReduceOp op, int div) {               \
    static const bool avx2 = __builtin_cpu_supports("avx2");                                                \
    (avx2 ? NAME##_avx2 : NAME##_base)(d, d2, s, n, c, op, div);                                            \
  }
#else
#define GZ_NATIVE_ENTRY(NAME, T)                                                                    \
  void NAME(void* d, void* d2, const void* const* s, int n, size_t c, ReduceOp op, int div) {       \
    run_native<T>(d, d2, s, n, c, op, div);                                                         \
  }
#endif
GZ_NATIVE_ENTRY(reduce_f32, float)
GZ_NATIVE_ENTRY(reduce_f64, double)
GZ_NATIVE_ENTRY(reduce_i8, int8_t)
GZ_NATIVE_ENTRY(reduce_u8, uint8_t)
GZ_NATIVE_ENTRY(reduce_i32, int32_t)
GZ_NATIVE_ENTRY(reduce_i64, int64_t)
#undef GZ_NATIVE_ENTRY

}  // namespace

void reduce_n(void* dst, void* dst2, const void* const* srcs, int n, size_t count, DType dtype, ReduceOp op,
              int avg_divisor) {
  if (count == 0) return;
  if (n < 1) GZ_THROW(InvalidArgument, "reduce_n: need at least one source");
  switch (dtype) {
    case DType::f32: return reduce_f32(dst, dst2, srcs, n, count, op, avg_divisor);
    case DType::f64: return reduce_f64(dst, dst2, srcs, n, count, op, avg_divisor);
    case DType::f16: return run<F16>(dst, dst2, srcs, n, count, op, avg_divisor);
    case DType::bf16: return run<BF16>(dst, dst2, srcs, n, count, op, avg_divisor);
    case DType::i8: return reduce_i8(dst, dst2, srcs, n, count, op, avg_divisor);
    case DType::u8: return reduce_u8(dst, dst2, srcs, n, count, op, avg_divisor);
    case DType::i32: return reduce_i32(dst, dst2, srcs, n, count, op, avg_divisor);
    case DType::i64: return reduce_i64(dst, dst2, srcs, n, count, op, avg_divisor);
  }
  GZ_THROW(InvalidArgument, "reduce_n: unknown dtype ", static_cast<int>(dtype));
}

}  // namespace gz::comm::reduce
