#include <gtest/gtest.h>

#include <cmath>

#include "gz/core/error.h"
#include "gz/train/scheduler.h"

// A namespace of its own: the unity build (GZ_UNITY_BUILD) compiles this file together with
// the other files of its test target.
namespace test_scheduler {

using gz::train::LrScheduler;
using gz::train::SchedulerOptions;

namespace {
SchedulerOptions opts(const std::string& name, int64_t warmup, int64_t total) {
  SchedulerOptions o;
  o.name = name;
  o.base_lr = 0.1;
  o.warmup_steps = warmup;
  o.total_steps = total;
  o.min_lr = 0.001;
  return o;
}
}  // namespace

TEST(Scheduler, WarmupIsLinear) {
  for (auto name : {"constant", "cosine", "linear", "multi_step"}) {
    LrScheduler s(opts(name, 10, 100));
    for (int64_t k = 0; k < 10; ++k) EXPECT_NEAR(s.lr_at(k), 0.1 * (k + 1) / 10.0, 1e-12) << name << " " << k;
  }
}

TEST(Scheduler, ConstantCosineLinearClosedForms) {
  LrScheduler c(opts("constant", 5, 100)), cos(opts("cosine", 5, 100)), lin(opts("linear", 5, 100));
  for (int64_t k = 5; k <= 120; ++k) {
    double t = std::min<double>(k - 5, 95) / 95.0;
    EXPECT_DOUBLE_EQ(c.lr_at(k), 0.1);
    EXPECT_NEAR(cos.lr_at(k), 0.001 + (0.1 - 0.001) * 0.5 * (1 + std::cos(M_PI * t)), 1e-12) << k;
    EXPECT_NEAR(lin.lr_at(k), 0.001 + (0.1 - 0.001) * (1 - t), 1e-12) << k;
  }
  EXPECT_NEAR(cos.lr_at(5), 0.1, 1e-12);
  EXPECT_NEAR(cos.lr_at(100), 0.001, 1e-12);
  EXPECT_NEAR(lin.lr_at(100), 0.001, 1e-12);
}

TEST(Scheduler, MultiStep) {
  auto o = opts("multi_step", 0, 100);
  o.milestones = {30, 60};
  o.gamma = 0.5;
  LrScheduler s(o);
  for (int64_t k = 0; k < 100; ++k) {
    int passed = (k >= 30) + (k >= 60);
    EXPECT_NEAR(s.lr_at(k), 0.1 * std::pow(0.5, passed), 1e-12) << k;
  }
}

TEST(Scheduler, PureFunctionOfStep) {
  LrScheduler a(opts("cosine", 3, 50)), b(opts("cosine", 3, 50));
  // Query in a different order: same values (nothing stateful, so a resume is exact).
  for (int64_t k = 49; k >= 0; --k) EXPECT_EQ(a.lr_at(k), b.lr_at(49 - (49 - k)));
}

TEST(Scheduler, BadOptions) {
  EXPECT_THROW(LrScheduler(opts("exp", 0, 10)), gz::InvalidArgument);
  auto o = opts("cosine", 0, 0);
  EXPECT_THROW(LrScheduler{o}, gz::InvalidArgument);
  o = opts("multi_step", 0, 10);
  o.milestones = {5, 2};
  EXPECT_THROW(LrScheduler{o}, gz::InvalidArgument);
}

}  // namespace test_scheduler
