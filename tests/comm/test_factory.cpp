// create_communicator: backend choice from node ids, explicit names, errors; results vs reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include "comm/test_gloo_common.h"
#include "gz/comm/factory.h"
#include "gz/core/error.h"
#include "gz/store/mem_store.h"
#include "support/run_ranks.h"

namespace gz::test {
namespace {

using namespace std::chrono_literals;

comm::CommOptions options(int rank, int size, std::shared_ptr<Store> store, const std::string& backend,
                          const std::string& node_id) {
  comm::CommOptions o;
  o.backend = backend;
  o.rank = rank;
  o.size = size;
  o.store = std::move(store);
  o.timeout = 20s;
  o.node_id = node_id;
  o.iface = "127.0.0.1";  // simulated nodes on one machine: no dependence on resolving the hostname
  return o;
}

struct Case {
  const char* name;
  std::string backend;
  std::vector<std::string> nodes;
  std::string expect;
};

// Short names in ctest listings instead of a byte dump.
void PrintTo(const Case& s, std::ostream* os) { *os << s.name; }

class FactoryCase : public ::testing::TestWithParam<Case> {};

TEST_P(FactoryCase, PicksBackendAndMatchesReference) {
  const Case& c = GetParam();
  const int world = static_cast<int>(c.nodes.size());
  run_ranks(world, [&](int rank, std::shared_ptr<Store> store) {
    auto comm = comm::create_communicator(options(rank, world, store, c.backend, c.nodes[rank]));
    EXPECT_EQ(comm->backend(), c.expect);
    EXPECT_EQ(comm->rank(), rank);
    EXPECT_EQ(comm->size(), world);
    check_all_collectives(*comm, false, c.expect != "shm");
  });
}

INSTANTIATE_TEST_SUITE_P(
    Choices, FactoryCase,
    ::testing::Values(Case{"auto_one_node", "auto", {"n", "n", "n"}, "shm"},
                      Case{"auto_single_rank", "auto", {"n"}, "shm"},
                      Case{"auto_two_by_two", "auto", {"a", "a", "b", "b"}, "hier(shm+gloo)"},
                      Case{"auto_four_plus_three", "auto", {"a", "a", "a", "a", "b", "b", "b"}, "hier(shm+gloo)"},
                      Case{"explicit_gloo", "gloo", {"a", "b", "a"}, "gloo"},
                      Case{"explicit_hier_one_node", "hier", {"n", "n"}, "hier(shm+gloo)"}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

TEST(Factory, ShmAcrossNodesIsRejected) {
  run_ranks(2, [&](int rank, std::shared_ptr<Store> store) {
    try {
      comm::create_communicator(options(rank, 2, store, "shm", rank == 0 ? "hostA" : "hostB"));
      ADD_FAILURE() << "shm across two node ids was accepted";
    } catch (const InvalidArgument& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("hostA"), std::string::npos) << m;
      EXPECT_NE(m.find("hostB"), std::string::npos) << m;
    }
  });
}

TEST(Factory, NcclAndUnknownAreClearErrors) {
  auto store = std::make_shared<MemStore>();
#ifndef GZ_HAVE_NCCL  // NCCL builds: tests/comm/test_nccl.cpp covers the backend's own errors
  try {
    comm::create_communicator(options(0, 1, store, "nccl", ""));
    FAIL() << "nccl accepted in a CPU build";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("-DGZ_WITH_NCCL=ON"), std::string::npos) << e.what();
  }
#endif
  try {
    comm::create_communicator(options(0, 1, store, "carrier-pigeon", ""));
    FAIL() << "unknown backend accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("carrier-pigeon"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("shm"), std::string::npos) << e.what();
  }
  EXPECT_THROW(comm::create_communicator(options(1, 1, store, "auto", "")), InvalidArgument);
  EXPECT_THROW(comm::create_communicator(options(0, 1, nullptr, "auto", "")), InvalidArgument);
  EXPECT_EQ(store->num_keys(), 0) << "a rejected call must not touch the store";
}

TEST(Factory, AvailableBackends) {
  auto b = comm::available_backends();
  EXPECT_NE(std::find(b.begin(), b.end(), "shm"), b.end());
  EXPECT_NE(std::find(b.begin(), b.end(), "gloo"), b.end());
#ifdef GZ_HAVE_NCCL
  EXPECT_NE(std::find(b.begin(), b.end(), "nccl"), b.end());
#else
  EXPECT_EQ(std::find(b.begin(), b.end(), "nccl"), b.end());
#endif
}

TEST(Factory, EnvironmentOverridesAuto) {
  ::setenv("GZ_BACKEND", "gloo", 1);
  run_ranks(2, [&](int rank, std::shared_ptr<Store> store) {
    auto c = comm::create_communicator(options(rank, 2, store, "auto", "same"));
    EXPECT_EQ(c->backend(), "gloo");
    auto s = comm::create_communicator(options(rank, 2, store, "shm", "same"));
    EXPECT_EQ(s->backend(), "shm") << "an explicit backend is not overridden";
  });
  ::unsetenv("GZ_BACKEND");
}

TEST(Factory, SecondCommunicatorOnSameStore) {
  run_ranks(3, [&](int rank, std::shared_ptr<Store> store) {
    for (int round = 0; round < 3; ++round) {
      auto c = comm::create_communicator(options(rank, 3, store, "gloo", "n"));
      int64_t v = rank + round;
      c->allreduce(&v, 1, DType::i64, comm::ReduceOp::sum);
      EXPECT_EQ(v, 3 + 3 * round);
    }
  });
}

// Across nodes over Gloo a new group connects only its members; point-to-point works across and
// within nodes. With GZ_HIER_FLAT=0 no mesh over every rank is built: collectives still work,
// cross-node point-to-point is refused with a clear error.
TEST(Factory, HierGroupsAndPointToPoint) {
  run_ranks(4, [&](int rank, std::shared_ptr<Store> store) {
    const std::vector<std::string> nodes = {"a", "a", "b", "b"};
    auto c = comm::create_communicator(options(rank, 4, store, "auto", nodes[rank]));
    ASSERT_EQ(c->backend(), "hier(shm+gloo)");
    auto g = c->new_group({1, 2, 3});
    if (rank == 0) {
      EXPECT_EQ(g, nullptr);
    } else {
      ASSERT_NE(g, nullptr);
      EXPECT_EQ(g->size(), 3);
      int64_t v = rank;
      g->allreduce(&v, 1, DType::i64, comm::ReduceOp::sum);
      EXPECT_EQ(v, 6);
    }
    // Cross-node pairs (0,3) and (1,2), each with two messages on different tags.
    const int peer = 3 - rank;
    int32_t a = rank * 10, b = rank * 10 + 1, got_a = -1, got_b = -1;
    if (rank < peer) {
      c->send(&a, 1, DType::i32, peer, 7);
      c->send(&b, 1, DType::i32, peer, 8);
      c->recv(&got_a, 1, DType::i32, peer, 9);
      EXPECT_EQ(got_a, peer * 10);
    } else {
      c->recv(&got_a, 1, DType::i32, peer, 7);
      c->recv(&got_b, 1, DType::i32, peer, 8);
      EXPECT_EQ(got_a, peer * 10);
      EXPECT_EQ(got_b, peer * 10 + 1);
      c->send(&a, 1, DType::i32, peer, 9);
    }
    c->barrier();
  });
  ::setenv("GZ_HIER_FLAT", "0", 1);
  run_ranks(4, [&](int rank, std::shared_ptr<Store> store) {
    const std::vector<std::string> nodes = {"a", "a", "b", "b"};
    auto c = comm::create_communicator(options(rank, 4, store, "auto", nodes[rank]));
    int64_t v = rank;
    c->allreduce(&v, 1, DType::i64, comm::ReduceOp::sum);
    EXPECT_EQ(v, 6);
    int32_t x = rank;
    if (rank == 0) EXPECT_THROW(c->send(&x, 1, DType::i32, 3), InvalidArgument);
    if (rank == 0) c->send(&x, 1, DType::i32, 1);  // same node: the local communicator
    if (rank == 1) {
      c->recv(&x, 1, DType::i32, 0);
      EXPECT_EQ(x, 0);
    }
    c->barrier();
  });
  ::unsetenv("GZ_HIER_FLAT");
}

}  // namespace
}  // namespace gz::test
