// Element-wise reduction functions in Gloo's (out, a, b, n) form for every gz::DType.
// f16 and bf16 are reduced pairwise in f32 and rounded back, so the wire stays 16-bit.
#pragma once

#include <algorithm>
#include <cstring>
#include <functional>
#include <type_traits>

#include "gz/comm/types.h"
#include "gz/core/dtype.h"
#include "gz/core/error.h"

namespace gz::comm::gloo_impl {

using ReduceFn = std::function<void(void*, const void*, const void*, size_t)>;

template <typename T>
T combine(ReduceOp op, T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    // Wrap-around instead of signed-overflow UB, like the other backends.
    using U = std::make_unsigned_t<T>;
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg: return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
      case ReduceOp::prod: return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
      case ReduceOp::min: return std::min(a, b);
      case ReduceOp::max: return std::max(a, b);
    }
  } else {
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg: return a + b;
      case ReduceOp::prod: return a * b;
      case ReduceOp::min: return std::min(a, b);
      case ReduceOp::max: return std::max(a, b);
    }
  }
  return a;
}

template <typename T>
ReduceFn make_typed(ReduceOp op) {
  return [op](void* c, const void* a, const void* b, size_t n) {
    T* out = static_cast<T*>(c);
    const T* x = static_cast<const T*>(a);
    const T* y = static_cast<const T*>(b);
    for (size_t i = 0; i < n; ++i) out[i] = combine<T>(op, x[i], y[i]);
  };
}

template <float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
ReduceFn make_16bit(ReduceOp op) {
  return [op](void* c, const void* a, const void* b, size_t n) {
    uint16_t* out = static_cast<uint16_t*>(c);
    const uint16_t* x = static_cast<const uint16_t*>(a);
    const uint16_t* y = static_cast<const uint16_t*>(b);
    for (size_t i = 0; i < n; ++i) out[i] = FromF(combine<float>(op, ToF(x[i]), ToF(y[i])));
  };
}

inline ReduceFn make_reduce_fn(DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::f32: return make_typed<float>(op);
    case DType::f64: return make_typed<double>(op);
    case DType::f16: return make_16bit<half_to_float, float_to_half>(op);
    case DType::bf16: return make_16bit<bf16_to_float, float_to_bf16>(op);
    case DType::i8: return make_typed<int8_t>(op);
    case DType::u8: return make_typed<uint8_t>(op);
    case DType::i32: return make_typed<int32_t>(op);
    case DType::i64: return make_typed<int64_t>(op);
  }
  GZ_THROW(InvalidArgument, "unknown dtype ", static_cast<int>(dtype));
}

/// @brief data[i] /= divisor (avg = sum / world size; integers truncate toward zero).
inline void divide_in_place(void* data, size_t n, DType dtype, int divisor) {
  auto typed = [&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<T>(p[i] / static_cast<T>(divisor));
  };
  switch (dtype) {
    case DType::f32: typed(static_cast<float*>(data)); break;
    case DType::f64: typed(static_cast<double*>(data)); break;
    case DType::i8: typed(static_cast<int8_t*>(data)); break;
    case DType::u8: typed(static_cast<uint8_t*>(data)); break;
    case DType::i32: typed(static_cast<int32_t*>(data)); break;
    case DType::i64: typed(static_cast<int64_t*>(data)); break;
    case DType::f16: {
      auto* p = static_cast<uint16_t*>(data);
      for (size_t i = 0; i < n; ++i) p[i] = float_to_half(half_to_float(p[i]) / static_cast<float>(divisor));
      break;
    }
    case DType::bf16: {
      auto* p = static_cast<uint16_t*>(data);
      for (size_t i = 0; i < n; ++i) p[i] = float_to_bf16(bf16_to_float(p[i]) / static_cast<float>(divisor));
      break;
    }
  }
}

}  // namespace gz::comm::gloo_impl
