// DistributedDataParallel: equivalence with single-process training on the whole batch, no_sync,
// bucket rebuild, unused parameters, join for uneven inputs, compression hooks.
#include <algorithm>
#include <atomic>
#include <optional>
#include <thread>

#include "gz/core/error.h"
#include "gz/torch/ddp.h"
#include "torch/support/torch_test_util.h"

// A namespace of its own: the unity build (GZ_UNITY_BUILD) compiles this file together with
// the other files of its test target.
namespace test_ddp {

namespace {
using namespace gz;
using namespace gz::test;

const bool kOneThread = [] {
  torch::set_num_threads(1);
  return true;
}();

constexpr int64_t kB = 4;  // per-rank batch

enum class Opt { sgd, adam };

std::shared_ptr<torch::optim::Optimizer> make_opt(Mlp& m, Opt o) {
  if (o == Opt::sgd) return std::make_shared<torch::optim::SGD>(m->parameters(), torch::optim::SGDOptions(0.1));
  return std::make_shared<torch::optim::Adam>(m->parameters(), torch::optim::AdamOptions(1e-2));
}

// One process, whole batch (world * kB rows per step).
void train_reference(Mlp& m, const Data& d, Opt o, int steps) {
  auto opt = make_opt(m, o);
  for (int s = 0; s < steps; ++s) {
    opt->zero_grad();
    torch::mse_loss(m->forward(d.x[s]), d.y[s]).backward();
    opt->step();
  }
}

DDPOptions small_buckets() {
  DDPOptions o;
  o.first_bucket_bytes = 64;  // several buckets even for this tiny model
  o.bucket_bytes = 300;
  return o;
}

double ddp_vs_reference(int world, Opt o, int steps, DDPOptions dopt) {
  auto models = make_mlps(world + 1);
  auto d = make_data(steps, world * kB);
  train_reference(models[world], d, o, steps);
  std::vector<double> diff(world);
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    auto& m = models[r];
    DistributedDataParallel ddp(m.ptr(), g, dopt);
    auto opt = make_opt(m, o);
    for (int s = 0; s < steps; ++s) {
      opt->zero_grad();
      auto out = ddp.forward([&] { return m->forward(shard(d.x[s], r, kB)); });
      torch::mse_loss(out, shard(d.y[s], r, kB)).backward();
      opt->step();
    }
    diff[r] = max_rel_diff(*m, *models[world]);
  });
  return *std::max_element(diff.begin(), diff.end());
}

class DDPWorld : public ::testing::TestWithParam<int> {};

TEST_P(DDPWorld, SgdMatchesSingleProcessBigBatch) {
  EXPECT_LE(ddp_vs_reference(GetParam(), Opt::sgd, 20, small_buckets()), 1e-5);
}

TEST_P(DDPWorld, AdamMatchesSingleProcessBigBatch) {
  EXPECT_LE(ddp_vs_reference(GetParam(), Opt::adam, 20, small_buckets()), 1e-4);
}

TEST_P(DDPWorld, CopyModeAndDefaultBucketsMatchToo) {
  auto o = DDPOptions();
  o.gradient_as_bucket_view = false;
  EXPECT_LE(ddp_vs_reference(GetParam(), Opt::sgd, 10, o), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(World, DDPWorld, ::testing::Values(2, 3, 4));

TEST(DDP, NoSyncAccumulationEqualsBigBatch) {
  const int world = 2, micro = 3, steps = 5;
  auto models = make_mlps(world + 1);
  auto d = make_data(steps * micro, world * kB);
  train_reference(
      *models[world], d, steps, [&](const torch::Tensor& x) { return models[world]->forward(x); }, micro);
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    auto& m = models[r];
    DistributedDataParallel ddp(m.ptr(), g, small_buckets());
    torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.1));
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      for (int k = 0; k < micro; ++k) {
        auto i = s * micro + k;
        if (k + 1 < micro) {
          auto guard = ddp.no_sync();
          torch::mse_loss(m->forward(shard(d.x[i], r, kB)), shard(d.y[i], r, kB)).backward();
        } else {
          torch::mse_loss(m->forward(shard(d.x[i], r, kB)), shard(d.y[i], r, kB)).backward();
        }
      }
      opt.step();
    }
    EXPECT_LE(max_rel_diff(*m, *models[world]), 1e-5) << "rank " << r;
  });
}

// Registered in the opposite order of use: the initial (reverse registration) bucket order is
// wrong and must be rebuilt from the observed gradient order.
struct SwappedImpl : torch::nn::Module {
  SwappedImpl() {
    torch::manual_seed(99);
    b = register_module("b", torch::nn::Linear(16, 4));
    a = register_module("a", torch::nn::Linear(8, 16));
  }
  torch::Tensor forward(const torch::Tensor& x) { return b->forward(torch::relu(a->forward(x))); }
  torch::nn::Linear b{nullptr}, a{nullptr};
};
TORCH_MODULE(Swapped);

TEST(DDP, BucketsAreRebuiltFromTheObservedOrder) {
  const int world = 2, steps = 4;
  std::vector<Swapped> models;
  for (int i = 0; i <= world; ++i) models.emplace_back();
  auto d = make_data(steps, world * kB);
  train_reference(*models[world], d, steps,
                  [&](const torch::Tensor& x) { return models[world]->forward(x); });
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    auto& m = models[r];
    DDPOptions o;
    o.first_bucket_bytes = 1;  // one parameter per bucket: the layout is the order
    o.bucket_bytes = 1;
    DistributedDataParallel ddp(m.ptr(), g, o);
    auto& red = ddp.reducer();
    auto names = red.param_names();  // b.weight, b.bias, a.weight, a.bias
    auto first_name = [&] { return names[red.bucket_layout().front().front()]; };
    EXPECT_EQ(first_name().substr(0, 2), "a.");  // reverse registration order
    EXPECT_EQ(red.num_rebuilds(), 0);
    torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.1));
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      torch::mse_loss(m->forward(shard(d.x[s], r, kB)), shard(d.y[s], r, kB)).backward();
      opt.step();
      EXPECT_EQ(red.num_rebuilds(), 1);
      EXPECT_EQ(first_name().substr(0, 2), "b.") << "layout not rebuilt from the backward order";
    }
    auto pa = m->parameters(), pb = models[world]->parameters();
    for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::allclose(pa[i], pb[i], 1e-5, 1e-6));
  });
}

TEST(DDP, UnusedParametersWorkWhenAllowed) {
  const int world = 2, steps = 5;
  auto models = make_mlps(world + 1, /*extra=*/true);
  auto d = make_data(steps, world * kB);
  train_reference(models[world], d, Opt::sgd, steps);
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    auto& m = models[r];
    auto o = small_buckets();
    o.find_unused_parameters = true;
    DistributedDataParallel ddp(m.ptr(), g, o);
    auto opt = make_opt(m, Opt::sgd);
    for (int s = 0; s < steps; ++s) {
      opt->zero_grad();
      torch::mse_loss(m->forward(shard(d.x[s], r, kB)), shard(d.y[s], r, kB)).backward();
      opt->step();
    }
    EXPECT_FALSE(m->unused->weight.grad().defined());  // unused everywhere: left alone
    EXPECT_LE(max_rel_diff(*m, *models[world]), 1e-5);
  });
}

// A parameter used in the no_sync() micro-steps but not in the synchronised last one keeps the
// gradient it accumulated, averaged like the others (PyTorch's behaviour): before, DDP zeroed it.
TEST(DDP, NoSyncKeepsTheGradientOfAParameterUnusedInTheLastMicroStep) {
  const int world = 2, micro = 3, steps = 3;
  auto uses_side = [](int k) { return k + 1 < micro; };  // not in the synchronised micro-step
  auto d = make_data(steps * micro, world * kB);
  Side ref;
  auto start = ref->side->weight.detach().clone();
  {
    torch::optim::SGD opt(ref->parameters(), torch::optim::SGDOptions(0.1));
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      for (int k = 0; k < micro; ++k)
        torch::mse_loss(ref->forward(d.x[s * micro + k], uses_side(k)), d.y[s * micro + k]).backward();
      opt.step();
    }
  }
  ASSERT_GT((ref->side->weight - start).abs().max().item<double>(), 1e-3);
  for (bool view : {true, false}) {
    std::vector<Side> models(world);
    run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
      auto g = make_comm(r, world, store);
      auto& m = models[r];
      auto o = small_buckets();
      o.find_unused_parameters = true;
      o.gradient_as_bucket_view = view;
      DistributedDataParallel ddp(m.ptr(), g, o);
      torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.1));
      for (int s = 0; s < steps; ++s) {
        opt.zero_grad();
        for (int k = 0; k < micro; ++k) {
          const int i = s * micro + k;
          std::optional<DistributedDataParallel::NoSyncGuard> guard;
          if (k + 1 < micro) guard.emplace(ddp.reducer());
          auto out = ddp.forward([&] { return m->forward(shard(d.x[i], r, kB), uses_side(k)); });
          torch::mse_loss(out, shard(d.y[i], r, kB)).backward();
        }
        opt.step();
      }
      EXPECT_LE(max_rel_diff(*m, *ref), 1e-5) << "rank " << r << " gradient_as_bucket_view " << view;
    });
  }
}

TEST(DDP, UnusedParametersAreNamedWhenNotAllowed) {
  const int world = 2;
  auto models = make_mlps(world, /*extra=*/true);
  auto d = make_data(1, world * kB);
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store, std::chrono::seconds(5));
    auto& m = models[r];
    DistributedDataParallel ddp(m.ptr(), g, small_buckets());
    try {
      torch::mse_loss(m->forward(shard(d.x[0], r, kB)), shard(d.y[0], r, kB)).backward();
      ADD_FAILURE() << "backward with an unused parameter did not throw";
    } catch (const std::exception& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("unused.weight"), std::string::npos) << msg;
      EXPECT_NE(msg.find("unused.bias"), std::string::npos) << msg;
      EXPECT_NE(msg.find("find_unused_parameters"), std::string::npos) << msg;
    }
  });
}

// Rank r has 2 + r batches; the averages count active ranks only and nobody hangs.
TEST(DDP, JoinHandlesUnevenInputs) {
  for (int world : {2, 3}) {
    auto models = make_mlps(world + 1);
    const int max_steps = 2 + world - 1;
    auto d = make_data(max_steps, world * kB);
    {
      auto& ref = models[world];
      torch::optim::SGD opt(ref->parameters(), torch::optim::SGDOptions(0.1));
      for (int s = 0; s < max_steps; ++s) {
        int active = 0;
        for (int r = 0; r < world; ++r) active += (2 + r > s);
        // Active ranks are the highest ones; their rows are the last `active` shards.
        auto x = d.x[s].narrow(0, (world - active) * kB, active * kB);
        auto y = d.y[s].narrow(0, (world - active) * kB, active * kB);
        opt.zero_grad();
        torch::mse_loss(ref->forward(x), y).backward();
        opt.step();
      }
    }
    run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
      auto g = make_comm(r, world, store, std::chrono::seconds(10));
      auto& m = models[r];
      DistributedDataParallel ddp(m.ptr(), g, small_buckets());
      torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.1));
      {
        auto join = ddp.join();
        for (int s = 0; s < 2 + r; ++s) {
          opt.zero_grad();
          auto out = ddp.forward([&] { return m->forward(shard(d.x[s], r, kB)); });
          torch::mse_loss(out, shard(d.y[s], r, kB)).backward();
          opt.step();
        }
        join.finish();
      }
      EXPECT_LE(max_rel_diff(*m, *models[world]), 1e-5) << "world " << world << " rank " << r;
    });
  }
}

TEST(DDP, CompressionHooksStayCloseToFp32) {
  const int world = 2;
  for (auto [hook, tol] : {std::make_pair(fp16_compress_hook(), 2e-3), std::make_pair(bf16_compress_hook(), 2e-2)}) {
    auto o = small_buckets();
    o.comm_hook = hook;
    double diff = ddp_vs_reference(world, Opt::sgd, 5, o);
    EXPECT_LE(diff, tol);
  }
}

}  // namespace

namespace {
struct WithBufferImpl : torch::nn::Module {
  WithBufferImpl() {
    l = register_module("l", torch::nn::Linear(8, 4));
    stat = register_buffer("stat", torch::zeros({3}));
  }
  torch::nn::Linear l{nullptr};
  torch::Tensor stat;
};

TEST(DDP, BuffersFollowRankZero) {
  const int world = 3;
  for (bool bcast : {true, false}) {
    run_ranks(world, [&](int r, std::shared_ptr<gz::Store> store) {
      auto g = make_comm(r, world, store);
      auto m = std::make_shared<WithBufferImpl>();
      m->stat.fill_(r + 1.0);
      gz::DDPOptions o;
      o.broadcast_buffers = bcast;
      gz::DistributedDataParallel ddp(m, g, o);
      EXPECT_TRUE(m->stat.equal(torch::full({3}, 1.0))) << "construction broadcasts buffers from rank 0";
      m->stat.fill_(10.0 + r);
      ddp.pre_forward();
      EXPECT_TRUE(m->stat.equal(torch::full({3}, bcast ? 10.0 : 10.0 + r))) << "broadcast_buffers " << bcast;
    });
  }
}
}  // namespace

namespace {
// A bucket op that outlives its deadline: backward gives up waiting for it, and the DDP object is
// destroyed. The destructor must abort the group and wait until the op has returned, since the op
// still uses the Reducer's bucket (heap-use-after-free under ASan before; here also checked
// directly: the hook is never still running once the DDP object is gone).
TEST(DDP, DestroyedWhileABucketOpOutlivesItsDeadline) {
  const int world = 2;
  auto models = make_mlps(world);
  auto d = make_data(1, world * kB);
  std::atomic<int> running_on[world] = {};
  run_ranks(world, [&](int r, std::shared_ptr<gz::Store> store) {
    auto g = make_comm(r, world, store, std::chrono::milliseconds(300));
    auto& m = models[r];
    auto& running = running_on[r];
    gz::Stopwatch sw;
    {
      gz::DistributedDataParallel ddp(m.ptr(), g, small_buckets());
      ddp.register_comm_hook([&](gz::comm::Communicator& group, gz::GradBucket& bucket) {
        ++running;
        // Far past the 300 ms op deadline, until the owner aborts the group.
        for (int i = 0; i < 1000 && !group.aborted(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        bucket.buffer.add_(1.0);  // touches the Reducer's bucket
        --running;
      });
      auto out = ddp.forward([&] { return m->forward(shard(d.x[0], r, kB)); });
      EXPECT_ANY_THROW(torch::mse_loss(out, shard(d.y[0], r, kB)).backward());
    }
    EXPECT_EQ(running.load(), 0) << "a bucket hook still runs after its DDP object was destroyed";
    EXPECT_TRUE(g->aborted());
    EXPECT_LT(sw.seconds(), 8.0);
  });
}
}  // namespace

}  // namespace test_ddp
