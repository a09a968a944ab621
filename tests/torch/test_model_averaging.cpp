// Local SGD (PeriodicModelAverager, post_local_sgd_hook) and asynchronous model averaging
// (AsyncModelAverager): H = 1 equals DDP, the warm-up and the period, the staleness bound, and the
// final synchronisation, over shm and over Gloo (TCP).
#include <atomic>
#include <chrono>
#include <thread>

#include "gz/comm/factory.h"
#include "gz/core/error.h"
#include "gz/torch/async_model_averager.h"
#include "gz/torch/ddp.h"
#include "gz/torch/local_sgd.h"
#include "torch/support/slow_comm.h"
#include "torch/support/torch_test_util.h"

// A namespace of its own: the unity build (GZ_UNITY_BUILD) compiles this file together with
// the other files of its test target.
namespace test_model_averaging {

namespace {
using namespace gz;
using namespace gz::test;

const bool kOneThread = [] {
  torch::set_num_threads(1);
  return true;
}();

constexpr int64_t kB = 4;  // per-rank batch

comm::CommPtr make_backend_comm(const std::string& backend, int rank, int world,
                                std::shared_ptr<Store> store) {
  comm::CommOptions o;
  o.backend = backend;
  o.rank = rank;
  o.size = world;
  o.store = std::move(store);
  o.timeout = std::chrono::seconds(30);
  o.iface = "127.0.0.1";
  return comm::create_communicator(o);
}

std::vector<torch::Tensor> params_of(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

bool same(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (!torch::equal(a[i], b[i])) return false;
  return true;
}

// `world` ranks train an MLP with SGD + momentum on their shards for `steps` steps: plain DDP, or
// local SGD (post_local_sgd_hook(W) + PeriodicModelAverager(H, W)). Returns every rank's
// parameters after every step.
std::vector<std::vector<std::vector<torch::Tensor>>> train(int world, int steps, bool local_sgd,
                                                           int64_t period, int64_t warmup) {
  auto models = make_mlps(world);
  auto d = make_data(steps, world * kB);
  std::vector<std::vector<std::vector<torch::Tensor>>> history(static_cast<size_t>(world));
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    auto& m = models[static_cast<size_t>(r)];
    DDPOptions o;
    if (local_sgd) o.comm_hook = post_local_sgd_hook(warmup);
    DistributedDataParallel ddp(m.ptr(), g, o);
    LocalSGDOptions lo;
    lo.period = period;
    lo.warmup_steps = warmup;
    std::unique_ptr<PeriodicModelAverager> avg;
    if (local_sgd) avg = std::make_unique<PeriodicModelAverager>(*m, g, lo);
    torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      auto out = ddp.forward([&] { return m->forward(shard(d.x[static_cast<size_t>(s)], r, kB)); });
      torch::mse_loss(out, shard(d.y[static_cast<size_t>(s)], r, kB)).backward();
      opt.step();
      if (avg) avg->step();
      history[static_cast<size_t>(r)].push_back(params_of(*m));
    }
  });
  return history;
}

// SGD with momentum is linear in the gradient, so averaging the parameters after every local step
// is averaging the gradients before it.
TEST(LocalSGD, PeriodOneEqualsDdp) {
  for (int world : {2, 3}) {
    const int steps = 15;
    auto ddp = train(world, steps, false, 1, 0);
    auto local = train(world, steps, true, 1, 0);
    for (int r = 0; r < world; ++r) {
      const auto& a = local[static_cast<size_t>(r)].back();
      const auto& b = ddp[static_cast<size_t>(r)].back();
      for (size_t i = 0; i < a.size(); ++i) {
        const double diff = (a[i] - b[i]).abs().max().item<double>() / b[i].abs().max().item<double>();
        EXPECT_LT(diff, 1e-5) << "world " << world << " rank " << r << " param " << i;
      }
    }
  }
}

// W = 2 steps of DDP (replicas equal), then local steps; averages after steps 5 and 8 (H = 3).
TEST(LocalSGD, WarmupThenEveryPeriodSteps) {
  const int world = 2, steps = 10;
  auto h = train(world, steps, true, 3, 2);
  auto ddp = train(world, steps, false, 1, 0);
  for (int s = 0; s < steps; ++s) {
    const int t = s + 1;
    const bool expect_equal = t <= 2 || t == 5 || t == 8;
    EXPECT_EQ(same(h[0][static_cast<size_t>(s)], h[1][static_cast<size_t>(s)]), expect_equal)
        << "after step " << t;
  }
  // The warm-up is DDP exactly.
  for (int s = 0; s < 2; ++s)
    EXPECT_TRUE(same(h[0][static_cast<size_t>(s)], ddp[0][static_cast<size_t>(s)])) << s;
}

TEST(LocalSGD, CountsTheBytesOfEachAverage) {
  const int world = 2;
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    auto m = make_mlps(1)[0];
    LocalSGDOptions o;
    o.period = 2;
    o.stats = std::make_shared<CommStats>();
    PeriodicModelAverager avg(*m, g, o);
    for (int s = 0; s < 5; ++s) avg.step();
    int64_t n = 0;
    for (auto& p : m->parameters()) n += p.numel();
    EXPECT_EQ(avg.averages(), 2);
    EXPECT_EQ(o.stats->bytes.load(), static_cast<uint64_t>(2 * n * 4));
  });
}

// ---------------------------------------------------------------------------------------------
// Asynchronous averaging

class AsyncAveraging : public ::testing::TestWithParam<std::string> {};

// Ranks at different speeds: rank r sleeps r x 4 ms per step, so rank 0 would run far ahead. After
// every step() of rank t, no rank may be more than S steps behind (each rank publishes its step
// count before calling step(), so that count is at least the step of any snapshot it sent), the
// averager's own staleness() is within S, and the fast rank must have waited for the slow ones.
TEST_P(AsyncAveraging, RespectsTheStalenessBound) {
  const int world = 3, steps = 40;
  const int64_t bound = 2;
  std::vector<std::atomic<int64_t>> at(world);
  for (auto& a : at) a.store(0);
  std::vector<int64_t> worst_gap(world, 0), worst_staleness(world, 0), waits(world, 0), rounds(world, 0);
  std::vector<std::vector<torch::Tensor>> final_params(world);
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_backend_comm(GetParam(), r, world, store);
    auto w = torch::zeros({64});
    AsyncAveragingOptions o;
    o.max_staleness = bound;
    AsyncModelAverager avg({w}, {}, g, o);
    for (int t = 1; t <= steps; ++t) {
      std::this_thread::sleep_for(std::chrono::milliseconds(4 * r));
      w.add_(static_cast<double>(r + 1));  // the "optimizer step"
      at[static_cast<size_t>(r)].store(t);
      avg.step();
      for (int q = 0; q < world; ++q)
        worst_gap[static_cast<size_t>(r)] =
            std::max(worst_gap[static_cast<size_t>(r)], t - at[static_cast<size_t>(q)].load());
      worst_staleness[static_cast<size_t>(r)] =
          std::max(worst_staleness[static_cast<size_t>(r)], avg.staleness());
    }
    avg.synchronize();
    waits[static_cast<size_t>(r)] = avg.waits();
    rounds[static_cast<size_t>(r)] = avg.rounds();
    final_params[static_cast<size_t>(r)] = {w.clone()};
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_LE(worst_gap[static_cast<size_t>(r)], bound) << "rank " << r << " ran ahead of a slower rank";
    EXPECT_LE(worst_staleness[static_cast<size_t>(r)], bound) << "rank " << r;
    EXPECT_TRUE(same(final_params[static_cast<size_t>(r)], final_params[0]))
        << "rank " << r << " after synchronize()";
  }
  EXPECT_GT(waits[0], 0) << "the fast rank never waited";
  EXPECT_GT(rounds[0], 5) << "hardly any rounds ran";
  // Averaging mixed the ranks' increments (1, 2, 3 per step): the result lies strictly between.
  const double v = final_params[0][0][0].item<double>();
  EXPECT_GT(v, 1.0 * steps);
  EXPECT_LT(v, 3.0 * steps);
}

// No training: the first folded round replaces each rank's parameters by the average, and
// synchronize() leaves every rank with exactly the same values.
TEST_P(AsyncAveraging, SynchronizeGivesEveryRankTheMean) {
  const int world = 3;
  std::vector<std::vector<torch::Tensor>> out(world);
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_backend_comm(GetParam(), r, world, store);
    auto p = torch::full({5, 3}, static_cast<float>(r) * 2);
    auto buf = torch::full({7}, static_cast<float>(r));
    auto step = torch::tensor({r}, torch::kLong);  // an integer buffer: left alone
    AsyncAveragingOptions o;
    o.max_staleness = 3;
    AsyncModelAverager avg({p}, {buf, step}, g, o);
    for (int t = 0; t < 4; ++t) avg.step();
    // By step 4 the bound (3) forced the first round in: it replaced the parameters by the average
    // (nothing changed since the snapshot), before any synchronize().
    EXPECT_GE(avg.rounds(), 1);
    EXPECT_TRUE(torch::allclose(p, torch::full({5, 3}, 2.0f)))
        << "rank " << r << " after a folded round: " << p[0][0];
    avg.synchronize();
    out[static_cast<size_t>(r)] = {p.clone(), buf.clone(), step.clone()};
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(torch::allclose(out[static_cast<size_t>(r)][0], torch::full({5, 3}, 2.0f))) << r;
    EXPECT_TRUE(torch::allclose(out[static_cast<size_t>(r)][1], torch::full({7}, 1.0f))) << r;
    EXPECT_EQ(out[static_cast<size_t>(r)][2].item<int64_t>(), r) << "integer buffers are not averaged";
    EXPECT_TRUE(torch::equal(out[static_cast<size_t>(r)][0], out[0][0]));
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, AsyncAveraging, ::testing::Values("shm", "gloo"),
                         [](const auto& info) { return info.param; });

// A rank that stops without synchronize() aborts its round: the others fail promptly instead of
// waiting for the op deadline.
TEST(AsyncAveraging, PeerDroppingOutFailsTheOthersPromptly) {
  const int world = 2;
  std::vector<std::string> errors(world);
  std::vector<double> seconds(world, 0);
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store, std::chrono::seconds(20));
    auto w = torch::zeros({16});
    AsyncAveragingOptions o;
    o.max_staleness = 1;
    gz::Stopwatch sw;
    try {
      auto avg = std::make_unique<AsyncModelAverager>(std::vector<torch::Tensor>{w},
                                                      std::vector<torch::Tensor>{}, g, o);
      avg->step();
      if (r == 1) {
        avg.reset();  // leaves with a round in flight
        return;
      }
      for (int t = 0; t < 50; ++t) avg->step();
      avg->synchronize();
    } catch (const gz::Error& e) {
      errors[static_cast<size_t>(r)] = e.what();
    }
    seconds[static_cast<size_t>(r)] = sw.seconds();
  });
  EXPECT_FALSE(errors[0].empty()) << "rank 0 should fail: its peer left";
  EXPECT_LT(seconds[0], 10.0) << errors[0];
}

// A round whose all-reduces each finish just before their own deadline (header, f32 flat, f64
// flat: about 3 x 1.7 s) outlives the round's Work deadline (2 s + 2 s of grace): step() gives up
// waiting while the progress thread still works on the averager's buffers. The averager must abort
// that round and wait for it before its memory goes; before, the destructor saw no round in flight
// and freed the buffers under it (a heap-use-after-free in test.sh's ASan stage).
TEST(AsyncAveraging, ATimedOutRoundNeverOutlivesTheAverager) {
  const int world = 2;
  auto state = std::make_shared<SlowCommState>();
  std::vector<int> running_after(world, -1);
  std::vector<std::string> errors(world);
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = SlowComm::make(make_comm(r, world, store), std::chrono::seconds(2), state);
    std::vector<torch::Tensor> params{torch::ones({64}), torch::ones({32}, torch::kFloat64)};
    AsyncAveragingOptions o;
    o.max_staleness = 0;  // step() waits for the round
    {
      AsyncModelAverager avg(params, {}, g, o);
      try {
        avg.step();
        ADD_FAILURE() << "rank " << r << ": a round past its deadline did not fail step()";
      } catch (const gz::Error& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    }
    running_after[static_cast<size_t>(r)] = state->running_on[static_cast<size_t>(r)].load();
  });
  state->abort_all("test over");  // before the fix: lets the orphaned round end
  while (state->running() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  state->release();
  for (int r = 0; r < world; ++r)
    EXPECT_EQ(running_after[static_cast<size_t>(r)], 0)
        << "rank " << r << ": a round still runs on the buffers of a destroyed averager ("
        << errors[static_cast<size_t>(r)] << ")";
}

}  // namespace

}  // namespace test_model_averaging
