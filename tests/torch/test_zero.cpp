// ZeroRedundancyOptimizer: stages 1 and 2 equal plain DDP (SGD with momentum, AdamW, FusedAdamW;
// 1-3 ranks; blocks that cut parameters and end in padding), stage 2 keeps no whole gradients,
// the state is sharded, checkpoints are the unsharded format and resume on other world sizes.
#include <torch/optim/lbfgs.h>

#include <optional>
#include <sstream>

#include "gz/core/error.h"
#include "gz/torch/ddp.h"
#include "gz/torch/fused_adamw.h"
#include "gz/torch/zero_redundancy_optimizer.h"
#include "torch/support/torch_test_util.h"
#include "torch/torch_compat.h"

// A namespace of its own: the unity build (GZ_UNITY_BUILD) compiles this file together with
// the other files of its test target.
namespace test_zero {

namespace {
using namespace gz;
using namespace gz::test;

const bool kOneThread = [] {
  torch::set_num_threads(1);
  return true;
}();

constexpr int64_t kB = 4;  // rows per rank per step at the reference world size

enum class Kind { sgd, adamw, fused, adamw_groups };
const char* name_of(Kind k) {
  switch (k) {
    case Kind::sgd:
      return "sgd";
    case Kind::adamw:
      return "adamw";
    case Kind::fused:
      return "fused";
    default:
      return "adamw_groups";
  }
}

std::shared_ptr<torch::optim::Optimizer> make_opt(Mlp& m, Kind k) {
  namespace o = torch::optim;
  switch (k) {
    case Kind::sgd:
      return std::make_shared<o::SGD>(m->parameters(), o::SGDOptions(0.05).momentum(0.9).weight_decay(1e-3));
    case Kind::adamw:
      return std::make_shared<o::AdamW>(m->parameters(), o::AdamWOptions(1e-2).weight_decay(0.1));
    case Kind::fused:
      return std::make_shared<FusedAdamW>(m->parameters(), o::AdamWOptions(1e-2).weight_decay(0.1));
    default: {
      // Two groups with different options: buckets must not mix them.
      std::vector<o::OptimizerParamGroup> groups;
      groups.emplace_back(m->l1->parameters(),
                          std::make_unique<o::AdamWOptions>(o::AdamWOptions(1e-2).weight_decay(0.1)));
      groups.emplace_back(m->l2->parameters(),
                          std::make_unique<o::AdamWOptions>(o::AdamWOptions(3e-3).weight_decay(0)));
      return std::make_shared<o::AdamW>(groups, o::AdamWOptions(1e-3));
    }
  }
}

// Three buckets with these sizes on Mlp (l2.bias | l2.weight, l1.bias | l1.weight): at 2 and 3
// ranks blocks cut parameters and the last block of a bucket is partly padding.
DDPOptions small_buckets() {
  DDPOptions o;
  o.first_bucket_bytes = 16;
  o.bucket_bytes = 300;
  return o;
}
ZeroOptions zero_opts(int stage) {
  ZeroOptions z;
  z.stage = stage;
  z.first_bucket_bytes = 16;
  z.bucket_bytes = 300;
  return z;
}

std::vector<torch::Tensor> snapshot(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

double max_rel(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double scale = std::max(b[i].abs().max().item<double>(), 1e-12);
    worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>() / scale);
  }
  return worst;
}

void train_step(DistributedDataParallel& ddp, Mlp& m, torch::optim::Optimizer& opt, const Data& d, int s,
                int r, int64_t rows, double clip = 0, ZeroRedundancyOptimizer* zero = nullptr) {
  opt.zero_grad();
  auto out = ddp.forward([&] { return m->forward(shard(d.x[s], r, rows)); });
  torch::mse_loss(out, shard(d.y[s], r, rows)).backward();
  if (clip > 0) {
    if (zero)
      zero->clip_grad_norm_(clip);
    else
      torch::nn::utils::clip_grad_norm_(m->parameters(), clip);
  }
  opt.step();
}

// Plain DDP over `world` ranks: every rank's parameters after `steps` (all equal).
std::vector<torch::Tensor> run_ddp(int world, Kind k, const Data& d, int steps, double clip = 0) {
  auto models = make_mlps(world);
  std::vector<torch::Tensor> out;
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    auto& m = models[r];
    DistributedDataParallel ddp(m.ptr(), g, small_buckets());
    auto opt = make_opt(m, k);
    for (int s = 0; s < steps; ++s) train_step(ddp, m, *opt, d, s, r, kB, clip);
    if (r == 0) out = snapshot(*m);
  });
  return out;
}

// ZeRO over `world` ranks; checks every rank ends with the same parameters; returns rank 0's.
std::vector<torch::Tensor> run_zero(int world, int stage, Kind k, const Data& d, int steps, double clip = 0) {
  auto models = make_mlps(world);
  std::vector<std::vector<torch::Tensor>> out(world);
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    auto& m = models[r];
    DistributedDataParallel ddp(m.ptr(), g, small_buckets());
    ZeroRedundancyOptimizer opt(ddp, make_opt(m, k), zero_opts(stage));
    EXPECT_EQ(opt.buckets().size(), k == Kind::adamw_groups ? 4u : 3u);  // groups do not share buckets
    for (int s = 0; s < steps; ++s) train_step(ddp, m, opt, d, s, r, kB, clip, &opt);
    opt.synchronize();
    out[r] = snapshot(*m);
  });
  for (int r = 1; r < world; ++r)
    EXPECT_EQ(max_rel(out[r], out[0]), 0) << "rank " << r << " differs from rank 0";
  return out[0];
}

using Case = std::tuple<int, int, Kind>;  // world, stage, optimizer
class ZeroVsDdp : public ::testing::TestWithParam<Case> {};

TEST_P(ZeroVsDdp, ParametersEqualPlainDdp) {
  const auto [world, stage, kind] = GetParam();
  const int steps = 6;
  auto d = make_data(steps, world * kB);
  auto ref = run_ddp(world, kind, d, steps);
  auto got = run_zero(world, stage, kind, d, steps);
  auto start = snapshot(*make_mlps(1)[0]);
  ASSERT_GT(max_rel(ref, start), 1e-2) << "training did not move the parameters";
  EXPECT_LE(max_rel(got, ref), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Zero, ZeroVsDdp,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(1, 2),
                                            ::testing::Values(Kind::sgd, Kind::adamw, Kind::fused)),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return "w" + std::to_string(std::get<0>(i.param)) + "_stage" +
                                  std::to_string(std::get<1>(i.param)) + "_" + name_of(std::get<2>(i.param));
                         });

TEST(Zero, ParamGroupsAndClippingEqualPlainDdp) {
  const int world = 3, steps = 5;
  auto d = make_data(steps, world * kB);
  for (int stage : {1, 2}) {
    EXPECT_LE(max_rel(run_zero(world, stage, Kind::adamw_groups, d, steps),
                      run_ddp(world, Kind::adamw_groups, d, steps)),
              1e-6)
        << "stage " << stage;
    // A small max norm so that clipping scales every step.
    EXPECT_LE(
        max_rel(run_zero(world, stage, Kind::sgd, d, steps, 0.05), run_ddp(world, Kind::sgd, d, steps, 0.05)),
        1e-5)
        << "stage " << stage << " with clipping";
  }
}

TEST(Zero, NoSyncAccumulationEqualsPlainDdp) {
  const int world = 2, micro = 3, steps = 4;
  auto d = make_data(steps * micro, world * kB);
  auto models = make_mlps(2 * world);
  std::vector<std::vector<torch::Tensor>> out(2 * world);
  for (int zero = 0; zero < 2; ++zero) {
    run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
      auto g = make_comm(r, world, store);
      auto& m = models[zero * world + r];
      DistributedDataParallel ddp(m.ptr(), g, small_buckets());
      std::shared_ptr<torch::optim::Optimizer> opt = make_opt(m, Kind::adamw);
      if (zero) opt = std::make_shared<ZeroRedundancyOptimizer>(ddp, opt, zero_opts(2));
      for (int s = 0; s < steps; ++s) {
        opt->zero_grad();
        for (int k = 0; k < micro; ++k) {
          const int i = s * micro + k;
          std::optional<DistributedDataParallel::NoSyncGuard> guard;
          if (k + 1 < micro) guard.emplace(ddp.reducer());
          auto out = ddp.forward([&] { return m->forward(shard(d.x[i], r, kB)); });
          torch::mse_loss(out, shard(d.y[i], r, kB)).backward();
        }
        opt->step();
      }
      if (zero) std::static_pointer_cast<ZeroRedundancyOptimizer>(opt)->synchronize();
      out[zero * world + r] = snapshot(*m);
    });
  }
  EXPECT_LE(max_rel(out[world], out[0]), 1e-6);
  EXPECT_LE(max_rel(out[world + 1], out[1]), 1e-6);
}

// Several synchronised backward passes before one step (no no_sync(), valid DDP code): the
// gradients add up as with plain DDP. Stage 2 used to keep only the last backward's gradient (each
// reduce-scatter overwrote the shard and the transient buckets had freed the earlier gradients).
TEST(Zero, SeveralBackwardsBeforeAStepEqualPlainDdp) {
  const int world = 2, micro = 3, steps = 3;
  auto d = make_data(steps * micro, world * kB);
  std::vector<std::vector<torch::Tensor>> ref;
  for (int stage : {0, 1, 2}) {  // 0: plain DDP, the reference
    auto models = make_mlps(world);
    std::vector<std::vector<torch::Tensor>> out(world);
    run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
      auto g = make_comm(r, world, store);
      auto& m = models[r];
      DistributedDataParallel ddp(m.ptr(), g, small_buckets());
      std::shared_ptr<torch::optim::Optimizer> opt = make_opt(m, Kind::adamw);
      if (stage > 0) opt = std::make_shared<ZeroRedundancyOptimizer>(ddp, opt, zero_opts(stage));
      for (int s = 0; s < steps; ++s) {
        opt->zero_grad();
        for (int k = 0; k < micro; ++k) {
          const int i = s * micro + k;
          auto out = ddp.forward([&] { return m->forward(shard(d.x[i], r, kB)); });
          torch::mse_loss(out, shard(d.y[i], r, kB)).backward();
        }
        opt->step();
      }
      if (stage > 0) std::static_pointer_cast<ZeroRedundancyOptimizer>(opt)->synchronize();
      out[r] = snapshot(*m);
    });
    if (stage == 0) {
      ref = out;
      continue;
    }
    for (int r = 0; r < world; ++r)
      EXPECT_LE(max_rel(out[r], ref[r]), 1e-6) << "stage " << stage << " rank " << r;
  }
}

// A parameter used in the no_sync() micro-steps only keeps its accumulated gradient (as with
// plain DDP and PyTorch): stage 2 used to drop it when it freed the gradients at the last backward.
TEST(Zero, NoSyncKeepsTheGradientOfAParameterUnusedInTheLastMicroStep) {
  const int world = 2, micro = 3, steps = 3;
  auto uses_side = [](int k) { return k + 1 < micro; };
  auto d = make_data(steps * micro, world * kB);
  Side ref;
  {
    torch::optim::SGD opt(ref->parameters(), torch::optim::SGDOptions(0.1));
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      for (int k = 0; k < micro; ++k)
        torch::mse_loss(ref->forward(d.x[s * micro + k], uses_side(k)), d.y[s * micro + k]).backward();
      opt.step();
    }
  }
  for (int stage : {1, 2}) {
    std::vector<Side> models(world);
    run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
      auto g = make_comm(r, world, store);
      auto& m = models[r];
      auto o = small_buckets();
      o.find_unused_parameters = true;
      DistributedDataParallel ddp(m.ptr(), g, o);
      auto sgd = std::make_shared<torch::optim::SGD>(m->parameters(), torch::optim::SGDOptions(0.1));
      ZeroRedundancyOptimizer opt(ddp, sgd, zero_opts(stage));
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
      opt.synchronize();
      EXPECT_LE(max_rel(snapshot(*m), snapshot(*ref)), 1e-5) << "stage " << stage << " rank " << r;
    });
  }
}

// ZeRO owns DDP's comm hook (the reduce-scatter); a hook registered afterwards would make step()
// silently step nothing. It is refused, and training goes on as before.
TEST(Zero, ACommHookRegisteredAfterZeroIsRefused) {
  const int world = 2;
  auto d = make_data(2, world * kB);
  auto models = make_mlps(world);
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    auto& m = models[r];
    DistributedDataParallel ddp(m.ptr(), g, small_buckets());
    ZeroRedundancyOptimizer opt(ddp, make_opt(m, Kind::sgd), zero_opts(2));
    try {
      ddp.register_comm_hook(allreduce_hook());
      ADD_FAILURE() << "a comm hook after ZeRO was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("ZeroRedundancyOptimizer"), std::string::npos) << e.what();
    }
    auto before = snapshot(*m);
    train_step(ddp, m, opt, d, 0, r, kB);
    opt.synchronize();
    EXPECT_GT(max_rel(snapshot(*m), before), 1e-4) << "the step changed nothing";
  });
}

// Stage 2: after backward no parameter has a gradient and no bucket holds memory; the rank keeps
// only its block. Stage 1: whole gradients, sharded state.
TEST(Zero, Stage2KeepsOnlyTheOwnedGradientBlock) {
  const int world = 3;
  auto d = make_data(2, world * kB);
  auto models = make_mlps(world);
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    auto& m = models[r];
    DistributedDataParallel ddp(m.ptr(), g, small_buckets());
    ZeroRedundancyOptimizer opt(ddp, make_opt(m, Kind::adamw), zero_opts(2));
    for (int s = 0; s < 2; ++s) {
      opt.zero_grad();
      torch::mse_loss(ddp.forward([&] { return m->forward(shard(d.x[s], r, kB)); }), shard(d.y[s], r, kB))
          .backward();
      for (auto& p : m->parameters()) EXPECT_FALSE(p.grad().defined()) << "a whole gradient is still held";
      auto& red = ddp.reducer();
      for (size_t b = 0; b < red.bucket_layout().size(); ++b)
        EXPECT_FALSE(red.bucket_allocated(b)) << "bucket " << b << " memory kept after its reduce-scatter";
      int64_t held = 0, total = 0;
      for (auto& t : opt.local_gradients()) held += t.numel();
      for (auto& b : opt.buckets()) {
        total += b.numel;
        EXPECT_EQ(b.last - b.first, b.padded / world);
      }
      EXPECT_LE(held, total / world + 16 * 3);  // one aligned block per bucket
      opt.step();
    }
  });
}

TEST(Zero, Stage1ShardsTheOptimizerState) {
  const int world = 3;
  auto d = make_data(2, world * kB);
  auto models = make_mlps(world);
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    auto& m = models[r];
    DistributedDataParallel ddp(m.ptr(), g, small_buckets());
    ZeroRedundancyOptimizer opt(ddp, make_opt(m, Kind::fused), zero_opts(1));
    for (int s = 0; s < 2; ++s) train_step(ddp, m, opt, d, s, r, kB);
    int64_t blocks = 0, total = 0;
    for (auto& b : opt.buckets()) {
      blocks += b.last - b.first;
      total += b.numel;
    }
    // exp_avg and exp_avg_sq of this rank's blocks only.
    EXPECT_EQ(optimizer_state_bytes(opt), 2 * blocks * 4);
    EXPECT_LT(2 * blocks, 2 * total * 2 / 3);
    EXPECT_EQ(opt.local_optimizer().state().size(), opt.buckets().size());
    for (auto& p : m->parameters()) EXPECT_TRUE(p.grad().defined());  // stage 1: whole gradients
  });
}

// The consolidated state is what plain AdamW over the whole model has after the same steps.
TEST(Zero, ConsolidatedStateIsTheUnshardedOptimizers) {
  const int world = 3, steps = 4, root = 1;
  auto d = make_data(steps, world * kB);
  // Reference: plain DDP's optimizer state, saved.
  std::string ref_bytes, zero_bytes;
  for (int zero = 0; zero < 2; ++zero) {
    auto models = make_mlps(world);
    run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
      auto g = make_comm(r, world, store);
      auto& m = models[r];
      DistributedDataParallel ddp(m.ptr(), g, small_buckets());
      std::shared_ptr<torch::optim::Optimizer> opt = make_opt(m, Kind::fused);
      if (zero) opt = std::make_shared<ZeroRedundancyOptimizer>(ddp, opt, zero_opts(2));
      for (int s = 0; s < steps; ++s) train_step(ddp, m, *opt, d, s, r, kB);
      if (zero) std::static_pointer_cast<ZeroRedundancyOptimizer>(opt)->consolidate_state_dict(root);
      if (r != (zero ? root : 0)) return;
      torch::serialize::OutputArchive a;
      opt->save(a);
      std::ostringstream os;
      a.save_to(os);
      (zero ? zero_bytes : ref_bytes) = os.str();
    });
  }
  auto read = [steps](const std::string& bytes) {
    auto m = make_mlps(1)[0];
    torch::optim::AdamW plain(m->parameters(), torch::optim::AdamWOptions(1));
    torch::serialize::InputArchive in;
    std::istringstream is(bytes);
    in.load_from(is);
    plain.load(in);
    std::vector<torch::Tensor> out;
    for (auto& p : m->parameters()) {
      auto* state = gz::torch_compat::param_state(plain, p);
      EXPECT_NE(state, nullptr);
      if (!state) continue;
      auto& st = static_cast<torch::optim::AdamWParamState&>(*state);
      EXPECT_EQ(st.step(), steps);
      EXPECT_EQ(st.exp_avg().sizes(), p.sizes());
      out.push_back(st.exp_avg());
      out.push_back(st.exp_avg_sq());
    }
    return out;
  };
  EXPECT_LE(max_rel(read(zero_bytes), read(ref_bytes)), 1e-6);
}

// Save at 4 ranks, resume at 2 and at 1 with the same global batch: the same parameters as the
// run that went on at 4 ranks.
TEST(Zero, ResumesOnAnotherWorldSize) {
  const int first = 3, more = 3, steps = first + more;
  const int64_t global = 4 * kB;
  auto d = make_data(steps, global);
  auto run = [&](int world, int stage, int from, int to, const std::string& model_in,
                 const std::string& opt_in, std::string* model_out, std::string* opt_out) {
    auto models = make_mlps(world);
    std::vector<torch::Tensor> result;
    run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
      auto g = make_comm(r, world, store);
      auto& m = models[r];
      if (!model_in.empty()) {
        torch::serialize::InputArchive in;
        std::istringstream is(model_in);
        in.load_from(is);
        m->load(in);
      }
      DistributedDataParallel ddp(m.ptr(), g, small_buckets());
      ZeroRedundancyOptimizer opt(ddp, make_opt(m, Kind::fused), zero_opts(stage));
      if (!opt_in.empty()) {
        torch::serialize::InputArchive in;
        std::istringstream is(opt_in);
        in.load_from(is);
        opt.load(in);
      }
      for (int s = from; s < to; ++s) train_step(ddp, m, opt, d, s, r, global / world);
      opt.consolidate_state_dict(0);
      if (r != 0) return;
      result = snapshot(*m);
      if (model_out) {
        torch::serialize::OutputArchive a;
        m->save(a);
        std::ostringstream os;
        a.save_to(os);
        *model_out = os.str();
      }
      if (opt_out) {
        torch::serialize::OutputArchive a;
        opt.save(a);
        std::ostringstream os;
        a.save_to(os);
        *opt_out = os.str();
      }
    });
    return result;
  };
  auto straight = run(4, 2, 0, steps, "", "", nullptr, nullptr);
  std::string model_bytes, opt_bytes;
  auto half = run(4, 2, 0, first, "", "", &model_bytes, &opt_bytes);
  ASSERT_GT(max_rel(straight, half), 1e-3);
  EXPECT_LE(max_rel(run(2, 1, first, steps, model_bytes, opt_bytes, nullptr, nullptr), straight), 1e-5);
  EXPECT_LE(max_rel(run(1, 2, first, steps, model_bytes, opt_bytes, nullptr, nullptr), straight), 1e-5);
  // Without the optimizer state the continuation differs: the state really came back.
  EXPECT_GT(max_rel(run(2, 1, first, steps, model_bytes, "", nullptr, nullptr), straight), 1e-3);
}

TEST(Zero, MisuseIsReported) {
  const int world = 2;
  auto models = make_mlps(world);
  auto d = make_data(2, world * kB);
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store, std::chrono::seconds(10));
    auto& m = models[r];
    DistributedDataParallel ddp(m.ptr(), g, small_buckets());
    // Not elementwise: cannot be sharded.
    auto lbfgs = std::make_shared<torch::optim::LBFGS>(m->parameters(), torch::optim::LBFGSOptions(1));
    EXPECT_THROW(ZeroRedundancyOptimizer(ddp, lbfgs), InvalidArgument);
    // Misses parameters DDP averages.
    auto part = std::make_shared<torch::optim::SGD>(m->l1->parameters(), torch::optim::SGDOptions(0.1));
    EXPECT_THROW(ZeroRedundancyOptimizer(ddp, part), InvalidArgument);
    ZeroRedundancyOptimizer opt(ddp, make_opt(m, Kind::sgd), zero_opts(2));
    train_step(ddp, m, opt, d, 0, r, kB);
    torch::serialize::OutputArchive a;
    EXPECT_THROW(opt.save(a), Error);  // not consolidated
    // A forward that skips ddp.forward()/pre_forward() right after a step reads parameters still
    // being gathered: the backward says so.
    opt.zero_grad();
    auto loss = torch::mse_loss(m->forward(shard(d.x[1], r, kB)), shard(d.y[1], r, kB));
    try {
      loss.backward();
      ADD_FAILURE() << "no error for a forward without pre_forward";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("pre_forward"), std::string::npos) << e.what();
    }
  });
}

}  // namespace

}  // namespace test_zero
