// The Gloo backend's synchronous mesh (small all-reduces as one exchange, larger ones and
// reduce-scatter/all-gather as a pipelined ring): connecting at 7 ranks, agreement on limits,
// failures reaching the peer, and abort never touching a descriptor that is not the mesh's.
// Ranks are threads over real loopback TCP.
//
// tests/comm/netns/narrow_ports.sh runs these in a network namespace whose ephemeral port range
// is narrow, so that connections to different peers always share local ports.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

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
