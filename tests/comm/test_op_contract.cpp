// The per-op contract on every in-process backend (shm, gloo, hierarchical shm+gloo): each op
// carries its own deadline; abort() completes the running op and every queued one with an error
// within a second on every rank taking part; destroying a communicator with ops pending aborts
// them instead of running each to its deadline; errors keep their type, peer and cause.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "gz/comm/factory.h"
#include "gz/core/error.h"
#include "support/run_ranks.h"

namespace gz::test {
namespace {

using namespace std::chrono_literals;

// Far beyond every bound checked here: a test that passes cannot have waited for it.
constexpr Duration kLongTimeout = 30s;

struct Backend {
  const char* name;
  std::string backend;
  std::vector<std::string> nodes;  // node id of each rank
};
void PrintTo(const Backend& b, std::ostream* os) { *os << b.name; }

comm::CommPtr make(const Backend& b, int rank, std::shared_ptr<Store> store) {
  comm::CommOptions o;
  o.backend = b.backend;
  o.rank = rank;
  o.size = static_cast<int>(b.nodes.size());
  o.store = std::move(store);
  o.timeout = kLongTimeout;
  o.node_id = b.nodes[rank];
  o.iface = "127.0.0.1";
  return comm::create_communicator(o);
}

class OpContract : public ::testing::TestWithParam<Backend> {};

// Ranks 0 and 1 enter an all-reduce that rank 2 never joins; 200 ms later both abort (as a
// job-wide failure handler does). Each must leave the op within 1 s of its abort, never at the
// 30 s deadline, and refuse later ops.
TEST_P(OpContract, AbortWakesTheBlockedOpOnEveryRank) {
  std::atomic<int> left{0};
  run_ranks(3, [&](int rank, std::shared_ptr<Store> store) {
    auto c = make(GetParam(), rank, store);
    c->barrier();
    if (rank == 2) {
      while (left.load() < 2) std::this_thread::sleep_for(5ms);
      return;
    }
    std::vector<float> v(4096, 1.0f);
    // The abort time is read only after join(): the aborter writes it, and the op may end
    // (the other rank's abort arriving first) before this thread's own abort.
    std::chrono::steady_clock::time_point aborted_at;
    std::thread aborter([&] {
      std::this_thread::sleep_for(200ms);
      aborted_at = std::chrono::steady_clock::now();
      c->abort("test abort");
    });
    try {
      c->allreduce(v.data(), v.size(), DType::f32, comm::ReduceOp::sum);
      ADD_FAILURE() << "rank " << rank << ": all-reduce without rank 2 succeeded";
    } catch (const Aborted&) {
    } catch (const PeerError&) {  // the other rank's abort may arrive first
    }
    const auto left_at = std::chrono::steady_clock::now();
    aborter.join();
    const double waited = std::chrono::duration<double>(left_at - aborted_at).count();
    EXPECT_LT(waited, 1.0) << "rank " << rank << " left the op " << waited << " s after abort";
    EXPECT_THROW(c->barrier(), Aborted) << "ops after abort() must fail";
    ++left;
  });
}

// Rank 1 waits in an all-reduce for rank 0, which aborts instead of joining: the abort reaches
// rank 1 (closed sockets, poisoned shared memory) within 1 s.
TEST_P(OpContract, AbortReachesAPeerBlockedOnThisRank) {
  run_ranks(2, [&](int rank, std::shared_ptr<Store> store) {
    Backend two{GetParam().name, GetParam().backend, {GetParam().nodes[0], GetParam().nodes[2]}};
    auto c = make(two, rank, store);
    c->barrier();
    if (rank == 0) {
      std::this_thread::sleep_for(200ms);
      c->abort("test abort");
      return;
    }
    std::vector<float> v(4096, 1.0f);
    Stopwatch sw;
    try {
      c->allreduce(v.data(), v.size(), DType::f32, comm::ReduceOp::sum);
      ADD_FAILURE() << "all-reduce without rank 0 succeeded";
    } catch (const Aborted&) {
    } catch (const PeerError& e) {
      EXPECT_NE(std::string(e.what()).find("allreduce"), std::string::npos) << e.what();
    }
    EXPECT_LT(sw.seconds(), 0.2 + 1.0) << "rank 1 learnt of the abort after " << sw.seconds() << " s";
  });
}

// Three async ops queue up behind one that cannot finish; abort() completes all of them.
TEST_P(OpContract, AbortCompletesQueuedAndRunningWorks) {
  std::atomic<bool> finished{false};
  run_ranks(2, [&](int rank, std::shared_ptr<Store> store) {
    Backend two{GetParam().name, GetParam().backend, {GetParam().nodes[0], GetParam().nodes[2]}};
    auto c = make(two, rank, store);
    c->barrier();
    if (rank == 1) {
      while (!finished.load()) std::this_thread::sleep_for(5ms);
      return;
    }
    std::vector<std::vector<float>> bufs(3, std::vector<float>(256, 1.0f));
    std::vector<comm::WorkPtr> works;
    for (auto& b : bufs) works.push_back(c->allreduce_async(b.data(), b.size(), DType::f32, comm::ReduceOp::sum));
    std::this_thread::sleep_for(200ms);
    Stopwatch sw;
    c->abort("test abort");
    for (auto& w : works) {
      EXPECT_THROW(w->wait(), Aborted);
      EXPECT_TRUE(w->is_completed());
    }
    EXPECT_LT(sw.seconds(), 1.0);
    finished = true;
  });
}

// Dropping a communicator with an op pending must not run it to its deadline.
TEST_P(OpContract, DestroyingWithPendingOpsAbortsThem) {
  std::atomic<bool> finished{false};
  run_ranks(2, [&](int rank, std::shared_ptr<Store> store) {
    Backend two{GetParam().name, GetParam().backend, {GetParam().nodes[0], GetParam().nodes[2]}};
    auto c = make(two, rank, store);
    c->barrier();
    if (rank == 1) {
      while (!finished.load()) std::this_thread::sleep_for(5ms);
      return;
    }
    std::vector<float> a(256, 1.0f), b(256, 1.0f);
    auto w1 = c->allreduce_async(a.data(), a.size(), DType::f32, comm::ReduceOp::sum);
    auto w2 = c->allreduce_async(b.data(), b.size(), DType::f32, comm::ReduceOp::sum);
    std::this_thread::sleep_for(100ms);
    Stopwatch sw;
    c.reset();
    EXPECT_LT(sw.seconds(), 1.0) << "destructor waited " << sw.seconds() << " s";
    ASSERT_TRUE(w1->is_completed());
    ASSERT_TRUE(w2->is_completed());
    EXPECT_THROW(w1->wait(), Aborted);
    EXPECT_THROW(w2->wait(), Aborted);
    finished = true;
  });
}

// An op's own deadline applies to it alone: the communicator's timeout (30 s) is unchanged and
// the next op without options still gets it.
TEST_P(OpContract, EachOpCarriesItsOwnDeadline) {
  std::atomic<bool> finished{false};
  run_ranks(2, [&](int rank, std::shared_ptr<Store> store) {
    Backend two{GetParam().name, GetParam().backend, {GetParam().nodes[0], GetParam().nodes[2]}};
    auto c = make(two, rank, store);
    c->barrier();
    if (rank == 1) {
      while (!finished.load()) std::this_thread::sleep_for(5ms);
      return;
    }
    std::vector<float> v(64, 1.0f);
    Stopwatch sw;
    try {
      c->allreduce(v.data(), v.size(), DType::f32, comm::ReduceOp::sum, comm::OpOptions::within(400ms));
      ADD_FAILURE() << "all-reduce without rank 1 succeeded";
    } catch (const TimeoutError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("allreduce"), std::string::npos) << msg;
      EXPECT_NE(msg.find("rank 0/2"), std::string::npos) << msg;
    } catch (const PeerError& e) {
      ADD_FAILURE() << "expected a timeout: " << e.what();
    }
    EXPECT_GE(sw.seconds(), 0.35);
    EXPECT_LT(sw.seconds(), 0.4 + 1.0);
    EXPECT_EQ(c->timeout(), kLongTimeout);
    finished = true;
  });
}

// A short deadline that an op met must not stay behind in the communicator or in any of its parts
// (the hierarchical backend's sub-communicators, Gloo's socket timeouts): the next op, issued
// without options, gets the long default and so waits out a peer that is late by more than the
// short deadline. Small and large all-reduces (Gloo: the exchange and the ring).
TEST_P(OpContract, ShortDeadlineDoesNotShortenLaterOps) {
  run_ranks(2, [&](int rank, std::shared_ptr<Store> store) {
    Backend two{GetParam().name, GetParam().backend, {GetParam().nodes[0], GetParam().nodes[2]}};
    auto c = make(two, rank, store);
    for (size_t n : {size_t{64}, size_t{300000}}) {
      std::vector<float> v(n, 1.0f);
      c->barrier();
      c->allreduce(v.data(), n, DType::f32, comm::ReduceOp::sum, comm::OpOptions::within(1s));
      ASSERT_EQ(v[0], 2.0f);
      if (rank == 1) std::this_thread::sleep_for(1500ms);  // later than a 1 s deadline would allow
      Stopwatch sw;
      c->allreduce(v.data(), n, DType::f32, comm::ReduceOp::sum);
      EXPECT_EQ(v[n - 1], 4.0f);
      if (rank == 0) EXPECT_GE(sw.seconds(), 1.0);
    }
    EXPECT_EQ(c->timeout(), kLongTimeout);
  });
}

// An async op's deadline counts from when it is issued and bounds its Work's wait().
TEST_P(OpContract, AsyncOpDeadlineBoundsItsWork) {
  std::atomic<bool> finished{false};
  run_ranks(2, [&](int rank, std::shared_ptr<Store> store) {
    Backend two{GetParam().name, GetParam().backend, {GetParam().nodes[0], GetParam().nodes[2]}};
    auto c = make(two, rank, store);
    c->barrier();
    if (rank == 1) {
      while (!finished.load()) std::this_thread::sleep_for(5ms);
      return;
    }
    std::vector<float> v(64, 1.0f);
    Stopwatch sw;
    auto w = c->allreduce_async(v.data(), v.size(), DType::f32, comm::ReduceOp::sum, comm::OpOptions::within(300ms));
    EXPECT_THROW(w->wait(), TimeoutError);
    EXPECT_GE(sw.seconds(), 0.25);
    EXPECT_LT(sw.seconds(), 0.3 + 1.0);
    finished = true;
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, OpContract,
                         ::testing::Values(Backend{"shm", "shm", {"n", "n", "n"}},
                                           Backend{"gloo", "gloo", {"n", "n", "n"}},
                                           Backend{"hier", "auto", {"a", "a", "b"}}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace gz::test
