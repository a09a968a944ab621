// Gloo backend, ranks as threads over real loopback TCP: every op x dtype x world size vs a
// reference, async ordering, sub-groups, timeouts and abort.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "comm/test_gloo_common.h"
#include "gz/comm/net_address.h"
#include "gz/comm/gloo.h"
#include "gz/core/error.h"
#include "gz/store/mem_store.h"
#include "support/run_ranks.h"

namespace gz::test {
namespace {

using namespace std::chrono_literals;
using comm::GlooOptions;
using comm::ReduceOp;

GlooOptions opts(Duration timeout = 20s) {
  GlooOptions o;
  o.timeout = timeout;
  return o;
}

class GlooWorld : public ::testing::TestWithParam<int> {};

TEST_P(GlooWorld, AllCollectivesMatchReference) {
  const int world = GetParam();
  run_ranks(world, [&](int rank, std::shared_ptr<Store> store) {
    auto c = comm::create_gloo_communicator(rank, world, store, opts());
    EXPECT_EQ(c->rank(), rank);
    EXPECT_EQ(c->size(), world);
    EXPECT_EQ(c->backend(), "gloo");
    check_all_collectives(*c, world <= 4);
  });
}

TEST_P(GlooWorld, AsyncOpsRunInIssueOrder) {
  const int world = GetParam();
  run_ranks(world, [&](int rank, std::shared_ptr<Store> store) {
    auto c = comm::create_gloo_communicator(rank, world, store, opts());
    constexpr int kOps = 6;
    std::vector<std::vector<float>> bufs(kOps, std::vector<float>(1000));
    std::vector<comm::WorkPtr> works;
    for (int k = 0; k < kOps; ++k) {
      for (size_t i = 0; i < bufs[k].size(); ++i) bufs[k][i] = static_cast<float>(rank + k + i % 5);
      works.push_back(c->allreduce_async(bufs[k].data(), bufs[k].size(), DType::f32, comm::ReduceOp::sum));
    }
    // A synchronous op after async ones waits for them (same order on every rank).
    std::vector<float> tail(3, 1.0f);
    c->allreduce(tail.data(), tail.size(), DType::f32, comm::ReduceOp::sum);
    for (auto& w : works) w->wait();
    for (int k = 0; k < kOps; ++k)
      for (size_t i = 0; i < bufs[k].size(); ++i) {
        float want = 0;
        for (int r = 0; r < world; ++r) want += static_cast<float>(r + k + i % 5);
        ASSERT_EQ(bufs[k][i], want) << "op " << k << " i " << i;
      }
    EXPECT_EQ(tail[0], static_cast<float>(world));
    EXPECT_EQ(c->sequence(), static_cast<uint64_t>(kOps + 1));
  });
}

TEST_P(GlooWorld, NewGroupOfOddRanks) {
  const int world = GetParam();
  run_ranks(world, [&](int rank, std::shared_ptr<Store> store) {
    auto c = comm::create_gloo_communicator(rank, world, store, opts());
    std::vector<int> odd;
    for (int r = 1; r < world; r += 2) odd.push_back(r);
    if (odd.empty()) return;
    auto g = c->new_group(odd);
    if (rank % 2 == 0) {
      EXPECT_EQ(g, nullptr);
    } else {
      ASSERT_NE(g, nullptr);
      EXPECT_EQ(g->rank(), rank / 2);
      EXPECT_EQ(g->size(), static_cast<int>(odd.size()));
      int64_t v = rank;
      g->allreduce(&v, 1, DType::i64, comm::ReduceOp::sum);
      int64_t want = 0;
      for (int r : odd) want += r;
      EXPECT_EQ(v, want);
    }
    // The parent group still works after creating a sub-group.
    int32_t one = 1;
    c->allreduce(&one, 1, DType::i32, comm::ReduceOp::sum);
    EXPECT_EQ(one, world);
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, GlooWorld, ::testing::ValuesIn(world_sizes()));

// The collective paths: on the synchronous mesh the exchange (all-reduces up to
// GlooOptions::sync_max_bytes) and the pipelined ring (larger all-reduces, reduce-scatter,
// all-gather; GlooOptions::segment_bytes), else Gloo's own algorithms on the first mesh (its ring
// over cached unbound buffers).
struct PathCase {
  const char* name;
  long long sync_max;  // GlooOptions::sync_max_bytes
  long long segment;   // GlooOptions::segment_bytes
  int world;
};
void PrintTo(const PathCase& p, std::ostream* os) { *os << p.name << "_" << p.world; }

class GlooPath : public ::testing::TestWithParam<PathCase> {
 protected:
  GlooOptions path_opts(Duration timeout = 20s) const {
    GlooOptions o = opts(timeout);
    o.sync_max_bytes = GetParam().sync_max;
    o.segment_bytes = GetParam().segment;
    return o;
  }
};

// Every op x dtype x reduce op against the reference, with every all-reduce on Gloo's ring
// ("gloo"), on the exchange up to 256 KiB ("exchange": the limit asked for is 1 MiB, capped, so the
// 1 MiB all-reduce takes Gloo's ring), on our ring in 4 KiB segments ("ring": multi-segment
// blocks, blocks of a few or no elements), or split at 64 bytes (13 x f32 on the exchange, 13 x
// f64 on our ring).
TEST_P(GlooPath, AllCollectivesMatchReference) {
  const int world = GetParam().world;
  run_ranks(world, [&](int rank, std::shared_ptr<Store> store) {
    auto c = comm::create_gloo_communicator(rank, world, store, path_opts());
    check_all_collectives(*c, world <= 4, false);
  });
}

// Pre-built per (pointer, count, dtype, op): the same buffer all-reduced again must send its new
// contents, and a different count, dtype or op on the same pointer must not reuse the old entry.
TEST_P(GlooPath, ReusedBufferSendsFreshDataAndKeysOnCountDtypeAndOp) {
  const int world = GetParam().world;
  run_ranks(world, [&](int rank, std::shared_ptr<Store> store) {
    auto c = comm::create_gloo_communicator(rank, world, store, path_opts());
    std::vector<uint8_t> buf(8 * 4096);
    for (int step = 0; step < 3; ++step) {
      for (DType t : {DType::f32, DType::i32, DType::f64})
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min})
          for (size_t count : {size_t{5}, size_t{3}, size_t{4096}}) {
            for (size_t i = 0; i < count; ++i) store_as(t, buf.data(), i, input_value(rank, i, t, op, step));
            c->allreduce(buf.data(), count, t, op);
            for (size_t i = 0; i < count; ++i)
              ASSERT_EQ(load_as(t, buf.data(), i), reference_value(world, i, t, op, step))
                  << dtype_name(t) << " " << comm::reduce_op_name(op) << " count " << count << " step "
                  << step << " i " << i;
          }
    }
  });
}

// A rank blocked in an all-reduce whose peer never joins: abort() from another thread must end
// it within 1 s (the synchronous mesh's reader sits in recv() holding its pair's lock), and an
// op's own deadline must end it with TimeoutError naming the op, on both paths.
TEST_P(GlooPath, AbortWakesABlockedAllreduceWithinASecond) {
  if (GetParam().world != 2) GTEST_SKIP() << "two ranks are enough";
  std::atomic<bool> done{false};
  run_ranks(2, [&](int rank, std::shared_ptr<Store> store) {
    auto c = comm::create_gloo_communicator(rank, 2, store, path_opts(30s));
    c->barrier();
    if (rank == 1) {
      while (!done.load()) std::this_thread::sleep_for(5ms);
      return;
    }
    // The abort time is read only after join(): the killer thread writes it.
    std::chrono::steady_clock::time_point aborted_at;
    std::thread killer([&] {
      std::this_thread::sleep_for(200ms);
      aborted_at = std::chrono::steady_clock::now();
      c->abort("test abort");
    });
    std::vector<float> v(16, 1.0f);
    EXPECT_THROW(c->allreduce(v.data(), v.size(), DType::f32, ReduceOp::sum), Aborted);
    const auto left_at = std::chrono::steady_clock::now();
    killer.join();
    const double waited = std::chrono::duration<double>(left_at - aborted_at).count();
    EXPECT_LT(waited, 1.0) << "left the all-reduce " << waited << " s after abort";
    EXPECT_THROW(c->allreduce(v.data(), v.size(), DType::f32, ReduceOp::sum), Aborted);
    done = true;
  });
}

TEST_P(GlooPath, OpDeadlineEndsABlockedAllreduce) {
  if (GetParam().world != 2) GTEST_SKIP() << "two ranks are enough";
  std::atomic<bool> done{false};
  run_ranks(2, [&](int rank, std::shared_ptr<Store> store) {
    auto c = comm::create_gloo_communicator(rank, 2, store, path_opts(30s));
    c->barrier();
    if (rank == 1) {
      while (!done.load()) std::this_thread::sleep_for(5ms);
      return;
    }
    std::vector<float> v(16, 1.0f);
    Stopwatch sw;
    try {
      c->allreduce(v.data(), v.size(), DType::f32, ReduceOp::sum, comm::OpOptions::within(300ms));
      ADD_FAILURE() << "all-reduce without rank 1 succeeded";
    } catch (const TimeoutError& e) {
      EXPECT_NE(std::string(e.what()).find("allreduce"), std::string::npos) << e.what();
    }
    EXPECT_GE(sw.seconds(), 0.25);
    EXPECT_LT(sw.seconds(), 0.3 + 1.0);
    done = true;
  });
}

INSTANTIATE_TEST_SUITE_P(Paths, GlooPath,
                         ::testing::Values(PathCase{"gloo", 0, 0, 2}, PathCase{"gloo", 0, 0, 3},
                                           PathCase{"exchange", 1 << 20, 0, 2},
                                           PathCase{"exchange", 1 << 20, 0, 3},
                                           PathCase{"exchange", 1 << 20, 0, 7}, PathCase{"ring", 0, 4096, 2},
                                           PathCase{"ring", 0, 4096, 3}, PathCase{"split", 64, 4096, 2},
                                           PathCase{"split", 64, 4096, 4}),
                         [](const auto& info) {
                           return std::string(info.param.name) + "_" + std::to_string(info.param.world);
                         });

TEST(Gloo, MissingPeerAtConnectTimesOut) {
  auto store = std::make_shared<MemStore>();
  Stopwatch sw;
  try {
    comm::create_gloo_communicator(0, 2, store, opts(1500ms));
    FAIL() << "connect without the peer succeeded";
  } catch (const TimeoutError& e) {
    EXPECT_LT(sw.seconds(), 5.0);
    EXPECT_NE(std::string(e.what()).find("1"), std::string::npos) << e.what();
  }
}

TEST(Gloo, StuckPeerMakesCollectiveTimeOut) {
  std::atomic<bool> done{false};
  run_ranks(2, [&](int rank, std::shared_ptr<Store> store) {
    auto c = comm::create_gloo_communicator(rank, 2, store, opts(1500ms));
    float x = 1;
    c->allreduce(&x, 1, DType::f32, comm::ReduceOp::sum);
    EXPECT_EQ(x, 2.0f);
    if (rank == 1) {
      // Rank 1 skips the next op: rank 0 must fail with a timeout naming op and sequence.
      while (!done.load()) std::this_thread::sleep_for(10ms);
      return;
    }
    Stopwatch sw;
    try {
      c->allreduce(&x, 1, DType::f32, comm::ReduceOp::sum);
      ADD_FAILURE() << "allreduce without the peer succeeded";
    } catch (const TimeoutError& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("allreduce"), std::string::npos) << m;
      EXPECT_NE(m.find("#1"), std::string::npos) << m;
      EXPECT_NE(m.find("rank 0"), std::string::npos) << m;
    }
    EXPECT_LT(sw.seconds(), 1.5 + 2.0);
    done = true;
  });
}

TEST(Gloo, ClosedPeerGivesPeerErrorOrTimeout) {
  run_ranks(3, [&](int rank, std::shared_ptr<Store> store) {
    auto c = comm::create_gloo_communicator(rank, 3, store, opts(2s));
    int32_t x = 1;
    c->allreduce(&x, 1, DType::i32, comm::ReduceOp::sum);
    EXPECT_EQ(x, 3);
    if (rank == 2) {
      c.reset();  // closes its sockets, like a process that exits
      return;
    }
    Stopwatch sw;
    try {
      c->allreduce(&x, 1, DType::i32, comm::ReduceOp::sum);
      ADD_FAILURE() << "allreduce with a closed peer succeeded";
    } catch (const PeerError& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("allreduce #1"), std::string::npos) << m;
      // The first failure seen may be secondary (rank 1 closing after its own error).
      EXPECT_NE(m.find("peer"), std::string::npos) << m;
    } catch (const TimeoutError& e) {
      EXPECT_NE(std::string(e.what()).find("allreduce #1"), std::string::npos) << e.what();
    }
    EXPECT_LT(sw.seconds(), 2.0 + 2.0);
  });
}

TEST(Gloo, AbortWakesBlockedRecvAndFailsLaterOps) {
  run_ranks(2, [&](int rank, std::shared_ptr<Store> store) {
    auto c = comm::create_gloo_communicator(rank, 2, store, opts(10s));
    c->barrier();
    if (rank == 1) {
      // Rank 1 never sends; rank 0 is blocked in recv until its own abort.
      std::this_thread::sleep_for(300ms);
      return;
    }
    std::thread killer([&] {
      std::this_thread::sleep_for(200ms);
      c->abort("test abort");
    });
    Stopwatch sw;
    int32_t v = 0;
    EXPECT_THROW(c->recv(&v, 1, DType::i32, 1, 0), Aborted);
    EXPECT_LT(sw.seconds(), 5.0);
    killer.join();
    EXPECT_THROW(c->allreduce(&v, 1, DType::i32, comm::ReduceOp::sum), Aborted);
  });
}

// Gloo cannot cancel a running collective: abort() makes it end as Aborted by its timeout at the
// latest (documented in gloo.h). Peers blocked on the aborting rank fail at once (closed sockets).
TEST(Gloo, AbortDuringBlockedCollective) {
  std::atomic<bool> done{false};
  run_ranks(2, [&](int rank, std::shared_ptr<Store> store) {
    auto c = comm::create_gloo_communicator(rank, 2, store, opts(2s));
    c->barrier();
    if (rank == 1) {
      while (!done.load()) std::this_thread::sleep_for(10ms);
      return;
    }
    std::thread killer([&] {
      std::this_thread::sleep_for(200ms);
      c->abort("test abort");
    });
    Stopwatch sw;
    std::vector<float> v(1000, 1.0f);
    EXPECT_THROW(c->allreduce(v.data(), v.size(), DType::f32, comm::ReduceOp::sum), Aborted);
    std::fprintf(stderr, "collective aborted after %.2f s\n", sw.seconds());
    EXPECT_LT(sw.seconds(), 2.0 + 2.0);
    killer.join();
    done = true;
  });
}

TEST(Gloo, BadArgumentsAreRejected) {
  auto store = std::make_shared<MemStore>();
  EXPECT_THROW(comm::create_gloo_communicator(2, 2, store, opts()), InvalidArgument);
  EXPECT_THROW(comm::create_gloo_communicator(0, 0, store, opts()), InvalidArgument);
  EXPECT_THROW(comm::create_gloo_communicator(0, 1, nullptr, opts()), InvalidArgument);
  auto c = comm::create_gloo_communicator(0, 1, store, opts());
  float x = 0;
  EXPECT_THROW(c->broadcast(&x, 1, DType::f32, 1), InvalidArgument);
  EXPECT_THROW(c->allreduce(nullptr, 4, DType::f32, comm::ReduceOp::sum), InvalidArgument);
  EXPECT_THROW(c->new_group({0, 0}), InvalidArgument);
  EXPECT_THROW(c->new_group({3}), InvalidArgument);
}

GlooOptions p2p_opts(Duration timeout = 20s) {
  GlooOptions o = opts(timeout);
  o.p2p_only = true;
  return o;
}

// A point-to-point communicator connects nothing when it is created and then only the pairs that
// exchange messages: their addresses are the only ones in the store.
TEST(GlooLazy, ConnectsOnlyThePairsThatTalk) {
  auto store = std::make_shared<MemStore>();
  run_ranks(
      4,
      [&](int rank, std::shared_ptr<Store> s) {
        auto c = comm::create_gloo_communicator(rank, 4, s, p2p_opts());
        if (rank > 1) return;
        int32_t v = rank + 10, got = 0;
        const int peer = 1 - rank;
        if (rank == 0) {
          c->send(&v, 1, DType::i32, peer, 5);
          c->recv(&got, 1, DType::i32, peer, 6);
        } else {
          c->recv(&got, 1, DType::i32, peer, 5);
          c->send(&v, 1, DType::i32, peer, 6);
        }
        EXPECT_EQ(got, peer + 10);
      },
      store);
  EXPECT_TRUE(store->check({"gloo_lazy/p2p_addr/0/1", "gloo_lazy/p2p_addr/1/0"}));
  for (int a = 0; a < 4; ++a)
    for (int b = 0; b < 4; ++b)
      if (a != b && a + b != 1)
        EXPECT_FALSE(store->check({"gloo_lazy/p2p_addr/" + std::to_string(a) + "/" + std::to_string(b)}))
            << a << " -> " << b << " was connected";
  EXPECT_EQ(store->num_keys(), 2) << "creating point-to-point communicators wrote to the store";
}

// Messages around a ring, each rank connecting its two neighbours on the way; then every op on the
// same communicator (a collective connects every pair first), send/recv included.
TEST(GlooLazy, RingOfMessagesThenEveryCollective) {
  run_ranks(4, [&](int rank, std::shared_ptr<Store> store) {
    auto c = comm::create_gloo_communicator(rank, 4, store, p2p_opts());
    const int right = (rank + 1) % 4, left = (rank + 3) % 4;
    std::vector<float> out(1000, static_cast<float>(rank)), in(1000, -1.0f);
    if (rank % 2 == 0) {
      c->send(out.data(), out.size(), DType::f32, right, 1);
      c->recv(in.data(), in.size(), DType::f32, left, 1);
    } else {
      c->recv(in.data(), in.size(), DType::f32, left, 1);
      c->send(out.data(), out.size(), DType::f32, right, 1);
    }
    EXPECT_EQ(in[999], static_cast<float>(left));
    check_all_collectives(*c, false, true);
  });
}

// A rank waiting for its peer to show up for the first message is still bounded by the op's
// deadline and woken by abort().
TEST(GlooLazy, FirstMessageHonoursDeadlineAndAbort) {
  std::atomic<bool> done{false};
  run_ranks(2, [&](int rank, std::shared_ptr<Store> store) {
    auto c = comm::create_gloo_communicator(rank, 2, store, p2p_opts(30s));
    if (rank == 1) {
      while (!done.load()) std::this_thread::sleep_for(5ms);
      return;
    }
    int32_t v = 0;
    Stopwatch sw;
    EXPECT_THROW(c->recv(&v, 1, DType::i32, 1, comm::OpOptions{std::chrono::milliseconds(300), {}, 0}),
                 TimeoutError);
    EXPECT_LT(sw.seconds(), 1.3);
    std::thread killer([&] {
      std::this_thread::sleep_for(200ms);
      c->abort("test abort");
    });
    sw.reset();
    EXPECT_THROW(c->recv(&v, 1, DType::i32, 1, 0), Aborted);
    EXPECT_LT(sw.seconds(), 1.2);
    killer.join();
    done = true;
  });
}

TEST(Gloo, LocalAddressTowardsLoopback) { EXPECT_EQ(comm::local_address_towards("127.0.0.1"), "127.0.0.1"); }

// GZ_SOCKET_IFNAME / GlooOptions::iface: an interface name or a local address; anything else is
// an InvalidArgument that names where it came from and what this machine has.
TEST(Gloo, ListenAddressForInterfacesAndAddresses) {
  EXPECT_EQ(comm::listen_address_for("lo"), "127.0.0.1");
  EXPECT_EQ(comm::listen_address_for("127.0.0.1"), "127.0.0.1");
  try {
    comm::listen_address_for("gznosuch0", "MY_VAR");
    ADD_FAILURE() << "an unknown interface was accepted";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("MY_VAR=gznosuch0"), std::string::npos) << m;
    EXPECT_NE(m.find("no network interface"), std::string::npos) << m;
    EXPECT_NE(m.find("lo"), std::string::npos) << m;  // the interfaces there are
  }
  try {
    comm::listen_address_for("192.0.2.1");  // TEST-NET-1: never configured here
    ADD_FAILURE() << "a foreign address was accepted";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("GZ_SOCKET_IFNAME=192.0.2.1 is not an address of this machine"), std::string::npos) << m;
    EXPECT_NE(m.find("127.0.0.1"), std::string::npos) << m;
  }
  EXPECT_TRUE(comm::is_loopback_address("127.0.0.1"));
  EXPECT_TRUE(comm::is_loopback_address("127.1.2.3"));
  EXPECT_TRUE(comm::is_loopback_address("::1"));
  EXPECT_FALSE(comm::is_loopback_address("10.0.0.1"));
}

// Before connecting, at once: not as a connect failure (PeerError) or timeout.
TEST(Gloo, BadInterfaceFailsCreateWithInvalidArgument) {
  auto store = std::make_shared<MemStore>();
  GlooOptions o = opts(5s);
  o.iface = "gznosuch0";
  Stopwatch sw;
  try {
    comm::create_gloo_communicator(0, 2, store, o);
    ADD_FAILURE() << "an unknown interface was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("GlooOptions::iface=gznosuch0"), std::string::npos) << e.what();
  }
  setenv("GZ_SOCKET_IFNAME", "192.0.2.1", 1);
  try {
    comm::create_gloo_communicator(0, 2, store, opts(5s));
    ADD_FAILURE() << "a foreign address was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("GZ_SOCKET_IFNAME=192.0.2.1"), std::string::npos) << e.what();
  }
  unsetenv("GZ_SOCKET_IFNAME");
  EXPECT_LT(sw.seconds(), 1.0);
}

}  // namespace
}  // namespace gz::test
