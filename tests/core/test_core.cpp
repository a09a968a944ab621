#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "gz/core/deadline.h"
#include "gz/core/dtype.h"
#include "gz/core/env.h"
#include "gz/core/error.h"

using namespace gz;

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::bf16);
  EXPECT_STREQ(dtype_name(DType::u8), "u8");
  EXPECT_THROW(parse_dtype("f128"), InvalidArgument);
}

TEST(DType, HalfRoundTrip) {
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 0.333333f}) {
    float back = half_to_float(float_to_half(f));
    EXPECT_NEAR(back, f, std::fabs(f) * 1e-3 + 1e-7) << f;
  }
  EXPECT_TRUE(std::isinf(half_to_float(float_to_half(1e6f))));
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(NAN))));
  // every half value round-trips exactly through float
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = half_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_half(f), h) << h;
  }
}

TEST(DType, Bf16RoundTrip) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    float f = bf16_to_float(static_cast<uint16_t>(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_bf16(f), b);
  }
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.00390625f)), 1.0f);  // ties to even
}

TEST(Env, Parsing) {
  Env env({{"A", "12"}, {"B", "x"}, {"C", "true"}, {"D", "0"}});
  EXPECT_EQ(env.get_int("A", 0), 12);
  EXPECT_EQ(env.get_int("Z", 7), 7);
  EXPECT_THROW(env.get_int("B"), InvalidArgument);
  EXPECT_TRUE(env.get_bool("C", false));
  EXPECT_FALSE(env.get_bool("D", true));
  EXPECT_THROW(env.get_bool("B", true), InvalidArgument);
  EXPECT_THROW(parse_int("12x", "n"), InvalidArgument);
  EXPECT_DOUBLE_EQ(parse_double("2.5", "x"), 2.5);
}

TEST(Deadline, Expires) {
  // Not expired: a 10 s deadline, so a preempted thread cannot see it lapse before the checks.
  auto far = Deadline::after(std::chrono::seconds(10));
  EXPECT_FALSE(far.expired());
  EXPECT_GT(far.remaining_ms(), 0);
  // Expired: a short one, slept past.
  auto d = Deadline::after(std::chrono::milliseconds(20));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_TRUE(d.expired());
  EXPECT_EQ(d.remaining_ms(), 0);
  EXPECT_EQ(format_duration(std::chrono::milliseconds(1500)), "1.5 s");
}
