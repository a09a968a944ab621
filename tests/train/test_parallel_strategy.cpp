// The parallel modes: parsed once at the boundary, one strategy object per mode; every mode's
// step must equal one process training on the whole batch.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "gz/comm/shm.h"
#include "gz/core/error.h"
#include "gz/core/phase.h"
#include "gz/store/mem_store.h"
#include "gz/train/parallel_strategy.h"
#include "support/run_ranks.h"
#include "train/strategy/fsdp_strategy.h"

// A namespace of its own: the unity build (GZ_UNITY_BUILD) compiles this file together with
// the other files of its test target.
namespace test_parallel_strategy {

namespace {

using gz::train::ParallelMode;

struct TinyImpl : gz::train::ModelImpl {
  TinyImpl() {
    fc = register_module("fc", torch::nn::Linear(6, 3));
    // Fixed weights, not the global generator: ranks run as threads and build their models at the
    // same time, so seeded draws interleave and rank 0 (whose weights are broadcast) could start
    // from other weights than the one-process reference (the test failed about 1 run in 4).
    torch::NoGradGuard ng;
    fc->weight.copy_(torch::linspace(-0.5, 0.5, 18).reshape({3, 6}));
    fc->bias.copy_(torch::tensor({0.1, -0.2, 0.05}));
  }
  torch::Tensor forward(torch::Tensor x) override { return fc->forward(x); }
  std::shared_ptr<gz::train::ModelImpl> clone_model() const override {
    auto copy = std::make_shared<TinyImpl>();
    torch::NoGradGuard ng;
    for (size_t i = 0; i < parameters().size(); ++i) copy->parameters()[i].copy_(parameters()[i]);
    return copy;
  }
  torch::nn::Linear fc{nullptr};
};

torch::Tensor batch_x() { return torch::arange(48, torch::kFloat32).reshape({8, 6}).sin(); }
torch::Tensor batch_y() { return torch::tensor({0, 1, 2, 0, 1, 2, 0, 1}, torch::kLong); }

// Two optimizer steps of `mode` on rows [lo, hi) of the batch; the loss is scaled so that the
// average over `world` ranks is the mean over the whole batch. Returns the flat parameters.
torch::Tensor train_two_steps(ParallelMode mode, gz::comm::CommPtr group, int64_t lo, int64_t hi, int world) {
  auto model = std::make_shared<TinyImpl>();
  auto opt =
      std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  gz::train::StrategyOptions so;
  so.mode = mode;
  so.group = group;
  so.dp_devices.assign(2, torch::Device(torch::kCPU));
  auto s = gz::train::make_strategy(so, model, opt);
  EXPECT_EQ(s->mode(), mode);
  for (int step = 0; step < 2; ++step) {
    s->zero_grad();
    s->begin_micro_step(true);
    auto out = s->forward(batch_x().slice(0, lo, hi));
    auto loss = torch::nn::functional::cross_entropy(out, batch_y().slice(0, lo, hi)) *
                (static_cast<double>(hi - lo) * world / 8.0);
    loss.backward();
    s->end_micro_step();
    s->step();
  }
  std::vector<torch::Tensor> flat;
  for (auto& p : model->parameters()) flat.push_back(p.detach().reshape({-1}).clone());
  return torch::cat(flat);
}

TEST(ParallelMode, ParsedAtTheBoundary) {
  for (auto m : {ParallelMode::single, ParallelMode::ddp, ParallelMode::horovod, ParallelMode::dp})
    EXPECT_EQ(gz::train::parse_parallel_mode(gz::train::to_string(m)), m);
  EXPECT_TRUE(gz::train::needs_group(ParallelMode::ddp));
  EXPECT_TRUE(gz::train::needs_group(ParallelMode::horovod));
  EXPECT_FALSE(gz::train::needs_group(ParallelMode::dp));
  try {
    gz::train::parse_parallel_mode("fsdp");
    FAIL() << "accepted an unknown mode";
  } catch (const gz::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'fsdp' (known: single, ddp, horovod, dp)"), std::string::npos)
        << e.what();
  }
}

TEST(ParallelStrategy, RefusesWhatTheModeCannotDo) {
  auto model = std::make_shared<TinyImpl>();
  auto opt = std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.1));
  gz::train::StrategyOptions so;
  so.mode = ParallelMode::ddp;
  EXPECT_THROW(gz::train::make_strategy(so, model, opt), gz::InvalidArgument);  // no group
  so.mode = ParallelMode::single;
  so.zero_stage = 1;
  EXPECT_THROW(gz::train::make_strategy(so, model, opt), gz::InvalidArgument);  // ZeRO needs ddp
}

// Every mode trains like one process on the whole batch (2 ranks as threads over shm).
TEST(ParallelStrategy, EveryModeMatchesOneProcess) {
  const torch::Tensor ref = train_two_steps(ParallelMode::single, nullptr, 0, 8, 1);
  EXPECT_TRUE(torch::allclose(train_two_steps(ParallelMode::dp, nullptr, 0, 8, 1), ref, 1e-5, 1e-6));
  for (auto mode : {ParallelMode::ddp, ParallelMode::horovod}) {
    std::vector<torch::Tensor> got(2);
    gz::test::run_ranks(2, [&](int rank, std::shared_ptr<gz::Store> store) {
      gz::comm::ShmOptions o;
      o.timeout = std::chrono::seconds(30);
      auto g = gz::comm::create_shm_communicator(rank, 2, store, o);
      got[static_cast<size_t>(rank)] = train_two_steps(mode, g, rank * 4, rank * 4 + 4, 2);
    });
    for (auto& t : got) EXPECT_TRUE(torch::allclose(t, ref, 1e-5, 1e-6)) << gz::train::to_string(mode);
  }
}

// StrategyOptions::fsdp (gz-bench --no-prefetch, the trainer's fsdp_prefetch) is what the stage-3
// strategy builds fully_shard with. Mutation check: fully_shard() without o.fsdp in
// fsdp_strategy.cpp fails here.
TEST(ParallelStrategy, Stage3TakesItsFullyShardOptions) {
  for (bool prefetch : {true, false}) {
    auto model = std::make_shared<TinyImpl>();
    auto opt = std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.1));
    gz::train::StrategyOptions so;
    so.mode = ParallelMode::ddp;
    so.zero_stage = 3;
    so.fsdp.prefetch = prefetch;
    so.fsdp.reshard_after_forward = !prefetch;
    so.group = gz::comm::create_shm_communicator(0, 1, std::make_shared<gz::MemStore>());
    auto s = gz::train::make_strategy(so, model, opt);
    auto* z3 = gz::train::fsdp_hooks(*s);
    ASSERT_NE(z3, nullptr);
    EXPECT_EQ(z3->fsdp().options().prefetch, prefetch);
    EXPECT_EQ(z3->fsdp().options().reshard_after_forward, !prefetch);
  }
}

// ZeRO's waits for other ranks (the last step's parameter all-gathers in synchronize(), the
// sharded norm in clip_grad_norm()) count as comm, not as the phase around them: otherwise the
// straggler report charges a fast rank's wait for a slow one to its optimizer. Mutation check:
// removing either ScopedPhase in ddp_strategy.cpp leaves comm unchanged here.
TEST(ParallelStrategy, ZeroWaitsAreMarkedAsComm) {
  for (int stage : {1, 2}) {
    auto model = std::make_shared<TinyImpl>();
    auto opt = std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.1));
    gz::train::StrategyOptions so;
    so.mode = ParallelMode::ddp;
    so.zero_stage = stage;
    so.group = gz::comm::create_shm_communicator(0, 1, std::make_shared<gz::MemStore>());
    auto s = gz::train::make_strategy(so, model, opt);
    s->zero_grad();
    s->begin_micro_step(true);
    torch::nn::functional::cross_entropy(s->forward(batch_x()), batch_y()).backward();
    s->end_micro_step();
    gz::set_phase(gz::Phase::optimizer);
    auto before = gz::phase_totals();
    s->clip_grad_norm(1.0);
    auto after = gz::phase_totals();
    EXPECT_GT(after.of(gz::Phase::comm) - before.of(gz::Phase::comm), 0) << "clip, stage " << stage;
    EXPECT_EQ(gz::current_phase().phase, gz::Phase::optimizer) << "the mark is restored";
    s->step();
    before = gz::phase_totals();
    s->synchronize();
    after = gz::phase_totals();
    EXPECT_GT(after.of(gz::Phase::comm) - before.of(gz::Phase::comm), 0) << "synchronize, stage " << stage;
    gz::set_phase(gz::Phase::idle);
  }
}

}  // namespace

}  // namespace test_parallel_strategy
