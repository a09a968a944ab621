#include <gtest/gtest.h>

#include <torch/torch.h>

#include <limits>

#include "gz/core/error.h"
#include "gz/torch/autocast.h"
#include "gz/torch/grad_scaler.h"

// A namespace of its own: the unity build (GZ_UNITY_BUILD) compiles this file together with
// the other files of its test target.
namespace test_grad_scaler {

namespace {

struct ScalerRig {
  torch::Tensor w = torch::ones({3}, torch::requires_grad());
  std::unique_ptr<torch::optim::SGD> opt = std::make_unique<torch::optim::SGD>(std::vector<torch::Tensor>{w}, 0.1);
  void backward(gz::GradScaler& s, bool inject_inf) {
    opt->zero_grad();
    auto loss = (w * torch::tensor({1.0f, 2.0f, 3.0f})).sum();
    s.scale(loss).backward();
    if (inject_inf) w.mutable_grad()[1] = std::numeric_limits<float>::infinity();
  }
};

}  // namespace

TEST(GradScaler, ScalesUnscalesAndSteps) {
  gz::GradScalerOptions o;
  o.init_scale = 1024;
  gz::GradScaler s(o);
  ScalerRig t;
  t.backward(s, false);
  EXPECT_FLOAT_EQ(t.w.grad()[2].item<float>(), 3.0f * 1024);
  EXPECT_TRUE(s.step(*t.opt));
  // Gradients were unscaled before the step: w = 1 - 0.1 * [1, 2, 3].
  EXPECT_TRUE(torch::allclose(t.w.detach(), torch::tensor({0.9f, 0.8f, 0.7f})));
  s.update();
  EXPECT_DOUBLE_EQ(s.get_scale(), 1024);
  EXPECT_EQ(s.growth_tracker(), 1);
}

TEST(GradScaler, SkipsStepAndBacksOffOnInf) {
  gz::GradScalerOptions o;
  o.init_scale = 1024;
  gz::GradScaler s(o);
  ScalerRig t;
  t.backward(s, true);
  auto before = t.w.detach().clone();
  EXPECT_FALSE(s.step(*t.opt));
  EXPECT_TRUE(s.found_inf());
  EXPECT_TRUE(torch::equal(before, t.w.detach()));
  s.update();
  EXPECT_DOUBLE_EQ(s.get_scale(), 512);
  EXPECT_EQ(s.growth_tracker(), 0);
  // NaN too.
  t.opt->zero_grad();
  s.scale((t.w * 2).sum()).backward();
  t.w.mutable_grad()[0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(s.step(*t.opt));
  s.update();
  EXPECT_DOUBLE_EQ(s.get_scale(), 256);
}

TEST(GradScaler, GrowsAfterIntervalAndResetsOnOverflow) {
  gz::GradScalerOptions o;
  o.init_scale = 8;
  o.growth_interval = 3;
  gz::GradScaler s(o);
  ScalerRig t;
  // Reference model of the rule: x2 after 3 clean steps, x0.5 and reset on overflow.
  double expect = 8;
  int clean = 0;
  std::vector<bool> pattern{false, false, false, false, true, false, false, false, false, false, false};
  for (bool inf : pattern) {
    t.backward(s, inf);
    s.step(*t.opt);
    s.update();
    if (inf) {
      expect *= 0.5;
      clean = 0;
    } else if (++clean == 3) {
      expect *= 2;
      clean = 0;
    }
    EXPECT_DOUBLE_EQ(s.get_scale(), expect);
  }
}

TEST(GradScaler, StateRoundTripAndUnscaleOnce) {
  gz::GradScalerOptions o;
  o.init_scale = 64;
  o.growth_interval = 10;
  gz::GradScaler a(o), b;
  ScalerRig t;
  for (int i = 0; i < 3; ++i) {
    t.backward(a, i == 0);
    a.step(*t.opt);
    a.update();
  }
  torch::serialize::OutputArchive out;
  a.save(out);
  std::stringstream ss;
  out.save_to(ss);
  torch::serialize::InputArchive in;
  in.load_from(ss);
  b.load(in);
  EXPECT_DOUBLE_EQ(b.get_scale(), a.get_scale());
  EXPECT_EQ(b.growth_tracker(), a.growth_tracker());
  t.backward(a, false);
  a.unscale_(*t.opt);
  EXPECT_THROW(a.unscale_(*t.opt), gz::InvalidArgument);
}

TEST(GradScaler, DisabledIsIdentity) {
  gz::GradScalerOptions o;
  o.enabled = false;
  gz::GradScaler s(o);
  ScalerRig t;
  t.backward(s, false);
  EXPECT_FLOAT_EQ(t.w.grad()[1].item<float>(), 2.0f);
  EXPECT_TRUE(s.step(*t.opt));
}

TEST(Autocast, Bf16OnCpuAndFp16Refused) {
  auto a = torch::randn({4, 8}), b = torch::randn({8, 2});
  {
    gz::AutocastGuard g(c10::DeviceType::CPU, c10::ScalarType::BFloat16);
    EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kBFloat16);
  }
  EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kFloat32);
  EXPECT_THROW({ gz::AutocastGuard g(c10::DeviceType::CPU, c10::ScalarType::Half); }, gz::InvalidArgument);
}

}  // namespace test_grad_scaler
