// Horovod mode, replayed schedule: one confirmation for every group that all ranks already hold.
#include <future>
#include <thread>

#include "gz/torch/distributed_optimizer.h"
#include "torch/support/torch_test_util.h"

// A namespace of its own: the unity build (GZ_UNITY_BUILD) compiles this file together with
// the other files of its test target.
namespace test_horovod_replay {

namespace {
using namespace gz;
using namespace gz::test;

TEST(HorovodReplay, GroupsReadyEverywhereShareOneConfirmation) {
  // Step 0: gradients arrive 4 ms apart, so negotiation makes several groups (buckets of one each).
  // Step 1 replays them with the progress thread held until backward is over, as when the wire
  // lags behind backward: every group is then ready everywhere at the first confirmation, which
  // must cover them all (one cycle), and the result must still equal the single process.
  const int world = 2, steps = 2;
  constexpr int64_t kB = 4;
  auto models = make_mlps(world + 1);
  auto d = make_data(steps, world * kB);
  train_reference(*models[world], d, steps,
                  [&](const torch::Tensor& x) { return models[world]->forward(x); });
  std::vector<int> cycles(world * steps, -1);
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    auto& m = models[r];
    int step = 0;
    for (auto& p : m->parameters())
      p.register_hook([&step](torch::Tensor grad) {
        if (step == 0) std::this_thread::sleep_for(std::chrono::milliseconds(4));
        return grad;
      });
    DistributedOptimizerOptions o;
    o.fusion_bytes = 16;
    o.replay_bucket_bytes = 1;
    NamedParameters named;
    for (auto& it : m->named_parameters()) named.emplace_back(it.key(), it.value());
    DistributedOptimizer opt(
        std::make_shared<torch::optim::SGD>(m->parameters(), torch::optim::SGDOptions(0.1)), named, o, g);
    for (step = 0; step < steps; ++step) {
      opt.zero_grad();
      std::promise<void> release;
      comm::WorkPtr hold;
      if (step == 1) hold = g->submit([f = release.get_future().share()] { f.wait(); });
      torch::mse_loss(m->forward(shard(d.x[step], r, kB)), shard(d.y[step], r, kB)).backward();
      if (hold) release.set_value();
      opt.step();
      if (hold) hold->wait();
      cycles[r * steps + step] = opt.last_cycles();
      if (step == 1) EXPECT_TRUE(opt.last_step_replayed());
    }
    EXPECT_LE(max_rel_diff(*m, *models[world]), 1e-5) << "rank " << r;
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_GE(cycles[r * steps], 2) << "rank " << r << ": step 0 made a single group; the test needs several";
    EXPECT_EQ(cycles[r * steps + 1], 1)
        << "rank " << r << ": one confirmation per group instead of one for all";
  }
}

}  // namespace

}  // namespace test_horovod_replay
