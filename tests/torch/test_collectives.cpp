// Tensor adapter, tensor collectives and the default process group.
#include "torch/support/torch_test_util.h"

#include <cstdlib>

#include "gz/core/error.h"
#include "gz/torch/collectives.h"
#include "gz/torch/process_group.h"
#include "gz/torch/tensor_adapter.h"

// A namespace of its own: the unity build (GZ_UNITY_BUILD) compiles this file together with
// the other files of its test target.
namespace test_collectives {

namespace {
using namespace gz;
using gz::test::make_comm;
using gz::test::run_ranks;

// Keep LibTorch's own thread pool out of the way of the rank threads.
const bool kOneThread = [] {
  torch::set_num_threads(1);
  return true;
}();

TEST(TorchProcessGroup, RankBeforeInitIsAClearError) {
  ASSERT_FALSE(is_initialized());
  try {
    rank();
    FAIL() << "rank() before init did not throw";
  } catch (const gz::Error& e) {
    EXPECT_NE(std::string(e.what()).find("gz::init"), std::string::npos) << e.what();
  }
  EXPECT_THROW(default_group(), gz::Error);
  EXPECT_THROW(allreduce(torch::ones({2})), gz::Error);
}

TEST(TorchProcessGroup, AdoptedGroupIsTheDefault) {
  run_ranks(1, [](int r, std::shared_ptr<Store> store) {
    init(make_comm(r, 1, store));
    EXPECT_TRUE(is_initialized());
    EXPECT_EQ(rank(), 0);
    EXPECT_EQ(size(), 1);
    EXPECT_EQ(local_rank(), 0);
    EXPECT_TRUE(is_main_process());
    EXPECT_THROW(init(make_comm(r, 1, std::make_shared<MemStore>())), gz::Error);
    auto t = torch::arange(4, torch::kFloat);
    allreduce(t);  // default group of size 1: unchanged
    EXPECT_TRUE(t.equal(torch::arange(4, torch::kFloat)));
    shutdown();
    EXPECT_FALSE(is_initialized());
  });
}

TEST(TorchProcessGroup, InitWithoutLauncherIsOneProcess) {
  for (const char* v : {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"})
    if (std::getenv(v)) GTEST_SKIP() << v << " is set: not a launcher-free environment";
  ProcessGroupOptions o;
  o.backend = "shm";
  o.timeout = std::chrono::seconds(10);
  init(o);
  EXPECT_EQ(rank(), 0);
  EXPECT_EQ(size(), 1);
  EXPECT_EQ(local_size(), 1);
  auto t = torch::full({3}, 2.0);
  allreduce(t);
  EXPECT_TRUE(t.equal(torch::full({3}, 2.0)));
  shutdown();
  EXPECT_FALSE(is_initialized());
}

TEST(TorchProcessGroup, TestsRunOnTheRealBackend) {
  run_ranks(2, [](int r, std::shared_ptr<Store> store) { EXPECT_EQ(make_comm(r, 2, store)->backend(), "shm"); });
}

TEST(TorchTensorAdapter, DtypesMapBothWays) {
  for (auto st : {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16, torch::kInt8, torch::kUInt8,
                  torch::kInt32, torch::kInt64})
    EXPECT_EQ(to_scalar_type(to_dtype(st)), st);
  EXPECT_THROW(to_dtype(torch::kBool), InvalidArgument);
  EXPECT_THROW(to_dtype(torch::kComplexFloat), InvalidArgument);
}

class TorchCollectives : public ::testing::TestWithParam<int> {};

TEST_P(TorchCollectives, AllreduceEveryDtypeMatchesReference) {
  const int world = GetParam();
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    for (auto st : {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16, torch::kInt8, torch::kUInt8,
                    torch::kInt32, torch::kInt64}) {
      auto base = torch::arange(1, 6, torch::kLong);
      auto t = (base + r).to(st);
      allreduce(t, comm::ReduceOp::sum, g);
      auto expect = (base * world + world * (world - 1) / 2).to(st);
      EXPECT_TRUE(t.equal(expect)) << c10::toString(st) << " rank " << r << ": " << t;
      auto m = (base * (r + 1)).to(st);
      allreduce(m, comm::ReduceOp::max, g);
      EXPECT_TRUE(m.equal((base * world).to(st))) << c10::toString(st);
    }
  });
}

TEST_P(TorchCollectives, NonContiguousIsCopiedInAndOut) {
  const int world = GetParam();
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    auto full = torch::zeros({4, 6});
    auto col = full.select(1, 2);  // stride 6
    ASSERT_FALSE(col.is_contiguous());
    col.fill_(r + 1.0);
    allreduce(col, comm::ReduceOp::sum, g);
    EXPECT_TRUE(full.select(1, 2).equal(torch::full({4}, world * (world + 1) / 2.0)));
    EXPECT_EQ(full.sum().item<double>(), 4.0 * world * (world + 1) / 2.0);  // nothing else touched
    auto tr = (torch::arange(6, torch::kFloat).view({2, 3}) * (r == 1 ? 1 : 0)).t();
    broadcast(tr, world > 1 ? 1 : 0, g);
    EXPECT_TRUE(tr.equal(torch::arange(6, torch::kFloat).view({2, 3}).t() * (world > 1 ? 1 : 0)));
  });
}

TEST_P(TorchCollectives, AllgatherReduceScatterBarrierAsync) {
  const int world = GetParam();
  run_ranks(world, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, world, store);
    auto mine = torch::full({2, 3}, static_cast<double>(r));
    auto list = allgather(mine, g);
    ASSERT_EQ(list.size(), static_cast<size_t>(world));
    for (int k = 0; k < world; ++k) EXPECT_TRUE(list[k].equal(torch::full({2, 3}, static_cast<double>(k))));
    // Different row counts per rank.
    auto rows = torch::full({r + 1, 2}, static_cast<float>(r));
    auto cat = allgather_cat(rows, g);
    ASSERT_EQ(cat.size(0), world * (world + 1) / 2);
    int64_t off = 0;
    for (int k = 0; k < world; ++k) {
      EXPECT_TRUE(cat.narrow(0, off, k + 1).equal(torch::full({k + 1, 2}, static_cast<float>(k))));
      off += k + 1;
    }
    auto in = torch::arange(world * 3, torch::kFloat).view({world, 3}) * (r + 1);
    auto rs = reduce_scatter(in, comm::ReduceOp::sum, g);
    auto ref = torch::arange(world * 3, torch::kFloat).view({world, 3})[r] * (world * (world + 1) / 2);
    EXPECT_TRUE(rs.equal(ref.view({1, 3}))) << rs << ref;
    if (world > 1) EXPECT_THROW(reduce_scatter(torch::ones({world + 1}), comm::ReduceOp::sum, g), InvalidArgument);
    barrier(g);
    // Async: issued back to back, completed in order.
    auto a = torch::full({5}, 1.0f), b = torch::full({5}, static_cast<float>(r));
    auto w1 = allreduce_async(a, comm::ReduceOp::sum, g);
    auto w2 = broadcast_async(b, 0, g);
    auto out = torch::empty({world, 5});
    auto w3 = allgather_async(torch::full({5}, static_cast<float>(r)), out, g);
    w1->wait();
    w2->wait();
    w3->wait();
    EXPECT_TRUE(a.equal(torch::full({5}, static_cast<float>(world))));
    EXPECT_TRUE(b.equal(torch::zeros({5})));
    for (int k = 0; k < world; ++k) EXPECT_TRUE(out[k].equal(torch::full({5}, static_cast<float>(k))));
  });
}

TEST(TorchCollectivesErrors, BadInputIsRejected) {
  run_ranks(1, [&](int r, std::shared_ptr<Store> store) {
    auto g = make_comm(r, 1, store);
    auto t = torch::ones({3}, torch::kBool);
    try {
      allreduce(t, comm::ReduceOp::sum, g);
      FAIL();
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("Bool"), std::string::npos) << e.what();
    }
    EXPECT_THROW(allreduce(torch::Tensor(), comm::ReduceOp::sum, g), InvalidArgument);
    EXPECT_THROW(allgather_async(torch::ones({3}), torch::empty({2}), g)->wait(), InvalidArgument);
  });
}

INSTANTIATE_TEST_SUITE_P(World, TorchCollectives, ::testing::Values(1, 2, 3, 4));

}  // namespace

}  // namespace test_collectives
