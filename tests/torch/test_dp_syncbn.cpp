// DataParallel (one process, CPU replicas) and SyncBatchNorm.
#include "torch/support/torch_test_util.h"

#include "gz/torch/collectives.h"
#include "gz/torch/data_parallel.h"
#include "gz/torch/sync_batch_norm.h"

// A namespace of its own: the unity build (GZ_UNITY_BUILD) compiles this file together with
// the other files of its test target.
namespace test_dp_syncbn {

namespace {
using namespace gz;
using namespace gz::test;

const bool kOneThread = [] {
  torch::set_num_threads(1);
  return true;
}();

TEST(DataParallel, TwoCpuReplicasMatchSingleProcess) {
  auto models = make_mlps(2);
  auto d = make_data(10, 16);
  auto& ref = models[1];
  torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1));
  auto& m = models[0];
  int clones = 0;
  DataParallel dp(
      m.ptr(),
      [&clones](const torch::nn::Module& master, const torch::Device& dev) {
        ++clones;
        return master.clone(dev);
      },
      [](torch::nn::Module& mod, const torch::Tensor& x) { return dynamic_cast<MlpImpl&>(mod).forward(x); });
  ASSERT_EQ(dp.num_replicas(), 2u);
  torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.1));
  for (int s = 0; s < 10; ++s) {
    ref_opt.zero_grad();
    torch::mse_loss(ref->forward(d.x[s]), d.y[s]).backward();
    ref_opt.step();
    opt.zero_grad();
    auto out = dp.forward(d.x[s]);
    ASSERT_EQ(out.size(0), 16);
    torch::mse_loss(out, d.y[s]).backward();
    dp.reduce_gradients();
    opt.step();
  }
  EXPECT_EQ(clones, 1);  // persistent replicas: cloned once
  EXPECT_LE(max_rel_diff(*m, *ref), 1e-5);
  // The replica follows the master after the next sync.
  dp.sync_replicas();
  EXPECT_LE(max_rel_diff(*dp.replica(1), *m), 0.0);
}

class SyncBN : public ::testing::TestWithParam<int> {};

TEST_P(SyncBN, EqualsBatchNormOverTheFullBatch) {
  const int world = GetParam();
  const int64_t b = 3, c = 4;
  torch::manual_seed(11);
  auto x = torch::randn({world * b, c, 5, 5}) * 3 + 1;
  auto t = torch::randn({world * b, c, 5, 5});
  torch::nn::BatchNorm2d ref(c);
  {
    torch::NoGradGuard ng;
    ref->weight.uniform_(0.5, 1.5);
    ref->bias.uniform_(-0.5, 0.5);
  }
  auto xr = x.clone().requires_grad_(true);
  std::vector<torch::Tensor> ref_out;
  for (int step = 0; step < 2; ++step) {
    ref->zero_grad();
    auto y = ref->forward(xr);
    torch::mse_loss(y, t).backward();
    ref_out.push_back(y.detach());
  }
  auto ref_wgrad = ref->weight.grad().clone(), ref_bgrad = ref->bias.grad().clone();
  auto ref_xgrad = xr.grad().clone() / 2;  // two backward passes accumulated
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    std::shared_ptr<SyncBatchNormImpl> bn;
    {
      static std::mutex mu;  // from_batch_norm reads the shared reference module
      std::lock_guard<std::mutex> lock(mu);
      torch::nn::BatchNorm2d init(c);
      torch::NoGradGuard ng;
      init->weight.copy_(ref->weight);
      init->bias.copy_(ref->bias);
      bn = SyncBatchNormImpl::from_batch_norm(*init, g);
    }
    auto xs = shard(x, r, b).clone().requires_grad_(true);
    for (int step = 0; step < 2; ++step) {
      bn->zero_grad();
      auto y = bn->forward(xs);
      EXPECT_TRUE(torch::allclose(y, shard(ref_out[step], r, b), 1e-4, 1e-5)) << "step " << step;
      torch::mse_loss(y, shard(t, r, b)).backward();
    }
    // Local loss is a mean over b rows instead of world*b: gradients scale by world.
    EXPECT_TRUE(torch::allclose(xs.grad() / world / 2, shard(ref_xgrad, r, b), 1e-4, 1e-6));
    auto wg = bn->weight.grad().clone(), bg = bn->bias.grad().clone();
    allreduce(wg, comm::ReduceOp::sum, g);
    allreduce(bg, comm::ReduceOp::sum, g);
    EXPECT_TRUE(torch::allclose(wg / world, ref_wgrad, 1e-4, 1e-6)) << wg / world << ref_wgrad;
    EXPECT_TRUE(torch::allclose(bg / world, ref_bgrad, 1e-4, 1e-6));
    EXPECT_TRUE(torch::allclose(bn->running_mean, ref->running_mean, 1e-5, 1e-6));
    EXPECT_TRUE(torch::allclose(bn->running_var, ref->running_var, 1e-5, 1e-6));
    bn->eval();
    auto ye = bn->forward(shard(x, r, b));
    static std::mutex emu;  // the reference module is shared by the rank threads
    std::lock_guard<std::mutex> lock(emu);
    ref->eval();
    EXPECT_TRUE(torch::allclose(ye, ref->forward(shard(x, r, b)), 1e-4, 1e-5));
    ref->train();
  });
}

INSTANTIATE_TEST_SUITE_P(World, SyncBN, ::testing::Values(1, 2, 3));

TEST(SyncBNConvert, SequentialBatchNormsAreReplaced) {
  run_ranks(1, [](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, 1, store);
    torch::nn::Sequential seq(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 2, 3)), torch::nn::BatchNorm2d(2),
                              torch::nn::ReLU(), torch::nn::BatchNorm2d(2));
    auto conv = convert_sync_batchnorm(seq, g);
    ASSERT_EQ(conv->size(), 4u);
    EXPECT_NE(std::dynamic_pointer_cast<SyncBatchNormImpl>(conv->ptr(1)), nullptr);
    EXPECT_NE(std::dynamic_pointer_cast<SyncBatchNormImpl>(conv->ptr(3)), nullptr);
    EXPECT_EQ(conv->ptr(0), seq->ptr(0));  // other modules are shared, not copied
    auto x = torch::randn({4, 1, 6, 6});
    EXPECT_TRUE(torch::allclose(conv->forward(x), seq->forward(x), 1e-4, 1e-5));
  });
}

}  // namespace

}  // namespace test_dp_syncbn
