// Hierarchical communicator with fake node ids (ranks as threads): every op vs the reference on
// uniform (2x2), interleaved, uneven (4+3, 1+2) and single-node layouts. Gloo plays both the
// local and the inter-node backend here so the test does not depend on shm; the factory tests
// cover shm as the local backend.
#include <gtest/gtest.h>

#include "comm/test_gloo_common.h"
#include "gz/comm/gloo.h"
#include "gz/comm/hierarchical.h"
#include "gz/core/error.h"
#include "support/run_ranks.h"

namespace gz::test {
namespace {

using namespace std::chrono_literals;

comm::CommMaker gloo_maker() {
  return [](int rank, int size, std::shared_ptr<Store> store) {
    comm::GlooOptions o;
    o.timeout = 20s;
    return comm::create_gloo_communicator(rank, size, std::move(store), o);
  };
}

struct Layout {
  const char* name;
  std::vector<std::string> labels;
};

// Short names in ctest listings instead of a byte dump.
void PrintTo(const Layout& s, std::ostream* os) { *os << s.name; }

class HierLayout : public ::testing::TestWithParam<Layout> {};

TEST_P(HierLayout, AllCollectivesMatchReference) {
  const auto& labels = GetParam().labels;
  const int world = static_cast<int>(labels.size());
  auto layout = comm::NodeLayout::from_labels(labels);
  run_ranks(world, [&](int rank, std::shared_ptr<Store> store) {
    auto c = comm::create_hierarchical_communicator(rank, layout, store, gloo_maker(), gloo_maker(), 20s);
    EXPECT_EQ(c->rank(), rank);
    EXPECT_EQ(c->size(), world);
    EXPECT_EQ(c->backend(), "hier(gloo+gloo)");
    check_all_collectives(*c, world <= 4);
    // Async path goes through the same composition.
    std::vector<int32_t> v(101, rank);
    auto w = c->allreduce_async(v.data(), v.size(), DType::i32, comm::ReduceOp::max);
    w->wait();
    EXPECT_EQ(v[100], world - 1);
  });
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, HierLayout,
    ::testing::Values(Layout{"two_by_two", {"a", "a", "b", "b"}}, Layout{"interleaved", {"a", "b", "a", "b"}},
                      // Rail 1 is (rank 3 of node a, rank 2 of node b): rail order differs from node order.
                      Layout{"crossed", {"a", "b", "b", "a"}},
                      Layout{"four_plus_three", {"n0", "n0", "n0", "n0", "n1", "n1", "n1"}},
                      Layout{"mixed_uneven", {"x", "y", "y", "x", "z", "y", "z"}},
                      Layout{"one_plus_two", {"p", "q", "q"}}, Layout{"single_node", {"s", "s", "s"}},
                      Layout{"one_rank_per_node", {"a", "b", "c"}}),
    [](const ::testing::TestParamInfo<Layout>& info) { return std::string(info.param.name); });

// Every root, with data that differs per rank (the shared check_broadcast's inputs are the same
// on every rank, so it cannot see a rank that received nothing). Mutation check: the root's node
// broadcasting locally only when the root is not its leader (the old code) leaves the root's
// node mates with their own data when the root is a leader: DDP's bucket plan then arrived as
// garbage on 4 x 2 ranks ("bad bucket plan from rank 0").
TEST(HierLayout, BroadcastReachesEveryRankFromEveryRoot) {
  for (const std::vector<std::string>& labels :
       {std::vector<std::string>{"a", "a", "b", "b"}, std::vector<std::string>{"a", "b", "b", "a"},
        std::vector<std::string>{"n0", "n0", "n0", "n1", "n1"}}) {
    const int world = static_cast<int>(labels.size());
    auto layout = comm::NodeLayout::from_labels(labels);
    run_ranks(world, [&](int rank, std::shared_ptr<Store> store) {
      auto c = comm::create_hierarchical_communicator(rank, layout, store, gloo_maker(), gloo_maker(), 20s);
      for (int root = 0; root < world; ++root) {
        std::vector<int64_t> v(37, 1000 * rank + 1);
        c->broadcast(v.data(), v.size(), DType::i64, root);
        for (int64_t x : v) ASSERT_EQ(x, 1000 * root + 1) << "rank " << rank << " root " << root;
      }
    });
  }
}

TEST(HierLayout, FromLabelsNumbersNodesByFirstAppearance) {
  auto l = comm::NodeLayout::from_labels({"b", "a", "b", "c"});
  EXPECT_EQ(l.num_nodes(), 3);
  EXPECT_EQ(l.node_of_rank, (std::vector<int>{0, 1, 0, 2}));
  EXPECT_EQ(l.ranks_of_node[0], (std::vector<int>{0, 2}));
  EXPECT_FALSE(l.uniform());
  EXPECT_TRUE(comm::NodeLayout::from_labels({"a", "b", "b", "a"}).uniform());
}

TEST(HierLayout, LostPeerFailsEveryRankPromptly) {
  auto layout = comm::NodeLayout::from_labels({"a", "a", "b", "b"});
  run_ranks(4, [&](int rank, std::shared_ptr<Store> store) {
    auto make = [](int r, int s, std::shared_ptr<Store> st) {
      comm::GlooOptions o;
      o.timeout = 2s;
      return comm::create_gloo_communicator(r, s, std::move(st), o);
    };
    auto c = comm::create_hierarchical_communicator(rank, layout, store, make, make, 2s);
    float x = 1;
    c->allreduce(&x, 1, DType::f32, comm::ReduceOp::sum);
    EXPECT_EQ(x, 4.0f);
    if (rank == 3) return;  // leaves: its sockets close when c is destroyed
    Stopwatch sw;
    try {
      c->allreduce(&x, 1, DType::f32, comm::ReduceOp::sum);
      ADD_FAILURE() << "rank " << rank << ": allreduce without rank 3 succeeded";
    } catch (const PeerError& e) {
      EXPECT_NE(std::string(e.what()).find("allreduce #1 on rank"), std::string::npos) << e.what();
      // The failed peer is named by its global rank, and the sub-group's error is kept.
      EXPECT_TRUE(e.peer() >= 0 && e.peer() < 4 && e.peer() != rank) << e.peer() << ": " << e.what();
      EXPECT_NE(e.cause(), nullptr);
    } catch (const TimeoutError& e) {
      EXPECT_NE(std::string(e.what()).find("allreduce #1 on rank"), std::string::npos) << e.what();
    }
    EXPECT_LT(sw.seconds(), 2.0 + 2.0) << "rank " << rank;
  });
}

}  // namespace
}  // namespace gz::test
