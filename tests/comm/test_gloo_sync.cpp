// The Gloo backend's synchronous mesh (small all-reduces as one exchange, larger ones and
// reduce-scatter/all-gather as a pipelined ring): connecting at 7 ranks, agreement on limits,
// failures reaching the peer, and abort never touching a descriptor that is not the mesh's.
// Ranks are threads over real loopback TCP.
//
// tests/comm/netns/narrow_ports.sh runs these in a network namespace whose ephemeral port range
// is narrow, so that connections to different peers always share local ports.
#include <gloo/transport/tcp/device.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "comm/gloo/sync_mesh.h"
#include "comm/reduce/reduce.h"
#include "comm/test_gloo_common.h"
#include "gz/comm/gloo.h"
#include "gz/core/error.h"
#include "support/run_ranks.h"

namespace gz::test {
namespace {

using namespace std::chrono_literals;
using comm::GlooOptions;
using comm::OpOptions;
using comm::ReduceOp;

GlooOptions opts(Duration timeout = 20s, long long sync_max = -1, long long segment = -1) {
  GlooOptions o;
  o.timeout = timeout;
  o.sync_max_bytes = sync_max;
  o.segment_bytes = segment;
  return o;
}

// Sum of rank + i over ranks, for an f32 all-reduce of `n` elements; checks every element.
void allreduce_and_check(comm::Communicator& c, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(c.rank() + i % 7);
  c.allreduce(v.data(), n, DType::f32, ReduceOp::sum);
  for (size_t i = 0; i < n; ++i) {
    float want = 0;
    for (int r = 0; r < c.size(); ++r) want += static_cast<float>(r + i % 7);
    ASSERT_EQ(v[i], want) << "n " << n << " i " << i << " rank " << c.rank();
  }
}

// Connecting used to find each pair's socket by its local address, which Linux shares between
// connections to different peers (ephemeral ports): at 7 ranks in one process a rank now and
// then found two sockets and gave up, and its peers saw "connection closed by peer".
TEST(GlooSync, ConnectsSevenRanksOverAndOver) {
  for (int round = 0; round < 3; ++round) {
    run_ranks(7, [&](int rank, std::shared_ptr<Store> store) {
      auto c = comm::create_gloo_communicator(rank, 7, store, opts(20s, -1, 4096));
      allreduce_and_check(*c, 100);     // the exchange
      allreduce_and_check(*c, 100000);  // the ring, many segments
    });
  }
}

// Limits are the group's minimum: ranks asking for different thresholds and segments must still
// pick the same algorithm for every op and cut messages alike.
TEST(GlooSync, RanksWithDifferentLimitsAgree) {
  run_ranks(3, [&](int rank, std::shared_ptr<Store> store) {
    auto c = comm::create_gloo_communicator(rank, 3, store, opts(20s, 1024 * (rank + 1), 4096 * (3 - rank)));
    for (size_t n : {size_t{100}, size_t{256}, size_t{257}, size_t{800}, size_t{3000}, size_t{50000}})
      allreduce_and_check(*c, n);
  });
}

// When an op fails on the synchronous mesh, the peer it failed on must learn at once: the mesh
// holds its own duplicate of each socket, so Gloo closing its descriptor alone would leave the
// connection open and the peer waiting until its own deadline.
class GlooSyncPath : public ::testing::TestWithParam<size_t> {};

TEST_P(GlooSyncPath, PeerOfATimedOutRankFailsPromptly) {
  const size_t n = GetParam();
  std::atomic<bool> rank0_failed{false}, rank1_done{false};
  run_ranks(2, [&](int rank, std::shared_ptr<Store> store) {
    auto c = comm::create_gloo_communicator(rank, 2, store, opts(20s, -1, 4096));
    allreduce_and_check(*c, n);
    std::vector<float> v(n, 1.0f);
    if (rank == 0) {
      EXPECT_THROW(c->allreduce(v.data(), n, DType::f32, ReduceOp::sum, OpOptions::within(300ms)),
                   TimeoutError);
      rank0_failed = true;
      // Alive (not destroyed, which would close everything) while rank 1 tries.
      while (!rank1_done.load()) std::this_thread::sleep_for(5ms);
      return;
    }
    while (!rank0_failed.load()) std::this_thread::sleep_for(5ms);
    // Rank 0 wrote its part before it gave up, so rank 1's first op may still complete from it
    // (a small all-reduce does); the next one cannot.
    Stopwatch sw;
    EXPECT_THROW(
        {
          c->allreduce(v.data(), n, DType::f32, ReduceOp::sum, OpOptions::within(10s));
          c->allreduce(v.data(), n, DType::f32, ReduceOp::sum, OpOptions::within(10s));
        },
        Error);
    EXPECT_LT(sw.seconds(), 2.0) << "rank 1 noticed rank 0's failure only after " << sw.seconds() << " s";
    rank1_done = true;
  });
}

INSTANTIATE_TEST_SUITE_P(Sizes, GlooSyncPath, ::testing::Values(size_t{16}, size_t{100000}),
                         [](const auto& info) { return info.param == 16 ? "exchange" : "ring"; });

// A peer that trickles bytes (one every 50 ms, each socket read succeeding long before its
// timeout) must not stretch an op past its deadline: the deadline holds for the whole op. The
// mesh is built here directly (rank 1's "peer" is the test writing into its end of the socket).
TEST(GlooSync, ATricklingPeerCannotStretchAnOpPastItsDeadline) {
  std::atomic<bool> rank0_done{false};
  std::atomic<int> ready{0};
  run_ranks(2, [&](int rank, std::shared_ptr<Store> store) {
    ::gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    auto device = ::gloo::transport::tcp::CreateDevice(attr);
    const std::string record = comm::gloo_impl::sync_limits_record(64 << 10, 0);
    comm::gloo_impl::SyncMesh mesh(rank, 2, comm::gloo_impl::agree_sync_limits({record, record}), device,
                                   store, 10s);
    ++ready;  // both ends in synchronous mode before anything is written
    while (ready.load() < 2) std::this_thread::sleep_for(1ms);
    if (rank == 1) {
      const char zero = 0;
      for (int i = 0; i < 100 && !rank0_done.load(); ++i) {
        (void)!::send(mesh.socket(0), &zero, 1, MSG_NOSIGNAL);
        std::this_thread::sleep_for(50ms);
      }
      return;
    }
    std::vector<float> v(16, 1.0f);
    const auto sum = comm::reduce::make_reduce_fn(DType::f32, ReduceOp::sum);
    int peer = -1;
    Stopwatch sw;
    EXPECT_ANY_THROW(comm::gloo_impl::sync_exchange_allreduce(mesh, v.data(), v.size(), sizeof(float), sum,
                                                              Deadline::after(500ms), &peer));
    EXPECT_LT(sw.seconds(), 1.5) << "the op ran " << sw.seconds() << " s with a 0.5 s deadline";
    EXPECT_TRUE(mesh.expired());
    rank0_done = true;
  });
}

// A failure poisons the whole mesh. On the ring, rank 0 reads from rank 2 and writes to rank 1:
// when rank 0 gives up on a slow rank 2, rank 1, waiting for rank 0's next segments, must fail at
// once (before, only the socket to rank 2 was shut down and rank 1 waited until its own 10 s
// deadline), and no rank may go on with the mesh afterwards.
TEST(GlooSync, AFailurePoisonsTheWholeMesh) {
  const size_t n = 100000;  // the ring, in 4 KiB segments
  std::atomic<int> failed_first{0};
  run_ranks(3, [&](int rank, std::shared_ptr<Store> store) {
    auto c = comm::create_gloo_communicator(rank, 3, store, opts(20s, -1, 4096));
    allreduce_and_check(*c, n);
    std::vector<float> v(n, 1.0f);
    Stopwatch sw;
    if (rank == 2) std::this_thread::sleep_for(2000ms);  // too slow for rank 0's deadline
    const Duration deadline = rank == 0 ? Duration(300ms) : Duration(10s);
    EXPECT_THROW(c->allreduce(v.data(), n, DType::f32, ReduceOp::sum, OpOptions::within(deadline)), Error)
        << "rank " << rank;
    if (rank == 1)
      EXPECT_LT(sw.seconds(), 1.8) << "rank 1 learnt of rank 0's failure only after " << sw.seconds() << " s";
    ++failed_first;
    while (failed_first.load() < 3) std::this_thread::sleep_for(5ms);
    // The next op fails on every rank at once, naming the earlier failure.
    sw.reset();
    try {
      c->allreduce(v.data(), n, DType::f32, ReduceOp::sum, OpOptions::within(10s));
      ADD_FAILURE() << "rank " << rank << " went on with a poisoned mesh";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("unusable since an earlier op failed"), std::string::npos)
          << "rank " << rank << ": " << e.what();
    }
    EXPECT_LT(sw.seconds(), 0.5) << "rank " << rank;
  });
}

// The watchdog may fire between an op's last call and its end (the op succeeded; the mesh's
// sockets are shut down now). The next op must then fail at once with that reason, not report a
// timeout of its own blaming a peer it never waited for. Before, nothing recorded it: the next op
// failed on the shut-down sockets and, the mesh "expired", said its own deadline had passed.
TEST(GlooSync, AnExpiryAfterAnOpsLastCallIsNotBlamedOnTheNextOp) {
  run_ranks(2, [&](int rank, std::shared_ptr<Store> store) {
    ::gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    auto device = ::gloo::transport::tcp::CreateDevice(attr);
    comm::gloo_impl::SyncLimits limits;
    limits.exchange_max = 1024;
    limits.send_buffer = 1 << 16;
    comm::gloo_impl::SyncMesh mesh(rank, 2, limits, device, store, 10s);
    {
      auto op = mesh.begin(Deadline::after(20ms));
      std::this_thread::sleep_for(300ms);  // "the op's last call returned": the deadline passes now
    }
    try {
      auto next = mesh.begin(Deadline::after(5s));
      ADD_FAILURE() << "rank " << rank << ": the next op started on a mesh the watchdog shut down";
    } catch (const PeerError& e) {
      EXPECT_NE(std::string(e.what()).find("deadline passed just as it completed"), std::string::npos)
          << e.what();
    }
  });
}

// After Gloo closed a failed pair's descriptor its number is free for anyone; abort() must only
// ever reach the mesh's own duplicates. Sockets opened after the failure (one of them takes the
// freed number: POSIX hands out the lowest free descriptor) must still work after abort().
TEST(GlooSync, AbortNeverTouchesAReusedDescriptor) {
  std::atomic<bool> rank0_done{false};
  run_ranks(2, [&](int rank, std::shared_ptr<Store> store) {
    auto c = comm::create_gloo_communicator(rank, 2, store, opts(20s));
    allreduce_and_check(*c, 16);
    if (rank == 1) {
      while (!rank0_done.load()) std::this_thread::sleep_for(5ms);
      return;
    }
    float x = 1;
    EXPECT_THROW(c->allreduce(&x, 1, DType::f32, ReduceOp::sum, OpOptions::within(200ms)), TimeoutError);
    std::vector<std::array<int, 2>> pairs(64);
    for (auto& p : pairs) ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, p.data()), 0);
    c->abort("test");
    for (auto& p : pairs) {
      char b = 'x';
      EXPECT_EQ(write(p[0], &b, 1), 1) << "descriptor " << p[0] << " was shut down by abort()";
      EXPECT_EQ(read(p[1], &b, 1), 1) << "descriptor " << p[1] << " was shut down by abort()";
      close(p[0]);
      close(p[1]);
    }
    rank0_done = true;
  });
}

// Every op x dtype at 7 ranks on the ring with small segments (blocks of a few elements, empty
// blocks, many segments per block), under whatever ThreadSanitizer sees.
TEST(GlooSync, SevenRanksEveryCollectiveOnTheRing) {
  run_ranks(7, [&](int rank, std::shared_ptr<Store> store) {
    auto c = comm::create_gloo_communicator(rank, 7, store, opts(20s, 0, 4096));
    check_all_collectives(*c, false, false);
  });
}

}  // namespace
}  // namespace gz::test
