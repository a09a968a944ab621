// Gradient compression hooks (PowerSGD, 8-bit min-max, top-k): exact results where the format
// allows, error feedback, byte counts, and convergence through DDP and Horovod mode.
#include <algorithm>
#include <atomic>
#include <cmath>

#include "gz/core/error.h"
#include "gz/torch/compression.h"
#include "gz/torch/ddp.h"
#include "gz/torch/distributed_optimizer.h"
#include "torch/support/torch_test_util.h"

// A namespace of its own: the unity build (GZ_UNITY_BUILD) compiles this file together with
// the other files of its test target.
namespace test_compression {

namespace {
using namespace gz;
using namespace gz::test;

const bool kOneThread = [] {
  torch::set_num_threads(1);
  return true;
}();

CompressionOptions options_for(Compression method) {
  CompressionOptions o;
  o.method = method;
  return o;
}

// inputs[step][rank]: each rank's flat bucket at each step.
using Inputs = std::vector<std::vector<torch::Tensor>>;
// out[rank][step]: the bucket after the hook.
using Outputs = std::vector<std::vector<torch::Tensor>>;

// Every rank builds its own hook with `make` and reduces one bucket per step: a flat copy of
// inputs[step][rank], split into gradients of `shapes` (empty: one flat tensor), divided by `divisor`.
Outputs run_hook(int world, const std::function<CommHook()>& make, const Inputs& in, double divisor,
                 const std::vector<std::vector<int64_t>>& shapes = {}) {
  Outputs out(static_cast<size_t>(world));
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    auto hook = make();
    for (size_t s = 0; s < in.size(); ++s) {
      GradBucket b;
      b.index = 0;
      b.buffer = in[s][static_cast<size_t>(r)].clone();
      b.divisor = divisor;
      int64_t off = 0;
      for (size_t i = 0; i < shapes.size(); ++i) {
        int64_t n = 1;
        for (auto d : shapes[i]) n *= d;
        b.gradients.push_back(b.buffer.narrow(0, off, n).view(shapes[i]));
        b.param_ids.push_back(i);
        off += n;
      }
      hook(*g, b);
      out[static_cast<size_t>(r)].push_back(b.buffer.clone());
    }
  });
  return out;
}

void expect_same_on_every_rank(const Outputs& out) {
  for (size_t r = 1; r < out.size(); ++r)
    for (size_t s = 0; s < out[r].size(); ++s)
      EXPECT_TRUE(torch::equal(out[r][s], out[0][s]))
          << "rank " << r << " step " << s << " differs from rank 0";
}

torch::Tensor mean_of(const std::vector<torch::Tensor>& per_rank, double divisor) {
  auto sum = torch::zeros_like(per_rank[0], torch::kDouble);
  for (auto& t : per_rank) sum += t.to(torch::kDouble);
  return sum / divisor;
}

// ---------------------------------------------------------------------------------------------
// 8-bit min-max

// Values lo + q * step with q in 0..255 and 0 and 255 in every chunk: the quantisation is exact, so
// the result must be the exact sum (all values dyadic: no rounding in f32 either).
TEST(Int8Hook, SumsExactlyRepresentableValuesExactly) {
  for (int world : {2, 3, 4}) {
    for (double divisor : {1.0, static_cast<double>(world)}) {
      if (divisor == 3) continue;            // x / 3 is not dyadic
      const int64_t n = 3000, chunk = 1024;  // two full chunks and a tail of 952
      Inputs in(1);
      for (int r = 0; r < world; ++r) {
        auto q = torch::randint(0, 256, {n}, torch::kLong);
        for (int64_t c = 0; c < n; c += chunk) {
          q[c] = 0;
          q[std::min(n, c + chunk) - 1] = 255;
        }
        const double lo = -8.0 * (r + 1), step = 1.0 / 16;
        in[0].push_back((q.to(torch::kDouble) * step + lo).to(torch::kFloat));
      }
      auto o = options_for(Compression::int8);
      o.int8_chunk = chunk;
      o.error_feedback = true;
      auto out = run_hook(
          world, [&] { return int8_hook(o); }, in, divisor);
      auto expected = mean_of(in[0], divisor).to(torch::kFloat);
      EXPECT_TRUE(torch::equal(out[0][0], expected))
          << "world " << world << " divisor " << divisor << ": max error "
          << (out[0][0] - expected).abs().max().item<double>();
      expect_same_on_every_rank(out);
    }
  }
}

// Arbitrary values: every element is off by at most half a quantisation step per rank.
TEST(Int8Hook, ErrorIsAtMostHalfAStepPerRank) {
  const int world = 3;
  const int64_t n = 2500, chunk = 256;
  Inputs in(1);
  for (int r = 0; r < world; ++r) in[0].push_back(torch::randn({n}) * (r + 1));
  auto o = options_for(Compression::int8);
  o.int8_chunk = chunk;
  auto out = run_hook(
      world, [&] { return int8_hook(o); }, in, 1.0);
  // Per element: the sum over ranks of half that rank's step in the element's chunk.
  auto bound = torch::zeros({n}, torch::kDouble);
  for (auto& x : in[0])
    for (int64_t c = 0; c < n; c += chunk) {
      auto part = x.narrow(0, c, std::min(chunk, n - c));
      const double step = (part.max() - part.min()).item<double>() / 255;
      bound.narrow(0, c, part.numel()) += step / 2;
    }
  auto err = (out[0][0].to(torch::kDouble) - mean_of(in[0], 1.0)).abs();
  EXPECT_TRUE((err <= bound * 1.0001 + 1e-6).all().item<bool>())
      << "worst error / bound " << (err / bound).max().item<double>();
  EXPECT_GT((err / bound).max().item<double>(), 0.25) << "suspiciously exact: is it quantising at all?";
  expect_same_on_every_rank(out);
}

// A constant chunk, and one whose range is a denormal (255 / range overflows): both must come
// through finite, within their range of the exact sum (UBSan caught NaN -> u8 casts here).
TEST(Int8Hook, ConstantAndDenormalRangeChunksStayFinite) {
  const int world = 2;
  const int64_t chunk = 8;
  auto a = torch::zeros({3 * chunk});
  a.narrow(0, 0, chunk).fill_(0.25f);  // constant
  a[chunk + 3] = 1e-44f;               // denormal range
  a.narrow(0, 2 * chunk, chunk).copy_(torch::tensor({0.f, 255.f, 1.f, 2.f, 3.f, 4.f, 5.f, 6.f}));  // exact
  Inputs in{{a, a.clone()}};
  auto o = options_for(Compression::int8);
  o.int8_chunk = chunk;
  auto out = run_hook(
      world, [&] { return int8_hook(o); }, in, 1.0);
  EXPECT_TRUE(torch::isfinite(out[0][0]).all().item<bool>()) << out[0][0];
  EXPECT_LT((out[0][0] - 2 * a).abs().max().item<double>(), 1e-5) << out[0][0];
}

// ---------------------------------------------------------------------------------------------
// top-k

TEST(TopKHook, SendsTheLargestValuesAndFeedsBackTheRest) {
  const int world = 2;
  // k = ceil(0.2 x 10) = 2 per rank.
  auto r0 = torch::tensor({5.f, 1.f, 0.5f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, -4.f});
  auto r1 = torch::tensor({0.f, 3.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 2.f});
  Inputs in{{r0, r1}, {torch::zeros({10}), torch::zeros({10})}};
  for (bool ef : {true, false}) {
    auto o = options_for(Compression::topk);
    o.topk_ratio = 0.2;
    o.error_feedback = ef;
    auto out = run_hook(
        world, [&] { return topk_hook(o); }, in, 1.0);
    EXPECT_TRUE(torch::equal(out[0][0], torch::tensor({5.f, 3.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, -2.f})))
        << out[0][0];
    // Step 2, zero gradients: with error feedback rank 0 sends what it kept back (1 and 0.5).
    auto second =
        ef ? torch::tensor({0.f, 1.f, 0.5f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}) : torch::zeros({10});
    EXPECT_TRUE(torch::equal(out[0][1], second)) << "error feedback " << ef << ": " << out[0][1];
    expect_same_on_every_rank(out);
  }
}

TEST(TopKHook, CountsIndicesAndValuesOnly) {
  const int world = 2;
  const int64_t n = 1000;
  Inputs in(3, {torch::randn({n}), torch::randn({n})});
  auto o = options_for(Compression::topk);
  o.topk_ratio = 0.05;  // k = 50: 50 x (4-byte index + 4-byte value), padded to 8
  std::vector<std::shared_ptr<CommStats>> stats{std::make_shared<CommStats>(), std::make_shared<CommStats>()};
  std::atomic<int> made{0};
  run_hook(
      world, [&] { return topk_hook(o, stats[static_cast<size_t>(made++)]); }, in, 2.0);
  for (auto& s : stats) {
    EXPECT_EQ(s->bytes.load(), 3u * 400u);
    EXPECT_EQ(s->collectives.load(), 3u);
  }
}

// ---------------------------------------------------------------------------------------------
// PowerSGD

const std::vector<std::vector<int64_t>> kShapes{{32, 48}, {48}, {12, 40}, {6, 6}};

int64_t numel_of(const std::vector<std::vector<int64_t>>& shapes) {
  int64_t n = 0;
  for (auto& s : shapes) {
    int64_t k = 1;
    for (auto d : s) k *= d;
    n += k;
  }
  return n;
}

// Each rank's bucket: rank-1 matrices u v^T, a random vector, and a small matrix sent uncompressed.
torch::Tensor low_rank_bucket(int r) {
  torch::manual_seed(100 + r);
  std::vector<torch::Tensor> parts;
  for (auto& s : kShapes) {
    if (s.size() == 2 && s[0] > 6)
      parts.push_back(torch::outer(torch::randn({s[0]}), torch::randn({s[1]})).view(-1));
    else
      parts.push_back(torch::randn({s[0] * (s.size() == 2 ? s[1] : 1)}));
  }
  return torch::cat(parts);
}

// With 3 ranks the average of rank-1 matrices has rank <= 3 < 4: one power step from a random Q
// spans it, so the result is the exact average (up to rounding), in every tensor.
TEST(PowerSGDHook, ExactForLowRankAverages) {
  const int world = 3;
  Inputs in(2);
  for (int r = 0; r < world; ++r) in[0].push_back(low_rank_bucket(r));
  in[1] = in[0];
  auto o = options_for(Compression::powersgd);
  o.powersgd_rank = 4;
  std::vector<std::shared_ptr<CommStats>> stats;
  for (int r = 0; r < world; ++r) stats.push_back(std::make_shared<CommStats>());
  std::atomic<int> made{0};
  auto out = run_hook(
      world, [&] { return powersgd_hook(o, stats[static_cast<size_t>(made++)]); }, in, world, kShapes);
  auto expected = mean_of(in[0], world).to(torch::kFloat);
  for (int s = 0; s < 2; ++s) {
    const double err = (out[0][static_cast<size_t>(s)] - expected).abs().max().item<double>();
    EXPECT_LT(err, 1e-4 * expected.abs().max().item<double>()) << "step " << s;
  }
  expect_same_on_every_rank(out);
  // Per step: [48 + 36 uncompressed | P: 32x4 + 12x4] then Q: 48x4 + 40x4, f32 (the 6x6 matrix is
  // not worth compressing: (6 + 6) x 4 x 2 >= 36).
  const uint64_t per_step = (48 + 36 + 32 * 4 + 12 * 4 + 48 * 4 + 40 * 4) * 4;
  for (auto& s : stats) {
    EXPECT_EQ(s->bytes.load(), 2 * per_step);
    EXPECT_EQ(s->collectives.load(), 4u);
  }
  EXPECT_LT(2 * per_step, 2 * static_cast<uint64_t>(numel_of(kShapes)) * 4 / 2) << "compresses less than 2x";
}

TEST(PowerSGDHook, FirstStartStepsAreExactAllReduces) {
  const int world = 2;
  Inputs in(3);
  for (int s = 0; s < 3; ++s)
    for (int r = 0; r < world; ++r) in[static_cast<size_t>(s)].push_back(torch::randn({numel_of(kShapes)}));
  auto o = options_for(Compression::powersgd);
  o.powersgd_rank = 1;
  o.start_step = 2;
  auto out = run_hook(
      world, [&] { return powersgd_hook(o); }, in, world, kShapes);
  for (int s = 0; s < 3; ++s) {
    auto expected = mean_of(in[static_cast<size_t>(s)], world).to(torch::kFloat);
    const bool close = torch::allclose(out[0][static_cast<size_t>(s)], expected, 1e-5, 1e-6);
    EXPECT_EQ(close, s < 2) << "step " << s
                            << ": plain all-reduce for start_step steps, rank-1 approximation after";
  }
}

// ---------------------------------------------------------------------------------------------
// Error feedback: with constant gradients the sum of what the hook delivers tracks the sum of the
// average gradients (the difference is the last residual, bounded), while without error feedback
// the compression bias adds up step after step.
double drift(Compression method, bool ef, int steps) {
  const int world = 2;
  std::vector<std::vector<int64_t>> shapes{{20, 30}, {30}};
  const int64_t n = numel_of(shapes);
  std::vector<torch::Tensor> grads;
  for (int r = 0; r < world; ++r) {
    torch::manual_seed(7 + r);
    grads.push_back(torch::randn({n}));
  }
  Inputs in(static_cast<size_t>(steps), grads);
  auto o = options_for(method);
  o.error_feedback = ef;
  o.powersgd_rank = 2;
  o.topk_ratio = 0.05;
  o.int8_chunk = 4096;
  auto out = run_hook(
      world, [&] { return make_comm_hook(o); }, in, world, shapes);
  auto sum = torch::zeros({n}, torch::kDouble);
  for (auto& t : out[0]) sum += t.to(torch::kDouble);
  auto target = mean_of(grads, world) * steps;
  return ((sum - target).norm() / target.norm()).item<double>();
}

class ErrorFeedback : public ::testing::TestWithParam<Compression> {};

TEST_P(ErrorFeedback, KeepsTheSumOfUpdatesOnTrack) {
  // With error feedback the gap is the last residual, bounded: relative to T steps it shrinks as
  // 1/T. Without, the same bias is added every step: the relative gap stays.
  const double w40 = drift(GetParam(), true, 40), w160 = drift(GetParam(), true, 160);
  const double without = drift(GetParam(), false, 160);
  EXPECT_LT(w160, 0.4 * w40) << "with error feedback after 40 steps " << w40 << ", after 160 " << w160;
  EXPECT_LT(w160, 0.1 * without) << "with error feedback " << w160 << ", without " << without;
}

void PrintTo(Compression c, std::ostream* os) { *os << to_string(c); }

INSTANTIATE_TEST_SUITE_P(Methods, ErrorFeedback,
                         ::testing::Values(Compression::powersgd, Compression::int8, Compression::topk),
                         [](const auto& info) { return std::string(to_string(info.param)); });

// ---------------------------------------------------------------------------------------------
// Convergence on a small problem: a student network learns a teacher's outputs (a realisable
// regression, so the loss goes to zero) with SGD, through DDP (2 ranks) and through Horovod mode.

struct StudentImpl : torch::nn::Module {
  StudentImpl() {
    l1 = register_module("l1", torch::nn::Linear(32, 24));
    l2 = register_module("l2", torch::nn::Linear(24, 8));
  }
  torch::Tensor forward(const torch::Tensor& x) { return l2->forward(torch::tanh(l1->forward(x))); }
  torch::nn::Linear l1{nullptr}, l2{nullptr};
};
TORCH_MODULE(Student);

struct Problem {
  std::vector<torch::Tensor> x, y;
};

Problem make_problem(int steps, int64_t rows) {
  torch::manual_seed(99);
  Student teacher;
  Problem p;
  torch::NoGradGuard no_grad;
  for (int s = 0; s < steps; ++s) {
    p.x.push_back(torch::randn({rows, 32}));
    p.y.push_back(teacher->forward(p.x.back()));
  }
  return p;
}

struct RunResult {
  double first_loss = 0, last_loss = 0;
  bool replicas_equal = true;
};

enum class Front { ddp, horovod };

// Mean loss of the first and the last 10 steps on rank 0; whether every rank ends with rank 0's
// parameters (bitwise: every rank must apply the same update).
RunResult train(Front front, CompressionOptions o, int steps) {
  const int world = 2;
  const int64_t b = 16;
  auto p = make_problem(steps, world * b);
  std::vector<std::vector<torch::Tensor>> final_params(world);
  std::vector<double> losses;
  // Made here: the RNG is global, ranks seeding it in their threads would race.
  std::vector<Student> models;
  for (int r = 0; r < world; ++r) {
    torch::manual_seed(5 + r);  // different on purpose: DDP and broadcast_parameters must align them
    models.emplace_back();
  }
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    auto& m = models[static_cast<size_t>(r)];
    torch::optim::SGD sgd(m->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    std::unique_ptr<DistributedDataParallel> ddp;
    std::unique_ptr<DistributedOptimizer> hvd;
    std::shared_ptr<torch::optim::Optimizer> opt(&sgd, [](torch::optim::Optimizer*) {});
    if (front == Front::ddp) {
      DDPOptions d;
      d.first_bucket_bytes = 1024;  // several buckets, rebuilt after the first step
      d.bucket_bytes = 2048;
      d.comm_hook = make_comm_hook(o);
      ddp = std::make_unique<DistributedDataParallel>(m.ptr(), g, d);
    } else {
      NamedParameters named;
      for (auto& it : m->named_parameters()) named.emplace_back(it.key(), it.value());
      broadcast_parameters(named, 0, g);
      DistributedOptimizerOptions h;
      h.compression = o.method;
      h.compression_options = o;
      hvd = std::make_unique<DistributedOptimizer>(opt, named, h, g);
    }
    for (int s = 0; s < steps; ++s) {
      sgd.zero_grad();
      auto x = shard(p.x[static_cast<size_t>(s)], r, b), y = shard(p.y[static_cast<size_t>(s)], r, b);
      auto out = ddp ? ddp->forward([&] { return m->forward(x); }) : m->forward(x);
      auto loss = torch::mse_loss(out, y);
      loss.backward();
      if (hvd)
        hvd->step();
      else
        sgd.step();
      if (r == 0) losses.push_back(loss.item<double>());
    }
    for (auto& t : m->parameters()) final_params[static_cast<size_t>(r)].push_back(t.detach().clone());
  });
  RunResult res;
  for (int i = 0; i < 10; ++i) {
    res.first_loss += losses[static_cast<size_t>(i)] / 10;
    res.last_loss += losses[losses.size() - 1 - static_cast<size_t>(i)] / 10;
  }
  for (size_t i = 0; i < final_params[0].size(); ++i)
    res.replicas_equal = res.replicas_equal && torch::equal(final_params[0][i], final_params[1][i]);
  return res;
}

struct ConvergenceCase {
  Front front;
  Compression method;
  friend void PrintTo(const ConvergenceCase& c, std::ostream* os) {
    *os << (c.front == Front::ddp ? "ddp " : "horovod ") << to_string(c.method);
  }
};

class Convergence : public ::testing::TestWithParam<ConvergenceCase> {};

TEST_P(Convergence, ReachesTheUncompressedLossScale) {
  const int steps = 300;
  auto o = options_for(GetParam().method);
  o.powersgd_rank = 2;
  o.topk_ratio = 0.1;
  o.int8_chunk = 128;
  o.start_step = 5;
  auto plain = train(GetParam().front, options_for(Compression::none), steps);
  auto res = train(GetParam().front, o, steps);
  EXPECT_TRUE(plain.replicas_equal) << "uncompressed: ranks applied different updates";
  EXPECT_TRUE(res.replicas_equal) << "ranks applied different updates";
  EXPECT_LT(res.last_loss, 0.05 * res.first_loss) << "first " << res.first_loss << " last " << res.last_loss;
  EXPECT_LT(res.last_loss, 5 * plain.last_loss + 1e-4) << "uncompressed reaches " << plain.last_loss;
}

INSTANTIATE_TEST_SUITE_P(Hooks, Convergence,
                         ::testing::Values(ConvergenceCase{Front::ddp, Compression::powersgd},
                                           ConvergenceCase{Front::ddp, Compression::int8},
                                           ConvergenceCase{Front::ddp, Compression::topk},
                                           ConvergenceCase{Front::horovod, Compression::powersgd},
                                           ConvergenceCase{Front::horovod, Compression::int8},
                                           ConvergenceCase{Front::horovod, Compression::topk}),
                         [](const auto& info) {
                           return std::string(info.param.front == Front::ddp ? "ddp_" : "horovod_") +
                                  to_string(info.param.method);
                         });

TEST(Compression, NamesRoundTrip) {
  for (auto c : {Compression::none, Compression::fp16, Compression::bf16, Compression::powersgd,
                 Compression::int8, Compression::topk})
    EXPECT_EQ(parse_compression(to_string(c)), c);
  EXPECT_THROW(parse_compression("onebit"), gz::InvalidArgument);
}

}  // namespace

}  // namespace test_compression
