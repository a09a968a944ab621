// Horovod-style DistributedOptimizer: equivalence, different gradient orders per rank, stall
// report, backward_passes_per_step, an aborted group, parameter and optimizer-state broadcast.
#include <algorithm>
#include <thread>

#include "gz/core/error.h"
#include "gz/torch/collectives.h"
#include "gz/torch/distributed_optimizer.h"
#include "torch/support/torch_test_util.h"

// A namespace of its own: the unity build (GZ_UNITY_BUILD) compiles this file together with
// the other files of its test target.
namespace test_horovod {

namespace {
using namespace gz;
using namespace gz::test;

const bool kOneThread = [] {
  torch::set_num_threads(1);
  return true;
}();

constexpr int64_t kB = 4;

NamedParameters named(torch::nn::Module& m) {
  NamedParameters out;
  for (auto& it : m.named_parameters()) out.emplace_back(it.key(), it.value());
  return out;
}

std::shared_ptr<torch::optim::Optimizer> make_opt(torch::nn::Module& m, bool adam) {
  if (!adam) return std::make_shared<torch::optim::SGD>(m.parameters(), torch::optim::SGDOptions(0.1));
  return std::make_shared<torch::optim::Adam>(m.parameters(), torch::optim::AdamOptions(1e-2));
}

double horovod_vs_reference(int world, bool adam, int steps, DistributedOptimizerOptions hopt) {
  auto models = make_mlps(world + 1);
  auto d = make_data(steps, world * kB);
  {
    auto& ref = models[world];
    auto opt = make_opt(*ref, adam);
    for (int s = 0; s < steps; ++s) {
      opt->zero_grad();
      torch::mse_loss(ref->forward(d.x[s]), d.y[s]).backward();
      opt->step();
    }
  }
  std::vector<double> diff(world);
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    auto& m = models[r];
    broadcast_parameters(*m, 0, g);
    DistributedOptimizer opt(make_opt(*m, adam), named(*m), hopt, g);
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      torch::mse_loss(m->forward(shard(d.x[s], r, kB)), shard(d.y[s], r, kB)).backward();
      opt.step();
    }
    diff[r] = max_rel_diff(*m, *models[world]);
  });
  return *std::max_element(diff.begin(), diff.end());
}

DistributedOptimizerOptions small_fusion() {
  DistributedOptimizerOptions o;
  o.fusion_bytes = 128;  // several fused all-reduces per cycle
  return o;
}

class HorovodWorld : public ::testing::TestWithParam<int> {};

TEST_P(HorovodWorld, SgdMatchesSingleProcessBigBatch) {
  EXPECT_LE(horovod_vs_reference(GetParam(), false, 20, small_fusion()), 1e-5);
}

TEST_P(HorovodWorld, AdamMatchesSingleProcessBigBatch) {
  EXPECT_LE(horovod_vs_reference(GetParam(), true, 20, DistributedOptimizerOptions()), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(World, HorovodWorld, ::testing::Values(2, 3, 4));

TEST(Horovod, CompressionStaysCloseToFp32) {
  auto o = small_fusion();
  o.compression = Compression::fp16;
  EXPECT_LE(horovod_vs_reference(2, false, 5, o), 2e-3);
  o.compression = Compression::bf16;
  EXPECT_LE(horovod_vs_reference(2, false, 5, o), 2e-2);
}

// Two branches summed; the autograd engine runs the later-built branch first, so the ranks
// produce gradients in opposite orders.
struct TwoBranchImpl : torch::nn::Module {
  TwoBranchImpl() {
    torch::manual_seed(5);
    a = register_module("a", torch::nn::Linear(8, 4));
    b = register_module("b", torch::nn::Linear(8, 4));
  }
  torch::Tensor forward(const torch::Tensor& x, bool a_first) {
    if (a_first) {
      auto ya = a->forward(x);
      return ya + b->forward(x);
    }
    auto yb = b->forward(x);
    return a->forward(x) + yb;
  }
  torch::nn::Linear a{nullptr}, b{nullptr};
};
TORCH_MODULE(TwoBranch);

TEST(Horovod, DifferentGradientOrderPerRank) {
  const int world = 3, steps = 10;
  std::vector<TwoBranch> models;
  for (int i = 0; i <= world; ++i) models.emplace_back();
  auto d = make_data(steps, world * kB);
  train_reference(*models[world], d, steps,
                  [&](const torch::Tensor& x) { return models[world]->forward(x, true); });
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    auto& m = models[r];
    std::vector<std::string> order;
    // Record the order in which this rank's gradients become ready.
    for (auto& it : m->named_parameters()) {
      auto name = it.key();
      it.value().register_hook([&order, name](torch::Tensor grad) {
        order.push_back(name);
        return grad;
      });
    }
    auto o = DistributedOptimizerOptions();
    o.fusion_bytes = 16;  // one tensor per all-reduce: order matters
    DistributedOptimizer opt(std::make_shared<torch::optim::SGD>(m->parameters(), torch::optim::SGDOptions(0.1)),
                             named(*m), o, g);
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      torch::mse_loss(m->forward(shard(d.x[s], r, kB), r % 2 == 0), shard(d.y[s], r, kB)).backward();
      opt.step();
    }
    ASSERT_FALSE(order.empty());
    if (r % 2 == 0) EXPECT_EQ(order.front().substr(0, 2), "b.");
    else EXPECT_EQ(order.front().substr(0, 2), "a.");
    auto pa = m->parameters(), pb = models[world]->parameters();
    for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::allclose(pa[i], pb[i], 1e-5, 1e-6)) << "rank " << r;
  });
}

// Rank 1 skips the unused.* gradients in the last step: every rank fails with a report naming the
// tensors and rank 1, whether that step was negotiated (the first) or replayed (after good steps).
class HorovodStall : public ::testing::TestWithParam<int> {};

TEST_P(HorovodStall, NamesTheMissingRanks) {
  const int world = 3, good_steps = GetParam();
  auto models = make_mlps(world, /*extra=*/true);
  auto d = make_data(good_steps + 1, world * kB);
  std::vector<std::string> errors(world);
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store, std::chrono::seconds(10));
    auto& m = models[r];
    DistributedOptimizerOptions o;
    o.stall_warning = std::chrono::milliseconds(100);
    o.stall_error = std::chrono::milliseconds(500);
    DistributedOptimizer opt(std::make_shared<torch::optim::SGD>(m->parameters(), torch::optim::SGDOptions(0.1)),
                             named(*m), o, g);
    for (int s = 0; s <= good_steps; ++s) {
      opt.zero_grad();
      auto out = m->forward(shard(d.x[s], r, kB));
      if (r != 1 || s < good_steps) out = m->unused->forward(out);
      torch::mse_loss(out, shard(d.y[s], r, kB)).backward();
      Stopwatch sw;
      try {
        opt.step();
      } catch (const TimeoutError& e) {
        errors[r] = e.what();
      }
      EXPECT_LT(sw.seconds(), 5.0);
      if (s < good_steps) {
        ASSERT_EQ(errors[r], "") << "step " << s;
        EXPECT_EQ(opt.last_step_replayed(), s > 0) << "step " << s;
      }
    }
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_NE(errors[r].find("unused.weight' missing on ranks [1]"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("unused.bias' missing on ranks [1]"), std::string::npos) << errors[r];
  }
}

INSTANTIATE_TEST_SUITE_P(GoodStepsBefore, HorovodStall, ::testing::Values(0, 2));

// Gradients arrive a few ms apart (one negotiation cycle each), so the first step's schedule has
// several groups; later steps replay it while each rank's gradient order flips every step, and a
// rank that lingers past the patience (half the stall warning) in backward sends the step back to
// negotiation. Results must equal the single process throughout.
TEST(Horovod, ReplayedScheduleSurvivesNewOrdersAndLateRanks) {
  const int world = 3, steps = 8;
  std::vector<TwoBranch> models;
  for (int i = 0; i <= world; ++i) models.emplace_back();
  auto d = make_data(steps, world * kB);
  train_reference(*models[world], d, steps,
                  [&](const torch::Tensor& x) { return models[world]->forward(x, true); });
  const int late_step = 5;
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    auto& m = models[r];
    int step = 0;
    for (auto& it : m->named_parameters()) {
      const bool linger = it.key() == "a.weight";
      it.value().register_hook([&step, r, linger](torch::Tensor grad) {
        std::this_thread::sleep_for(std::chrono::milliseconds(4));
        if (linger && r == 2 && step == late_step)
          std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        return grad;
      });
    }
    DistributedOptimizerOptions o;
    o.fusion_bytes = 16;                        // one tensor per all-reduce
    o.replay_bucket_bytes = 1;                  // every negotiated group is a bucket of its own
    o.stall_warning = std::chrono::seconds(1);  // patience 0.5 s
    DistributedOptimizer opt(
        std::make_shared<torch::optim::SGD>(m->parameters(), torch::optim::SGDOptions(0.1)), named(*m), o, g);
    for (step = 0; step < steps; ++step) {
      opt.zero_grad();
      torch::mse_loss(m->forward(shard(d.x[step], r, kB), (r + step) % 2 == 0), shard(d.y[step], r, kB))
          .backward();
      opt.step();
      const bool replayed = step > 0 && step != late_step;
      EXPECT_EQ(opt.last_step_replayed(), replayed) << "rank " << r << " step " << step;
      if (replayed) EXPECT_LE(opt.last_cycles(), 4) << "rank " << r << " step " << step;
    }
    auto pa = m->parameters(), pb = models[world]->parameters();
    for (size_t i = 0; i < pa.size(); ++i)
      EXPECT_TRUE(torch::allclose(pa[i], pb[i], 1e-5, 1e-6)) << "rank " << r;
  });
}

// Gradients live in one arena from alloc_buffer (all-reduced there, no staging copies, for the
// 2 MiB weight here). A gradient set to none (LibTorch 2's zero_grad default) moves back into it.
TEST(Horovod, GradientsLiveInTheArenaAndSurviveSetToNone) {
  const int world = 3, steps = 4;
  auto make = [] {
    torch::manual_seed(7);
    return torch::nn::Sequential(torch::nn::Linear(512, 1024), torch::nn::Tanh(), torch::nn::Linear(1024, 2));
  };
  auto ref = make();
  std::vector<torch::nn::Sequential> models;  // built here: manual_seed is process-wide
  for (int r = 0; r < world; ++r) models.push_back(make());
  std::vector<torch::Tensor> xs, ys;
  for (int s = 0; s < steps; ++s) {
    xs.push_back(torch::randn({world * kB, 512}));
    ys.push_back(torch::randn({world * kB, 2}));
  }
  {
    torch::optim::SGD opt(ref->parameters(), torch::optim::SGDOptions(0.1));
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      torch::mse_loss(ref->forward(xs[s]), ys[s]).backward();
      opt.step();
    }
  }
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    auto& m = models[r];
    DistributedOptimizer opt(
        std::make_shared<torch::optim::SGD>(m->parameters(), torch::optim::SGDOptions(0.1)), named(*m),
        DistributedOptimizerOptions{}, g);
    for (int s = 0; s < steps; ++s) {
      if (s % 2) {
        for (auto& p : m->parameters()) p.mutable_grad() = torch::Tensor();
      } else {
        opt.zero_grad();
      }
      torch::mse_loss(m->forward(shard(xs[s], r, kB)), shard(ys[s], r, kB)).backward();
      opt.step();
      const auto* arena = m->parameters()[0].grad().storage().unsafeGetStorageImpl();
      for (auto& p : m->parameters()) ASSERT_EQ(p.grad().storage().unsafeGetStorageImpl(), arena);
    }
    auto a = m->parameters(), b = ref->parameters();
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-5, 1e-6)) << "parameter " << i << " on rank " << r;
  });
}

// Compressed, a big gradient is packed through the fusion buffer (only uncompressed CPU gradients
// of 1 MiB or more skip it), so the buffer is sized for it even when fusion_bytes is tiny.
TEST(Horovod, CompressedBigGradientsFitTheFusionBuffer) {
  const int world = 2, steps = 2;
  auto make = [] {
    torch::manual_seed(11);
    return torch::nn::Sequential(torch::nn::Linear(512, 1024), torch::nn::Tanh(), torch::nn::Linear(1024, 2));
  };
  auto ref = make();
  std::vector<torch::nn::Sequential> models;
  for (int r = 0; r < world; ++r) models.push_back(make());
  torch::manual_seed(3);
  auto x = torch::randn({world * kB, 512}), y = torch::randn({world * kB, 2});
  {
    torch::optim::SGD opt(ref->parameters(), torch::optim::SGDOptions(0.1));
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      torch::mse_loss(ref->forward(x), y).backward();
      opt.step();
    }
  }
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    auto& m = models[r];
    DistributedOptimizerOptions o;
    o.compression = Compression::bf16;
    o.fusion_bytes = 1024;
    DistributedOptimizer opt(
        std::make_shared<torch::optim::SGD>(m->parameters(), torch::optim::SGDOptions(0.1)), named(*m), o, g);
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      torch::mse_loss(m->forward(shard(x, r, kB)), shard(y, r, kB)).backward();
      opt.step();
    }
    auto a = m->parameters(), b = ref->parameters();
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_TRUE(torch::allclose(a[i], b[i], 2e-2, 1e-3)) << "parameter " << i << " on rank " << r;
  });
}

TEST(Horovod, BackwardPassesPerStepAccumulates) {
  const int world = 2, micro = 2, steps = 4;
  auto models = make_mlps(world + 1);
  auto d = make_data(steps * micro, world * kB);
  train_reference(
      *models[world], d, steps, [&](const torch::Tensor& x) { return models[world]->forward(x); }, micro);
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    auto& m = models[r];
    DistributedOptimizer opt(std::make_shared<torch::optim::SGD>(m->parameters(), torch::optim::SGDOptions(0.1)),
                             named(*m), Compression::none, micro, g);
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      for (int k = 0; k < micro; ++k)
        torch::mse_loss(m->forward(shard(d.x[s * micro + k], r, kB)), shard(d.y[s * micro + k], r, kB)).backward();
      opt.step();
    }
    EXPECT_LE(max_rel_diff(*m, *models[world]), 1e-5);
  });
}

// A group aborted between steps (gzrun's move watcher, or a peer that saw a failure first): the
// next backward must not throw (Python's autograd would turn gz::Aborted into a plain
// RuntimeError, which in-place recovery cannot tell from a bug); step() rethrows the Aborted.
TEST(Horovod, AbortedGroupFailsTheStepNotTheBackward) {
  const int world = 2;
  auto models = make_mlps(world);
  auto d = make_data(2, world * kB);
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    auto& m = models[r];
    DistributedOptimizer opt(make_opt(*m, false), named(*m), DistributedOptimizerOptions{}, g);
    opt.zero_grad();
    torch::mse_loss(m->forward(shard(d.x[0], r, kB)), shard(d.y[0], r, kB)).backward();
    opt.step();
    // Both ranks are done with the first step before either aborts (bounded: a rank whose first
    // step failed must not hang the other).
    if (store->add("stepped", 1) == world) store->set("both_stepped", to_bytes("1"));
    store->wait({"both_stepped"}, Deadline::after(std::chrono::seconds(30)));
    g->abort("test: moved to a new round");
    opt.zero_grad();
    EXPECT_NO_THROW(torch::mse_loss(m->forward(shard(d.x[1], r, kB)), shard(d.y[1], r, kB)).backward());
    EXPECT_THROW(opt.step(), Aborted);
  });
}

TEST(Horovod, BroadcastOptimizerStateMakesRanksStepAlike) {
  const int world = 2;
  auto models = make_mlps(world);
  auto d = make_data(4, kB);
  std::vector<torch::Tensor> after(world);
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    auto& m = models[r];
    torch::optim::Adam opt(m->parameters(), torch::optim::AdamOptions(1e-2));
    if (r == 0)  // rank 0 has history (moments, step counts); rank 1 is fresh
      for (int s = 0; s < 3; ++s) {
        opt.zero_grad();
        torch::mse_loss(m->forward(d.x[s]), d.y[s]).backward();
        opt.step();
      }
    broadcast_parameters(*m, 0, g);
    broadcast_optimizer_state(opt, 0, g);
    opt.zero_grad();
    torch::mse_loss(m->forward(d.x[3]), d.y[3]).backward();
    opt.step();
    std::vector<torch::Tensor> flat;
    for (auto& p : m->parameters()) flat.push_back(p.detach().reshape(-1));
    after[r] = torch::cat(flat);
  });
  EXPECT_TRUE(after[0].equal(after[1]));
}

}  // namespace

}  // namespace test_horovod
