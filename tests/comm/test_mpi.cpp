// MPI backend, run under mpirun (see tests/comm/CMakeLists.txt): every op x dtype vs the
// reference, sub-groups, and a deadline that turns a missing peer into TimeoutError.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "comm/test_gloo_common.h"
#include "gz/comm/factory.h"
#include "gz/comm/mpi.h"
#include "gz/core/env.h"
#include "gz/core/error.h"
#include "gz/store/file_store.h"
#include "gz/store/mem_store.h"

namespace gz::test {
namespace {

using namespace std::chrono_literals;

struct World {
  int rank = 0, size = 1;
};

World world_from_env() {
  Env env = Env::from_process();
  return {static_cast<int>(env.get_int("OMPI_COMM_WORLD_RANK", 0)),
          static_cast<int>(env.get_int("OMPI_COMM_WORLD_SIZE", 1))};
}

TEST(Mpi, AllCollectivesMatchReference) {
  World w = world_from_env();
  comm::MpiOptions o;
  o.timeout = 20s;
  auto c = comm::create_mpi_communicator(w.rank, w.size, o);
  EXPECT_EQ(c->backend(), "mpi");
  EXPECT_EQ(c->rank(), w.rank);
  check_all_collectives(*c, true);
  auto work = c->allreduce_async(nullptr, 0, DType::f32, comm::ReduceOp::sum);
  work->wait();
}

TEST(Mpi, NewGroupAndFactory) {
  World w = world_from_env();
  auto c = comm::create_mpi_communicator(w.rank, w.size, {});
  auto g = c->new_group({0, w.size - 1});
  if (w.rank == 0 || w.rank == w.size - 1) {
    ASSERT_NE(g, nullptr);
    int64_t v = w.rank;
    g->allreduce(&v, 1, DType::i64, comm::ReduceOp::sum);
    EXPECT_EQ(v, w.size == 1 ? 0 : w.size - 1);
  } else {
    EXPECT_EQ(g, nullptr);
  }
  // The factory's explicit "mpi" backend (the store only carries node ids).
  comm::CommOptions fo;
  fo.backend = "mpi";
  fo.rank = w.rank;
  fo.size = w.size;
  fo.store = std::make_shared<MemStore>();  // one per process: node ids are not exchanged here
  if (w.size == 1) {
    auto f = comm::create_communicator(fo);
    EXPECT_EQ(f->backend(), "mpi");
  }
  EXPECT_THROW(comm::create_mpi_communicator(w.rank + 1, w.size, {}), InvalidArgument);
}

// Under mpirun, "auto" across (fake) nodes composes shm inside a node with MPI across nodes.
TEST(Mpi, AutoAcrossNodesUsesShmPlusMpi) {
  World w = world_from_env();
  if (w.size < 2) GTEST_SKIP() << "needs 2 ranks";
  // Every rank is a child of the same mpirun: its pid names a store file they all share.
  std::string path = "/tmp/gz-test-mpi-" + std::to_string(getppid()) + ".store";
  {
    comm::CommOptions fo;
    fo.backend = "auto";
    fo.rank = w.rank;
    fo.size = w.size;
    fo.store = std::make_shared<FileStore>(path);
    fo.timeout = 20s;
    fo.node_id = w.rank < (w.size + 1) / 2 ? "nodeA" : "nodeB";
    auto c = comm::create_communicator(fo);
    EXPECT_EQ(c->backend(), "hier(shm+mpi)");
    check_all_collectives(*c, false);
    c->barrier();
  }
  if (w.rank == 0) std::remove(path.c_str());
}

TEST(Mpi, MissingPeerTimesOut) {
  World w = world_from_env();
  if (w.size < 2) GTEST_SKIP() << "needs 2 ranks";
  comm::MpiOptions o;
  o.timeout = 500ms;
  auto c = comm::create_mpi_communicator(w.rank, w.size, o);
  auto main = comm::create_mpi_communicator(w.rank, w.size, {});
  if (w.rank == 0) {
    Stopwatch sw;
    try {
      c->barrier();
      ADD_FAILURE() << "barrier without the other ranks succeeded";
    } catch (const TimeoutError& e) {
      EXPECT_NE(std::string(e.what()).find("barrier"), std::string::npos) << e.what();
    }
    EXPECT_LT(sw.seconds(), 0.5 + 2.0);
    EXPECT_THROW(c->barrier(), Aborted) << "a timed-out MPI communicator must refuse further ops";
  } else {
    std::this_thread::sleep_for(1500ms);
    c->barrier(comm::OpOptions::within(10s));  // completes: rank 0's abandoned request is still posted
  }
  main->barrier();
}

// Every rank but the last enters an all-reduce the last never joins, and aborts 200 ms later:
// each leaves within 1 s of its abort (not at the 30 s deadline), and later ops throw Aborted.
TEST(Mpi, AbortWakesBlockedOpsOnEveryRank) {
  World w = world_from_env();
  if (w.size < 2) GTEST_SKIP() << "needs 2 ranks";
  comm::MpiOptions o;
  o.timeout = 30s;
  auto c = comm::create_mpi_communicator(w.rank, w.size, o);
  auto main = comm::create_mpi_communicator(w.rank, w.size, {});
  std::vector<float> v(1024, 1.0f);  // outlives the request the aborted ranks leave inside MPI
  if (w.rank != w.size - 1) {
    Stopwatch since_abort;
    std::thread aborter([&] {
      std::this_thread::sleep_for(200ms);
      since_abort.reset();
      c->abort("test abort");
    });
    EXPECT_THROW(c->allreduce(v.data(), v.size(), DType::f32, comm::ReduceOp::sum), Aborted);
    const double waited = since_abort.seconds();
    aborter.join();
    EXPECT_LT(waited, 1.0) << "rank " << w.rank;
    int32_t x = 0;
    EXPECT_THROW(c->recv(&x, 1, DType::i32, w.size - 1), Aborted);
  }
  main->barrier();
  // The last rank joins late, which completes the requests the others abandoned.
  if (w.rank == w.size - 1) c->allreduce(v.data(), v.size(), DType::f32, comm::ReduceOp::sum, comm::OpOptions::within(10s));
  main->barrier();
}

}  // namespace
}  // namespace gz::test
