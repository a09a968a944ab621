// The flight recorder (gz/comm/flight_recorder.h, flight_dump.h): the ring, what the Communicator
// base class and the backends record (states, queued async ops, per-peer arrivals, the peer an
// op blocks on, errors), names of groups and parts, dumps on failure and on SIGUSR1, and that
// the doctor (tools/doctor) reads a real dump and names the rank that never came.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "dump_reader.h"
#include "gz/comm/factory.h"
#include "gz/comm/flight_dump.h"
#include "gz/comm/gloo.h"
#include "gz/comm/hierarchical.h"
#include "gz/comm/shm.h"
#include "gz/core/error.h"
#include "gz/store/prefix_store.h"
#include "support/run_ranks.h"
#include "verdict.h"

namespace gz {
namespace {

using namespace std::chrono_literals;
using comm::FlightRecorder;
using comm::OpInfo;
using comm::OpKind;
using comm::OpRecord;
using comm::OpState;

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A private dump directory for this test process.
struct DumpDir {
  std::string path;
  DumpDir() {
    char tmpl[] = "/tmp/gz-fr-test-XXXXXX";
    path = mkdtemp(tmpl);
    setenv("GZ_DUMP_DIR", path.c_str(), 1);
  }
  ~DumpDir() {
    std::system(("rm -rf " + path).c_str());
    unsetenv("GZ_DUMP_DIR");
  }
};

comm::CommPtr shm(int rank, int size, std::shared_ptr<Store> store, Duration timeout = 5000ms) {
  comm::ShmOptions o;
  o.timeout = timeout;
  return comm::create_shm_communicator(rank, size, std::make_shared<PrefixStore>("fr", store), o);
}

TEST(FlightRecorder, RingKeepsTheLastOpsInOrderWithTheirStates) {
  FlightRecorder fr(16, 0, 2);
  OpInfo info;
  info.kind = OpKind::allreduce;
  info.dtype = DType::f16;
  info.count = 77;
  for (uint64_t s = 0; s < 40; ++s) fr.finish(fr.begin(s, info));
  const uint64_t h = fr.begin(40, info);
  auto snap = fr.snapshot();
  ASSERT_EQ(snap.records.size(), 16u);
  EXPECT_EQ(snap.records.front().seq, 25u);
  EXPECT_EQ(snap.records.back().seq, 40u);
  EXPECT_EQ(snap.records.back().state, OpState::running);
  EXPECT_EQ(snap.records[3].state, OpState::done);
  EXPECT_EQ(snap.records[3].info.count, 77u);
  EXPECT_EQ(snap.records[3].info.dtype, DType::f16);
  EXPECT_EQ(snap.records.back().coll, 40u);
  EXPECT_GE(snap.records[3].end_ns, snap.records[3].start_ns);
  fr.fail(h, std::make_exception_ptr(TimeoutError("allreduce #40: waited for rank 1", 1)));
  snap = fr.snapshot(2);
  ASSERT_EQ(snap.records.size(), 2u);
  EXPECT_EQ(snap.records.back().state, OpState::failed);
  EXPECT_EQ(snap.records.back().error_kind, "timeout");
  EXPECT_EQ(snap.records.back().error_peer, 1);
  EXPECT_NE(snap.records.back().error.find("waited for rank 1"), std::string::npos);
}

TEST(FlightRecorder, PointToPointOpsDoNotShiftCollectiveNumbers) {
  FlightRecorder fr(64, 0, 2);
  OpInfo ar, send;
  ar.kind = OpKind::allreduce;
  send.kind = OpKind::send;
  fr.finish(fr.begin(0, ar));
  fr.finish(fr.begin(1, send));
  fr.finish(fr.begin(2, send));
  fr.finish(fr.begin(3, ar));
  const auto snap = fr.snapshot();
  EXPECT_EQ(snap.records[3].seq, 3u);
  EXPECT_EQ(snap.records[3].coll, 1u);  // the second collective
}

TEST(FlightRecorder, ShmRecordsWhoCameLateAndWhomItWaitsFor) {
  test::run_ranks(3, [](int rank, std::shared_ptr<Store> store) {
    auto c = shm(rank, 3, store);
    std::vector<float> v(1024, 1.0f);
    c->allreduce(v.data(), v.size(), DType::f32, comm::ReduceOp::sum);
    // Rank 2 comes late to op #1: 500 ms, well clear of the 100 ms asserted below, since the
    // others may themselves be descheduled on a loaded (TSan, 2-core) host before they arrive.
    if (rank == 2) std::this_thread::sleep_for(500ms);
    c->allreduce(v.data(), v.size(), DType::f32, comm::ReduceOp::sum);
    c->barrier();
    const auto snap = c->flight_recorder()->snapshot();
    ASSERT_GE(snap.records.size(), 3u);
    const OpRecord& r = snap.records[1];
    EXPECT_EQ(r.seq, 1u);
    EXPECT_EQ(r.info.kind, OpKind::allreduce);
    ASSERT_EQ(r.arrival_ns.size(), 3u);
    if (rank != 2) {
      EXPECT_GE(r.arrival_ns[2], 100'000'000) << "rank 2 came ~500 ms late";
      const auto late = c->flight_recorder()->lateness();
      EXPECT_GE(late.times_last[2], 1u);
      EXPECT_GE(late.late_ns[2], 100'000'000u);
    } else {
      EXPECT_LT(r.arrival_ns[0], 50'000'000) << "the others were there first";
    }
  });
}

TEST(FlightRecorder, RunningOpShowsThePeerItWaitsForAndQueuedOps) {
  test::run_ranks(2, [](int rank, std::shared_ptr<Store> store) {
    auto c = shm(rank, 2, store);
    std::vector<float> a(256, 1.0f), b(256, 1.0f);
    if (rank == 0) {
      auto w1 = c->allreduce_async(a.data(), a.size(), DType::f32, comm::ReduceOp::sum);
      auto w2 = c->allreduce_async(b.data(), b.size(), DType::f32, comm::ReduceOp::sum);
      std::this_thread::sleep_for(150ms);  // rank 1 is not there yet
      const auto snap = c->flight_recorder()->snapshot();
      ASSERT_EQ(snap.records.size(), 2u);
      EXPECT_EQ(snap.records[0].state, OpState::running);
      EXPECT_EQ(snap.records[0].waiting_for, 1);
      EXPECT_EQ(snap.records[1].state, OpState::queued);
      EXPECT_GT(snap.records[1].issue_ns, 0);
      w1->wait();
      w2->wait();
    } else {
      std::this_thread::sleep_for(400ms);
      c->allreduce(a.data(), a.size(), DType::f32, comm::ReduceOp::sum);
      c->allreduce(b.data(), b.size(), DType::f32, comm::ReduceOp::sum);
    }
  });
}

TEST(FlightRecorder, OffMeansNoRecorder) {
  test::run_ranks(2, [](int rank, std::shared_ptr<Store> store) {
    auto c = shm(rank, 2, store);
    c->set_flight_recorder_capacity(0);
    c->barrier();
    EXPECT_EQ(c->flight_recorder(), nullptr);
  });
}

TEST(FlightRecorder, GroupsAndHierarchicalPartsAreNamedAlikeOnEveryRank) {
  test::run_ranks(4, [](int rank, std::shared_ptr<Store> store) {
    auto c = shm(rank, 4, store);
    c->set_flight_identity("world", {0, 1, 2, 3});
    auto g = c->new_group({1, 3});
    if (rank == 1 || rank == 3) {
      ASSERT_TRUE(g);
      g->barrier();
      const auto id = g->flight_recorder()->identity();
      EXPECT_EQ(id.name, "world/g1");
      EXPECT_EQ(id.ranks, (std::vector<int>{1, 3}));
      EXPECT_EQ(id.parent, c->flight_recorder()->id());
    }
  });
  // Two "nodes" of two ranks: the parts are named after the hierarchical group, members in its ranks.
  const auto layout = comm::NodeLayout::from_labels({"a", "a", "b", "b"});
  comm::CommMaker local = [](int r, int s, std::shared_ptr<Store> st) { return shm(r, s, st); };
  comm::CommMaker inter = [](int r, int s, std::shared_ptr<Store> st) {
    comm::GlooOptions o;
    o.timeout = 10000ms;
    return comm::create_gloo_communicator(r, s, std::move(st), o);
  };
  test::run_ranks(4, [&](int rank, std::shared_ptr<Store> store) {
    auto h = comm::create_hierarchical_communicator(rank, layout, store, local, inter, 10000ms);
    h->set_flight_identity("job", {0, 1, 2, 3});
    std::vector<float> v(4096, 1.0f);
    h->allreduce(v.data(), v.size(), DType::f32, comm::ReduceOp::sum);
    bool node = false, rail = false;
    for (const auto& s : comm::flight_snapshots()) {
      if (s.identity.parent != h->flight_recorder()->id()) continue;
      if (s.identity.name == "job/node" + std::to_string(rank / 2)) {
        node = true;
        EXPECT_EQ(s.identity.ranks, (std::vector<int>{rank / 2 * 2, rank / 2 * 2 + 1}));
      }
      if (s.identity.name == "job/rail" + std::to_string(rank % 2)) {
        rail = true;
        EXPECT_EQ(s.identity.ranks, (std::vector<int>{rank % 2, rank % 2 + 2}));
        EXPECT_FALSE(s.records.empty()) << "the rail all-reduced its shard";
      }
    }
    EXPECT_TRUE(node);
    EXPECT_TRUE(rail);
  });
}

TEST(FlightRecorder, FailedOpIsDumpedAndTheDoctorNamesTheMissingRank) {
  DumpDir dir;
  const uint64_t before = comm::flight_dumps_written();
  test::run_ranks(3, [](int rank, std::shared_ptr<Store> store) {
    auto c = shm(rank, 3, store, 800ms);
    c->set_flight_identity("world", {0, 1, 2});
    std::vector<float> v(64, 1.0f);
    for (int i = 0; i < 5; ++i) c->allreduce(v.data(), v.size(), DType::f32, comm::ReduceOp::sum);
    if (rank == 1) {
      std::this_thread::sleep_for(2000ms);  // never comes to #5: the others time out
      return;
    }
    EXPECT_THROW(c->allreduce(v.data(), v.size(), DType::f32, comm::ReduceOp::sum), TimeoutError);
    const auto snap = c->flight_recorder()->snapshot();
    ASSERT_FALSE(snap.records.empty());
    const OpRecord& r = snap.records.back();
    EXPECT_EQ(r.state, OpState::failed);
    EXPECT_EQ(r.error_kind, "timeout");
    EXPECT_EQ(r.error_peer, 1);
  });
  ASSERT_TRUE(comm::flush_flight_dumps(5000ms));
  EXPECT_GT(comm::flight_dumps_written(), before);
  const std::string text = read_file(comm::flight_dump_path());
  ASSERT_FALSE(text.empty()) << comm::flight_dump_path();
  EXPECT_NE(text.find("\"reason\":\"failure\""), std::string::npos);
  EXPECT_NE(text.find("\"error_kind\":\"timeout\""), std::string::npos);
  // One process held the three ranks; the doctor reads the groups' members from the dump.
  doctor::Picture pic;
  doctor::read_text(pic, text, "dump");
  doctor::settle(pic);
  ASSERT_EQ(pic.dumps.size(), 1u);
  EXPECT_TRUE(pic.dumps[0].complete);
  const doctor::Verdict v = doctor::judge(pic);
  ASSERT_FALSE(v.ranks.empty()) << v.headline;
  EXPECT_EQ(v.ranks.front(), 1) << v.headline;
}

TEST(FlightRecorder, SignalAsksForADumpWithItsRequestNumber) {
  DumpDir dir;
  test::run_ranks(2, [](int rank, std::shared_ptr<Store> store) {
    auto c = shm(rank, 2, store);
    c->barrier();
    if (rank == 0) {
      union sigval v;
      v.sival_int = 4242;
      ASSERT_EQ(sigqueue(getpid(), SIGUSR1, v), 0);
      for (int i = 0;
           i < 200 && read_file(comm::flight_dump_path()).find("\"request\":4242") == std::string::npos; ++i)
        std::this_thread::sleep_for(20ms);
    }
    c->barrier();
  });
  const std::string text = read_file(comm::flight_dump_path());
  EXPECT_NE(text.find("\"reason\":\"signal\""), std::string::npos) << text.substr(0, 300);
  EXPECT_NE(text.find("\"request\":4242"), std::string::npos);
  EXPECT_NE(text.find("\"type\":\"end\""), std::string::npos);
}

}  // namespace
}  // namespace gz
