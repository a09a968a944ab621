// Generations of a group (in-place recovery): survivors of a lost rank and its replacement meet
// in the next generation without any other coordination, over shm and over gloo.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "gz/comm/generations.h"
#include "gz/core/error.h"
#include "gz/store/mem_store.h"
#include "gz/store/prefix_store.h"
#include "support/run_ranks.h"

namespace gz::test {
namespace {

using namespace std::chrono_literals;

comm::CommOptions options(int rank, int size, std::shared_ptr<Store> store, const std::string& backend) {
  comm::CommOptions o;
  o.backend = backend;
  o.rank = rank;
  o.size = size;
  o.store = std::make_shared<PrefixStore>("job", std::move(store));
  o.timeout = 20s;
  o.node_id = "n0";
  o.iface = "127.0.0.1";
  return o;
}

// Sum of ranks + 1 over the group: every member took part.
float sum_of_ranks(comm::Communicator& c) {
  float v = static_cast<float>(c.rank() + 1);
  c.allreduce(&v, 1, DType::f32, comm::ReduceOp::sum);
  return v;
}

class GenerationsTest : public ::testing::TestWithParam<std::string> {};

// Rank 1 is lost in generation 0 (its group aborted, as its peers see a dead process); ranks 0
// and 2 rejoin and a fresh rank-1 process joins: all three meet in generation 1. Then rank 2 is
// lost too, before its replacement: generation 2. Mutation check: join() starting at generation
// 0 without skipping claimed slots makes the replacement rebuild generation 0 alone (a timeout).
TEST_P(GenerationsTest, SurvivorsAndAReplacementMeetInTheNextGeneration) {
  constexpr int n = 3;
  auto store = std::make_shared<MemStore>();
  std::atomic<int> lost{-1};
  run_ranks(n, [&](int rank, std::shared_ptr<Store>) {
    comm::Generations gens(options(rank, n, store, GetParam()));
    comm::CommPtr c = gens.join();
    EXPECT_EQ(gens.generation(), 0);
    EXPECT_EQ(sum_of_ranks(*c), 6.f);
    for (int victim : {1, 2}) {
      if (rank == victim) {
        // This process "dies": its peers' next op fails; a replacement with the same rank starts.
        std::this_thread::sleep_for(100ms);
        c->abort("rank " + std::to_string(rank) + " was killed");
        comm::Generations fresh(options(rank, n, store, GetParam()));
        c = fresh.join();
        EXPECT_EQ(fresh.generation(), gens.generation() + 1) << "the replacement joined another generation";
        gens = std::move(fresh);
      } else {
        float v = 1.f;
        EXPECT_THROW(c->allreduce(&v, 1, DType::f32, comm::ReduceOp::sum), Error);
        c = gens.rejoin(c, "lost rank " + std::to_string(victim));
      }
      EXPECT_EQ(sum_of_ranks(*c), 6.f) << "after losing rank " << victim;
    }
    EXPECT_EQ(gens.generation(), 2);
    lost = 0;
  });
  EXPECT_EQ(lost.load(), 0);
}

// The replacement arrives before the survivors noticed the loss: its predecessor's generation is
// full, it waits in the next one, where the survivors join it.
TEST_P(GenerationsTest, AReplacementArrivingFirstWaitsInTheNextGeneration) {
  constexpr int n = 2;
  auto store = std::make_shared<MemStore>();
  run_ranks(n, [&](int rank, std::shared_ptr<Store>) {
    comm::Generations gens(options(rank, n, store, GetParam()));
    comm::CommPtr c = gens.join();
    if (rank == 1) {
      c->abort("rank 1 was killed");
      comm::Generations fresh(options(rank, n, store, GetParam()));
      c = fresh.join();
      EXPECT_EQ(fresh.generation(), 1);
    } else {
      std::this_thread::sleep_for(200ms);  // the replacement is there first
      c = gens.rejoin(c, "lost rank 1");
      EXPECT_EQ(gens.generation(), 1);
    }
    EXPECT_EQ(sum_of_ranks(*c), 3.f);
  });
}

TEST(Generations, BadOptionsAreRefused) {
  comm::CommOptions o;
  o.size = 2;
  o.rank = 0;
  EXPECT_THROW(comm::Generations{o}, InvalidArgument);  // no store
  o.store = std::make_shared<MemStore>();
  o.rank = 2;
  EXPECT_THROW(comm::Generations{o}, InvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Backends, GenerationsTest, ::testing::Values("shm", "gloo"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace gz::test
