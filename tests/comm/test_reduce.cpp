// The reduce kernels every backend shares (comm/reduce): Gloo's pairwise form and the in-place
// average must match a plain scalar reference for every dtype and op, in place too.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "comm/reduce/reduce.h"
#include "gz/core/dtype.h"

using namespace gz;
using namespace gz::comm;

namespace {

// Scalar reference on doubles; 16-bit floats are rounded back after each pair, integers wrap.
double as_double(const void* p, size_t i, DType t) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::f64: return static_cast<const double*>(p)[i];
    case DType::f16: return half_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::bf16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::i8: return static_cast<const int8_t*>(p)[i];
    case DType::u8: return static_cast<const uint8_t*>(p)[i];
    case DType::i32: return static_cast<const int32_t*>(p)[i];
    case DType::i64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
  }
  return 0;
}

void store(void* p, size_t i, DType t, double v) {
  switch (t) {
    case DType::f32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DType::f64: static_cast<double*>(p)[i] = v; break;
    case DType::f16: static_cast<uint16_t*>(p)[i] = float_to_half(static_cast<float>(v)); break;
    case DType::bf16: static_cast<uint16_t*>(p)[i] = float_to_bf16(static_cast<float>(v)); break;
    // Wrap through int64 (values stay small enough to be exact in a double).
    case DType::i8: static_cast<int8_t*>(p)[i] = static_cast<int8_t>(static_cast<int64_t>(v)); break;
    case DType::u8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(static_cast<int64_t>(v)); break;
    case DType::i32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(static_cast<int64_t>(v)); break;
    case DType::i64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); break;
  }
}

double combine(ReduceOp op, double a, double b) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return a + b;  // pairwise avg is a sum: callers divide once
    case ReduceOp::prod: return a * b;
    case ReduceOp::min: return b < a ? b : a;
    case ReduceOp::max: return a < b ? b : a;
  }
  return 0;
}

const DType kDtypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16,
                         DType::i8,  DType::u8,  DType::i32, DType::i64};
const ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::prod, ReduceOp::min, ReduceOp::max};

// 70 elements: two 32-byte vectors of every dtype plus a scalar tail.
std::vector<char> fill(DType t, size_t n, int seed) {
  std::vector<char> v(n * dtype_size(t));
  for (size_t i = 0; i < n; ++i)
    store(v.data(), i, t, static_cast<double>((static_cast<int>(i) * 7 + seed) % 23 - 9));
  return v;
}

TEST(ReduceKernels, PairwiseMatchesScalarReferenceInPlaceToo) {
  const size_t n = 70;
  for (DType t : kDtypes) {
    for (ReduceOp op : kOps) {
      auto a = fill(t, n, 3), b = fill(t, n, 11);
      std::vector<char> want(a.size());
      for (size_t i = 0; i < n; ++i)
        store(want.data(), i, t, combine(op, as_double(a.data(), i, t), as_double(b.data(), i, t)));
      auto fn = reduce::make_reduce_fn(t, op);
      std::vector<char> out(a.size());
      fn(out.data(), a.data(), b.data(), n);
      EXPECT_EQ(std::memcmp(out.data(), want.data(), want.size()), 0) << dtype_name(t) << " op " << int(op);
      fn(a.data(), a.data(), b.data(), n);  // Gloo folds into its accumulator: out == a
      EXPECT_EQ(std::memcmp(a.data(), want.data(), want.size()), 0)
          << dtype_name(t) << " op " << int(op) << " in place";
    }
  }
}

TEST(ReduceKernels, IntegersWrapLikeTheOtherBackends) {
  std::vector<int8_t> a(40, 100), b(40, 100), out(40);
  reduce::make_reduce_fn(DType::i8, ReduceOp::sum)(out.data(), a.data(), b.data(), a.size());
  for (int8_t x : out) ASSERT_EQ(x, static_cast<int8_t>(-56));
}

TEST(ReduceKernels, DivideInPlaceTruncatesIntegersAndRoundsHalves) {
  for (DType t : kDtypes) {
    const size_t n = 70;
    auto v = fill(t, n, 5);
    std::vector<char> want(v.size());
    for (size_t i = 0; i < n; ++i) {
      const double x = as_double(v.data(), i, t);
      const bool integral = t == DType::i8 || t == DType::u8 || t == DType::i32 || t == DType::i64;
      store(want.data(), i, t, integral ? static_cast<double>(static_cast<int64_t>(x) / 3) : x / 3);
    }
    reduce::divide_in_place(v.data(), n, t, 3);
    EXPECT_EQ(std::memcmp(v.data(), want.data(), want.size()), 0) << dtype_name(t);
  }
}

}  // namespace
