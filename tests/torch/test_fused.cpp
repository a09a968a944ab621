// FusedAdamW against LibTorch's AdamW, and fused_dropout's distribution, gradient and determinism.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <sstream>

#include "gz/core/error.h"
#include "gz/torch/fused_adamw.h"
#include "gz/torch/fused_dropout.h"
#include "torch/fused/kernels.h"

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
