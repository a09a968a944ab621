// FusedAdamW against LibTorch's AdamW; fused_dropout's distribution, gradient and determinism;
// max_pool2d_relu against relu(max_pool2d).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <sstream>

#include "gz/core/error.h"
#include "gz/torch/fused_adamw.h"
#include "gz/torch/fused_dropout.h"
#include "gz/torch/fused_pool.h"
#include "torch/fused/kernels.h"

// A namespace of its own: the unity build (GZ_UNITY_BUILD) compiles this file together with
// the other files of its test target.
namespace test_fused {

namespace {

// A few parameter shapes, one of them non-contiguous (a transposed view), which takes the
// reference path inside FusedAdamW.
std::vector<torch::Tensor> make_params(uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<torch::Tensor> ps;
  ps.push_back(torch::randn({257, 33}).requires_grad_());
  ps.push_back(torch::randn({1000}).requires_grad_());
  ps.push_back(torch::randn({3}).requires_grad_());
  ps.push_back(torch::randn({40, 20}).t().requires_grad_());  // non-contiguous leaf
  return ps;
}

void set_grads(std::vector<torch::Tensor>& ps, int step) {
  torch::manual_seed(1000 + step);
  for (auto& p : ps) p.mutable_grad() = torch::randn(p.sizes()) * (0.1 + step);
}

// Per-element rounding may differ by an ulp per step (fused vs separate kernels), so compare with
// a relative tolerance plus an absolute floor for values that pass near zero.
::testing::AssertionResult close(const torch::Tensor& got, const torch::Tensor& want) {
  if (torch::allclose(got, want, 1e-5, 1e-6)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max abs diff " << (got - want).abs().max().item<double>();
}

}  // namespace

TEST(FusedAdamW, MatchesLibTorchAdamWOver20Steps) {
  for (double wd : {0.0, 0.01, 0.1}) {
    auto a = make_params(7), b = make_params(7);
    auto opts = torch::optim::AdamWOptions(3e-3).weight_decay(wd).betas({0.8, 0.95}).eps(1e-6);
    torch::optim::AdamW ref(a, opts);
    gz::FusedAdamW fused(b, opts);
    for (int s = 0; s < 20; ++s) {
      set_grads(a, s);
      set_grads(b, s);
      if (s == 10) {  // a schedule changing lr mid-run
        static_cast<torch::optim::AdamWOptions&>(ref.param_groups()[0].options()).lr(1e-3);
        static_cast<torch::optim::AdamWOptions&>(fused.param_groups()[0].options()).lr(1e-3);
      }
      ref.step();
      fused.step();
    }
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_TRUE(close(b[i].detach(), a[i].detach())) << "param " << i << " wd " << wd;
  }
}

TEST(FusedAdamW, SkipsParamsWithoutGradAndFallsBackForAmsgradAndDouble) {
  auto a = make_params(3), b = make_params(3);
  a.push_back(torch::randn({5}, torch::kDouble).requires_grad_());
  b.push_back(a.back().detach().clone().requires_grad_());
  auto opts = torch::optim::AdamWOptions(1e-2).amsgrad(true);
  torch::optim::AdamW ref(a, opts);
  gz::FusedAdamW fused(b, opts);
  for (int s = 0; s < 5; ++s) {
    set_grads(a, s);
    set_grads(b, s);
    a[1].mutable_grad() = torch::Tensor();  // never stepped
    b[1].mutable_grad() = torch::Tensor();
    ref.step();
    fused.step();
  }
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::allclose(b[i], a[i], 1e-6, 1e-7)) << "param " << i;
  EXPECT_EQ(fused.state().size(), ref.state().size());
}

TEST(FusedAdamW, CheckpointsMoveBetweenFusedAndLibTorch) {
  auto a = make_params(11), b = make_params(11);
  auto opts = torch::optim::AdamWOptions(2e-3);
  gz::FusedAdamW fused(a, opts);
  for (int s = 0; s < 3; ++s) {
    set_grads(a, s);
    fused.step();
  }
  // Save the fused optimizer, load it into LibTorch's AdamW over a copy of the parameters.
  std::stringstream buf;
  {
    torch::serialize::OutputArchive ar;
    fused.save(ar);
    ar.save_to(buf);
  }
  for (size_t i = 0; i < a.size(); ++i) {
    torch::NoGradGuard ng;
    b[i].copy_(a[i]);
  }
  torch::optim::AdamW ref(b, opts);
  {
    torch::serialize::InputArchive ar;
    ar.load_from(buf);
    ref.load(ar);
  }
  for (int s = 3; s < 8; ++s) {
    set_grads(a, s);
    set_grads(b, s);
    fused.step();
    ref.step();
  }
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(close(a[i].detach(), b[i].detach())) << "param " << i;
}

TEST(FusedDropout, KeepsTheRightFractionScaledAndIndependently) {
  torch::manual_seed(5);
  const int64_t n = 1 << 20;
  for (double p : {0.1, 0.5, 0.9}) {
    auto x = torch::ones({n});
    auto y = gz::fused_dropout(x, p, true);
    auto kept = y.ne(0);
    const double frac = kept.to(torch::kDouble).mean().item<double>();
    const double sigma = std::sqrt(p * (1 - p) / n);
    EXPECT_NEAR(frac, 1 - p, 6 * sigma) << "p " << p;
    // Kept values are exactly 1/(1-p) in float; dropped are 0.
    const float scale = static_cast<float>(1.0 / (1.0 - p));
    EXPECT_TRUE(y.masked_select(kept).eq(scale).all().item<bool>());
    // Neighbours are independent: P(both dropped) ~ p^2.
    auto d = kept.logical_not().to(torch::kDouble);
    const double both = (d.slice(0, 0, n - 1) * d.slice(0, 1, n)).mean().item<double>();
    EXPECT_NEAR(both, p * p, 6 * std::sqrt(p * p * (1 - p * p) / n)) << "p " << p;
  }
}

TEST(FusedDropout, GradientIsTheSameMaskAndScale) {
  torch::manual_seed(9);
  auto x = torch::randn({64, 300}).requires_grad_();
  auto y = gz::fused_dropout(x, 0.3, true);
  auto w = torch::randn({64, 300});
  (y * w).sum().backward();
  auto mask = y.detach().ne(0).to(torch::kFloat) / 0.7f;
  EXPECT_TRUE(torch::allclose(x.grad(), w * mask, 1e-6, 1e-6));
  // Forward is x * the same mask.
  EXPECT_TRUE(torch::allclose(y.detach(), x.detach() * mask, 1e-6, 1e-6));
}

TEST(FusedDropout, SeededByLibTorchAndFreshEachCall) {
  auto x = torch::ones({10000});
  torch::manual_seed(123);
  auto a1 = gz::fused_dropout(x, 0.5, true), a2 = gz::fused_dropout(x, 0.5, true);
  torch::manual_seed(123);
  auto b1 = gz::fused_dropout(x, 0.5, true);
  EXPECT_TRUE(torch::equal(a1, b1));
  EXPECT_FALSE(torch::equal(a1, a2));
}

TEST(FusedDropout, SameMaskWhateverTheThreadCount) {
  const int before = torch::get_num_threads();
  auto x = torch::randn({3, 100000});
  torch::set_num_threads(1);
  torch::manual_seed(77);
  auto one = gz::fused_dropout(x, 0.2, true);
  torch::set_num_threads(2);
  torch::manual_seed(77);
  auto two = gz::fused_dropout(x, 0.2, true);
  torch::set_num_threads(before);
  EXPECT_TRUE(torch::equal(one, two));
}

TEST(FusedDropout, EdgeCasesAndFallbacks) {
  auto x = torch::randn({4, 5});
  EXPECT_TRUE(gz::fused_dropout(x, 0.5, false).is_same(x));  // eval: identity
  EXPECT_TRUE(gz::fused_dropout(x, 0.0, true).is_same(x));
  EXPECT_TRUE(gz::fused_dropout(x, 1.0, true).eq(0).all().item<bool>());
  auto t = x.t();  // non-contiguous input: the result has the input's values where kept
  auto yt = gz::fused_dropout(t, 0.5, true);
  EXPECT_EQ(yt.sizes(), t.sizes());
  auto kept = yt.ne(0);
  EXPECT_TRUE(torch::allclose(yt.masked_select(kept), t.masked_select(kept) * 2));
  auto xd = torch::randn({100}, torch::kDouble);  // other dtypes: LibTorch's dropout
  EXPECT_EQ(gz::fused_dropout(xd, 0.5, true).scalar_type(), torch::kDouble);
  EXPECT_THROW(gz::fused_dropout(x, 1.5, true), gz::InvalidArgument);
  EXPECT_THROW(gz::fused_dropout(x, -0.1, true), gz::InvalidArgument);
}

TEST(FusedDropout, MasksDifferAcrossTheFourBillionBoundary) {
  // Element indices beyond 2^32 use a different key, not a repeat of the first block's mask.
  const uint32_t thr = 1u << 23;  // p = 0.5
  int same = 0;
  for (uint64_t i = 0; i < 4096; ++i)
    same += gz::fused::dropout_keep(i, 42, thr) == gz::fused::dropout_keep(i + (uint64_t(1) << 32), 42, thr);
  EXPECT_GT(same, 1800);
  EXPECT_LT(same, 2300);
}

namespace {

// relu(max_pool2d(x, 2)) and its input gradient for the upstream gradient `gy`, by LibTorch.
std::pair<torch::Tensor, torch::Tensor> reference_pool(const torch::Tensor& x, const torch::Tensor& gy) {
  auto xr = x.detach().clone().requires_grad_();
  auto y = torch::relu(torch::max_pool2d(xr, 2));
  y.backward(gy);
  return {y.detach(), xr.grad()};
}

std::pair<torch::Tensor, torch::Tensor> fused_pool(const torch::Tensor& x, const torch::Tensor& gy) {
  auto xf = x.detach().clone().requires_grad_();
  auto y = gz::max_pool2d_relu(xf);
  y.backward(gy);
  return {y.detach(), xf.grad()};
}

}  // namespace

TEST(MaxPoolRelu, EqualsReluOfMaxPoolForwardAndBackward) {
  // Even and odd sides (the floor drops a row/column), 3-D and 4-D, one plane and many.
  const std::vector<std::vector<int64_t>> shapes = {
      {2, 3, 8, 8}, {4, 32, 28, 28}, {1, 1, 7, 9}, {3, 5, 6}, {2, 2, 2, 2}};
  for (const auto& s : shapes) {
    torch::manual_seed(7);
    auto x = torch::randn(s);
    auto out_shape = s;
    out_shape[s.size() - 2] /= 2;
    out_shape[s.size() - 1] /= 2;
    auto gy = torch::randn(out_shape);
    auto [y_ref, g_ref] = reference_pool(x, gy);
    auto [y, g] = fused_pool(x, gy);
    ASSERT_EQ(y.sizes(), y_ref.sizes());
    EXPECT_TRUE(torch::equal(y, y_ref)) << "forward, shape " << x.sizes();
    EXPECT_TRUE(torch::equal(g, g_ref)) << "backward, shape " << x.sizes();
  }
}

TEST(MaxPoolRelu, TiesNegativesZerosAndNaNFollowLibTorch) {
  // Each 2x2 window tests one rule: a tie (the first maximum takes the gradient), all negative
  // (clipped, no gradient), a maximum of exactly 0 (no gradient), NaN (wins and carries it).
  const float nan = std::nanf("");
  auto x = torch::tensor({{1.f, 1.f, -3.f, -1.f, 0.f, -2.f, 5.f, nan},  //
                          {1.f, 1.f, -2.f, -4.f, -1.f, 0.f, 9.f, 1.f}})
               .view({1, 1, 2, 8});
  auto gy = torch::tensor({10.f, 20.f, 30.f, 40.f}).view({1, 1, 1, 4});
  auto [y_ref, g_ref] = reference_pool(x, gy);
  auto [y, g] = fused_pool(x, gy);
  auto same = [](const torch::Tensor& a, const torch::Tensor& b) {
    return torch::equal(torch::isnan(a), torch::isnan(b)) &&
           torch::equal(torch::nan_to_num(a), torch::nan_to_num(b));
  };
  EXPECT_TRUE(same(y, y_ref)) << y << "\nvs\n" << y_ref;
  EXPECT_TRUE(torch::equal(g, g_ref)) << g << "\nvs\n" << g_ref;
  EXPECT_FLOAT_EQ(g[0][0][0][0].item<float>(), 10.f);  // the tie's first element
  EXPECT_FLOAT_EQ(g[0][0][0][1].item<float>(), 0.f);
  EXPECT_TRUE(torch::isnan(y[0][0][0][3]).item<bool>());
  EXPECT_FLOAT_EQ(g[0][0][0][7].item<float>(), 40.f);  // NaN took the gradient, not the 9
}

TEST(MaxPoolRelu, SameResultWhateverTheThreadCountAndLayout) {
  torch::manual_seed(3);
  auto x = torch::randn({8, 16, 14, 14});
  auto gy = torch::randn({8, 16, 7, 7});
  const int before = torch::get_num_threads();
  torch::set_num_threads(1);
  auto [y1, g1] = fused_pool(x, gy);
  torch::set_num_threads(4);
  auto [y4, g4] = fused_pool(x, gy);
  torch::set_num_threads(before);
  EXPECT_TRUE(torch::equal(y1, y4));
  EXPECT_TRUE(torch::equal(g1, g4));
  // A channels-last (non-contiguous) input and a non-contiguous upstream gradient give the same.
  auto xcl = x.contiguous(torch::MemoryFormat::ChannelsLast);
  auto xf = xcl.detach().clone(torch::MemoryFormat::ChannelsLast).requires_grad_();
  auto y = gz::max_pool2d_relu(xf);
  y.backward(gy.transpose(2, 3).contiguous().transpose(2, 3));
  EXPECT_TRUE(torch::equal(y, y1));
  EXPECT_TRUE(torch::equal(xf.grad(), g1));
}

TEST(MaxPoolRelu, FallsBackForOtherDtypesAndTinyInputs) {
  torch::manual_seed(4);
  auto x = torch::randn({2, 3, 6, 6}, torch::kDouble).requires_grad_();
  auto y = gz::max_pool2d_relu(x);
  EXPECT_TRUE(torch::equal(y, torch::relu(torch::max_pool2d(x, 2))));
  // The fallback is LibTorch's own, so gradcheck-style checks hold there.
  EXPECT_TRUE(torch::autograd::grad({y.sum()}, {x})[0].defined());
  // Too small for a window: LibTorch's error, not a crash.
  EXPECT_ANY_THROW(gz::max_pool2d_relu(torch::randn({1, 1, 1, 5})));
}

TEST(MaxPoolRelu, SimdKernelsEqualThePortableOnesOnEveryWidth) {
  // Widths 2..41 cover the 8-window SIMD body, its padded tail and odd sides; values rounded to
  // quarters make ties common, and some NaNs are sprinkled in.
  if (!gz::fused::maxpool_uses_avx2()) GTEST_SKIP() << "no AVX2 on this CPU: only the portable kernels run";
  torch::manual_seed(5);
  for (int64_t w = 2; w <= 41; ++w) {
    const int64_t h = 2 + w % 5, planes = 3;
    auto x = (torch::randn({planes, h, w}) * 4).round() / 4;
    x.view(-1).index_put_({torch::randint(0, x.numel(), {3}, torch::kLong)}, std::nanf(""));
    const int64_t oh = h / 2, ow = w / 2;
    auto y1 = torch::empty({planes, oh, ow}), y2 = torch::empty({planes, oh, ow});
    auto a1 = torch::empty({planes, oh, ow}, torch::kUInt8),
         a2 = torch::empty({planes, oh, ow}, torch::kUInt8);
    gz::fused::maxpool2x2_relu_fwd(x.data_ptr<float>(), y1.data_ptr<float>(), a1.data_ptr<uint8_t>(), planes,
                                   h, w);
    gz::fused::maxpool2x2_relu_fwd_portable(x.data_ptr<float>(), y2.data_ptr<float>(), a2.data_ptr<uint8_t>(),
                                            planes, h, w);
    ASSERT_TRUE(torch::equal(a1, a2)) << "width " << w;
    ASSERT_TRUE(torch::equal(torch::nan_to_num(y1), torch::nan_to_num(y2))) << "width " << w;
    auto gy = torch::randn({planes, oh, ow});
    auto g1 = torch::full({planes, h, w}, 7.0f),
         g2 = torch::full({planes, h, w}, -7.0f);  // every element written
    gz::fused::maxpool2x2_relu_bwd(gy.data_ptr<float>(), a1.data_ptr<uint8_t>(), g1.data_ptr<float>(), planes,
                                   h, w);
    gz::fused::maxpool2x2_relu_bwd_portable(gy.data_ptr<float>(), a1.data_ptr<uint8_t>(),
                                            g2.data_ptr<float>(), planes, h, w);
    ASSERT_TRUE(torch::equal(g1, g2)) << "width " << w;
  }
}

}  // namespace test_fused
