// The elastic rendezvous of gzrun (--nnodes MIN:MAX) against an in-memory store: nodes as threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <future>
#include <set>
#include <thread>

#include "elastic_rendezvous.h"
#include "etcd_backend.h"
#include "gz/core/error.h"
#include "gz/store/mem_store.h"
#include "gz/store/prefix_store.h"
#include "job_monitor.h"
#include "joiners.h"

using namespace gz;
using namespace gz::launcher;
using namespace std::chrono_literals;

namespace {

LaunchOptions elastic_options(const std::string& nnodes, double window_s, double timeout_s = 10) {
  return parse_options({"--nnodes", nnodes, "--rdzv-join-window", std::to_string(window_s), "--rdzv-timeout",
                        std::to_string(timeout_s), "prog"},
                       1);
}

// One node ("h<i>:<100 + i>"): its own rendezvous object over the shared store.
struct Node {
  Node(const LaunchOptions& o, Store& s, int i)
      : rdzv(o, s, "h" + std::to_string(i) + ":" + std::to_string(100 + i)) {}
  ElasticRendezvous rdzv;
};

std::future<RoundInfo> join_async(Node& n) {
  return std::async(std::launch::async, [&n] { return n.rdzv.join(nullptr); });
}

JobFailure failure(JobFailure::Kind kind, int node = -1) {
  JobFailure f;
  f.kind = kind;
  f.node = node;
  f.text = "test";
  return f;
}

}  // namespace

TEST(ElasticRendezvous, StartsAtOnceWhenMaxNodesJoined) {
  MemStore store;
  auto o = elastic_options("2:3", 60);  // a window far longer than the test: MAX must not wait for it
  Node a(o, store, 0), b(o, store, 1), c(o, store, 2);
  auto t0 = std::chrono::steady_clock::now();
  auto fa = join_async(a), fb = join_async(b), fc = join_async(c);
  std::vector<RoundInfo> r{fa.get(), fb.get(), fc.get()};
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  std::set<int> ranks;
  for (const auto& x : r) {
    EXPECT_EQ(x.round, 0);
    EXPECT_EQ(x.nnodes, 3);
    EXPECT_EQ(x.restarts, 0);
    EXPECT_EQ(x.run_id, r[0].run_id);
    ranks.insert(x.node_rank);
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
  // The run id names the job by the id (here the test's pid) of round 0's node 0.
  const auto first = std::find_if(r.begin(), r.end(), [](const RoundInfo& x) { return x.node_rank == 0; });
  EXPECT_EQ(r[0].run_id, std::to_string(100 + (first - r.begin())) + "-0");
}

TEST(ElasticRendezvous, StartsWithMinNodesAfterTheJoinWindow) {
  MemStore store;
  auto o = elastic_options("2:3", 0.4);
  Node a(o, store, 0), b(o, store, 1);
  auto t0 = std::chrono::steady_clock::now();
  auto fa = join_async(a), fb = join_async(b);
  RoundInfo ra = fa.get(), rb = fb.get();
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 400ms);  // waited for a third node
  EXPECT_EQ(ra.nnodes, 2);
  EXPECT_EQ(rb.nnodes, 2);
  EXPECT_NE(ra.node_rank, rb.node_rank);
}

TEST(ElasticRendezvous, FewerThanMinTimesOutNamingTheCount) {
  MemStore store;
  auto o = elastic_options("2:3", 0, 0.5);
  Node a(o, store, 0);
  try {
    a.rdzv.join(nullptr);
    FAIL() << "joined alone with MIN = 2";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("only 1 node(s) joined round 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("at least 2"), std::string::npos) << e.what();
  }
}

TEST(ElasticRendezvous, LateNodeIsAdmittedAtTheNextRoundKeepingRanks) {
  MemStore store;
  auto o = elastic_options("2:3", 0.2);
  Node a(o, store, 0), b(o, store, 1), late(o, store, 2);
  auto fa = join_async(a), fb = join_async(b);
  RoundInfo ra = fa.get(), rb = fb.get();
  ASSERT_EQ(ra.nnodes, 2);
  // The late node waits for round 1 (round 0 runs): the running nodes' monitors see it there.
  auto fl = join_async(late);
  for (int i = 0; i < 100 && !store.check({JobMonitor::round_key(1, "joined")}); ++i)
    std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(store.check({JobMonitor::round_key(1, "joined")}));
  EXPECT_EQ(fl.wait_for(300ms), std::future_status::timeout) << "admitted while round 0 still runs";
  // Round 0 ends to admit it: no restart is counted; the three start round 1 together.
  a.rdzv.advance(ra, failure(JobFailure::Kind::admit));
  b.rdzv.advance(rb, failure(JobFailure::Kind::admit));
  auto fa1 = join_async(a), fb1 = join_async(b);
  RoundInfo a1 = fa1.get(), b1 = fb1.get(), l1 = fl.get();
  for (const auto* x : {&a1, &b1, &l1}) {
    EXPECT_EQ(x->round, 1);
    EXPECT_EQ(x->nnodes, 3);
    EXPECT_EQ(x->restarts, 0);
  }
  // Ranks follow the order of first arrival: the nodes that stayed keep theirs, the newcomer is last.
  EXPECT_EQ(a1.node_rank, ra.node_rank);
  EXPECT_EQ(b1.node_rank, rb.node_rank);
  EXPECT_EQ(l1.node_rank, 2);
  EXPECT_NE(a1.run_id, ra.run_id);
}

TEST(ElasticRendezvous, LostNodeShrinksTheJobAndCountsARestart) {
  MemStore store;
  auto o = elastic_options("2:3", 0.1);
  Node a(o, store, 0), b(o, store, 1), c(o, store, 2);
  auto fa = join_async(a), fb = join_async(b), fc = join_async(c);
  RoundInfo ra = fa.get(), rb = fb.get(), rc = fc.get();
  ASSERT_EQ(ra.nnodes, 3);
  const JobFailure lost = failure(JobFailure::Kind::node_lost, rc.node_rank);
  EXPECT_EQ(a.rdzv.cannot_continue(ra, lost), "");
  a.rdzv.advance(ra, lost);
  b.rdzv.advance(rb, lost);
  auto fa1 = join_async(a), fb1 = join_async(b);
  RoundInfo a1 = fa1.get(), b1 = fb1.get();
  EXPECT_EQ(a1.nnodes, 2);
  EXPECT_EQ(a1.restarts, 1);
  EXPECT_EQ(b1.restarts, 1);
  EXPECT_EQ(std::set<int>({a1.node_rank, b1.node_rank}), (std::set<int>{0, 1}));
  // Another loss leaves one node: fewer than MIN, and nobody waits to take its place.
  const std::string why = a.rdzv.cannot_continue(a1, failure(JobFailure::Kind::node_lost, b1.node_rank));
  EXPECT_NE(why.find("1 node(s) left"), std::string::npos) << why;
  EXPECT_NE(why.find("fewer than the minimum of 2"), std::string::npos) << why;
  // A worker failure keeps every node: the job can go on.
  EXPECT_EQ(a.rdzv.cannot_continue(a1, failure(JobFailure::Kind::worker, 0)), "");
}

TEST(ElasticRendezvous, SurvivorsAlreadyInTheNextRoundAreNotCountedTwice) {
  MemStore store;
  auto o = elastic_options("3:4", 0.1);
  Node a(o, store, 0), b(o, store, 1), c(o, store, 2);
  auto fa = join_async(a), fb = join_async(b), fc = join_async(c);
  RoundInfo ra = fa.get(), rb = fb.get(), rc = fc.get();
  ASSERT_EQ(ra.nnodes, 3);
  // c is lost; a decided first and already joined round 1 (where it waits: 1 of MIN 3). When b
  // decides, a's entry in round 1 is a survivor, not a newcomer: 2 nodes are left, fewer than 3.
  const JobFailure lost = failure(JobFailure::Kind::node_lost, rc.node_rank);
  a.rdzv.advance(ra, lost);
  auto fa1 = join_async(a);
  for (int i = 0; i < 100 && !store.check({JobMonitor::round_key(1, "joined")}); ++i)
    std::this_thread::sleep_for(10ms);
  const std::string why = b.rdzv.cannot_continue(rb, lost);
  EXPECT_NE(why.find("2 node(s) left, fewer than the minimum of 3"), std::string::npos) << why;
  b.rdzv.end_job(why, false);
  EXPECT_THROW(fa1.get(), Error);  // a, waiting in round 1, learns that the job ended
}

TEST(ElasticRendezvous, AWaitingNodeCountsTowardsMin) {
  MemStore store;
  auto o = elastic_options("2:3", 0.1);
  Node a(o, store, 0), b(o, store, 1), spare(o, store, 2);
  auto fa = join_async(a), fb = join_async(b);
  RoundInfo ra = fa.get(), rb = fb.get();
  ASSERT_EQ(ra.nnodes, 2);
  auto fs = join_async(spare);  // waits for round 1
  for (int i = 0; i < 100 && !store.check({JobMonitor::round_key(1, "joined")}); ++i)
    std::this_thread::sleep_for(10ms);
  // b is lost: a and the waiting spare make MIN again. a's own entry in round 1 (it may have
  // joined already) does not count twice.
  const JobFailure lost = failure(JobFailure::Kind::node_lost, rb.node_rank);
  EXPECT_EQ(a.rdzv.cannot_continue(ra, lost), "");
  a.rdzv.advance(ra, lost);
  auto fa1 = join_async(a);
  RoundInfo a1 = fa1.get(), s1 = fs.get();
  EXPECT_EQ(a1.nnodes, 2);
  EXPECT_EQ(s1.nnodes, 2);
  EXPECT_EQ(a1.node_rank, 0);
  EXPECT_EQ(s1.node_rank, 1);
}

TEST(ElasticRendezvous, WaitingNodesLeaveWhenTheJobEnds) {
  MemStore store;
  auto o = elastic_options("2:2", 0);  // N:N is fixed-size; force the elastic path for the test
  o.elastic = true;
  Node a(o, store, 0), b(o, store, 1), extra(o, store, 2);
  auto fa = join_async(a), fb = join_async(b);
  fa.get();
  fb.get();
  auto fe = join_async(extra);  // the job is full: it waits
  EXPECT_EQ(fe.wait_for(200ms), std::future_status::timeout);
  a.rdzv.end_job("every worker exited 0", true);
  EXPECT_TRUE(fe.get().job_done);
  // A failed job: a node that comes later learns why instead of waiting.
  MemStore store2;
  Node x(o, store2, 0), y(o, store2, 1);
  x.rdzv.end_job("giving up after 1 job-wide restart(s); last failure: boom", false);
  try {
    y.rdzv.join(nullptr);
    FAIL() << "joined an ended job";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the job has ended: giving up after 1"), std::string::npos)
        << e.what();
  }
}

TEST(ElasticRendezvous, EntriesParseWithoutRepeats) {
  EXPECT_EQ(parse_entries("1:h0:10;2:h1:11;1:h0:10;;bad;"), (std::vector<std::string>{"1:h0:10", "2:h1:11"}));
  EXPECT_TRUE(parse_entries("").empty());
}

namespace {

// A node that waited for round `round` and was killed (or gave up): its entry stays in the joined
// list and its beat, read once, never moves again.
void add_ghost(Store& store, int round) {
  const int64_t seq = store.add("gzrun/seq", 1);
  store.append(JobMonitor::round_key(round, "joined"), to_bytes(std::to_string(seq) + ":ghost:999;"));
  store.add(joiner_beat_key(seq), 1);
}

// Elastic options with a 1 s heartbeat timeout: joiner_lease() is then its minimum, 1 s.
LaunchOptions short_lease(const std::string& nnodes, double window_s) {
  return parse_options({"--nnodes", nnodes, "--rdzv-join-window", std::to_string(window_s), "--rdzv-timeout",
                        "10", "--heartbeat-timeout", "1", "prog"},
                       1);
}

}  // namespace

TEST(ElasticRendezvous, AGhostJoinerIsNeitherCountedNorMadeAMember) {
  MemStore store;
  auto o = short_lease("2:3", 0.3);
  ASSERT_EQ(joiner_lease(o), std::chrono::seconds(1));
  Node a(o, store, 0), b(o, store, 1);
  auto fa = join_async(a), fb = join_async(b);
  RoundInfo ra = fa.get(), rb = fb.get();
  ASSERT_EQ(ra.nnodes, 2);
  add_ghost(store, 1);
  // A lost node would leave 1: the ghost waiting in round 1 does not make up for it.
  Stopwatch sw;
  const std::string why = a.rdzv.cannot_continue(ra, failure(JobFailure::Kind::node_lost, rb.node_rank));
  EXPECT_NE(why.find("1 node(s) left, fewer than the minimum of 2"), std::string::npos) << why;
  EXPECT_LT(sw.elapsed().count(), 3000) << "deciding took longer than the lease";
  // The round ends for another reason; a and b form round 1. With the ghost, round 1 has MAX (3)
  // entries; it must still start with the two live nodes, the ghost getting no node rank.
  a.rdzv.advance(ra, failure(JobFailure::Kind::worker, 0));
  b.rdzv.advance(rb, failure(JobFailure::Kind::worker, 0));
  auto fa1 = join_async(a), fb1 = join_async(b);
  RoundInfo a1 = fa1.get(), b1 = fb1.get();
  EXPECT_EQ(a1.nnodes, 2);
  EXPECT_EQ(b1.nnodes, 2);
  EXPECT_EQ(std::set<int>({a1.node_rank, b1.node_rank}), (std::set<int>{0, 1}));
  const std::string members = to_string(store.get(JobMonitor::round_key(1, "members"), Deadline::after(1s)));
  EXPECT_EQ(members.find("ghost"), std::string::npos) << members;
}

// A live joiner that an observer has read only once looks like a dead one (its beat has not been
// seen to move yet). The observer must decide it (within a lease) before it closes the round
// without it. Before, with the join window already over, a closed round 0 with itself alone and
// left the live joiner to wait for round 1.
TEST(ElasticRendezvous, AJoinerSeenOnceIsDecidedBeforeTheRoundCloses) {
  MemStore store;
  auto o = short_lease("1:3", 0);
  // Another node waits for round 0 already, beating as a waiting gzrun does (a seq above the
  // ones handed out, so that `a` is the joiner that closes the round).
  const int64_t seq = 100;
  const std::string entry = std::to_string(seq) + ":live:77";
  store.append(JobMonitor::round_key(0, "joined"), to_bytes(entry + ";"));
  std::atomic<bool> stop{false};
  std::thread beat([&] {
    while (!stop) {
      store.add(joiner_beat_key(seq), 1);
      std::this_thread::sleep_for(20ms);
    }
  });
  Node a(o, store, 0);
  Stopwatch sw;
  RoundInfo ra;
  try {
    ra = a.rdzv.join(nullptr);
  } catch (const Error& e) {
    ADD_FAILURE() << e.what();
  }
  stop = true;
  beat.join();
  const std::string members = to_string(store.get(JobMonitor::round_key(0, "members"), Deadline::after(1s)));
  EXPECT_NE(members.find(entry), std::string::npos) << "the live joiner was left out: " << members;
  EXPECT_EQ(ra.nnodes, 2) << members;
  EXPECT_LT(sw.elapsed().count(), 1500) << "deciding took longer than the lease";
}

namespace {
/// A MemStore that counts the reads of joiners' beats (add(gzrun/waiting/..., 0)).
class CountingStore : public MemStore {
 public:
  int64_t add(const std::string& key, int64_t delta) override {
    if (delta == 0 && key.rfind("gzrun/waiting/", 0) == 0) ++beat_reads;
    return MemStore::add(key, delta);
  }
  std::atomic<int64_t> beat_reads{0};
};
}  // namespace

// Eight nodes wait out a 1 s join window together. Only the lowest live joiner reads every beat;
// the others read the beats below theirs until one is alive. Before, every joiner read every
// beat on every 50 ms poll: 8 x 8 x ~20 = ~1300 reads.
TEST(ElasticRendezvous, JoinersDoNotAllReadEveryBeat) {
  CountingStore store;
  auto o = elastic_options("2:9", 1.0);
  std::vector<std::unique_ptr<Node>> nodes;
  for (int i = 0; i < 8; ++i) nodes.push_back(std::make_unique<Node>(o, store, i));
  std::vector<std::future<RoundInfo>> f;
  for (auto& n : nodes) f.push_back(join_async(*n));
  for (auto& x : f) EXPECT_EQ(x.get().nnodes, 8);
  const int64_t reads = store.beat_reads.load();
  EXPECT_LT(reads, 600) << "beat reads while 8 joiners waited out a 1 s window";
  std::printf("beat reads for 8 joiners over a 1 s join window: %lld\n", static_cast<long long>(reads));
}

// With etcd a beat can stall while the client waits out a member that stopped answering (one
// attempt timeout) and then gets the next member's answer. A live joiner must stay alive to its
// observers through that. Before, the lease (3 intervals, 3 s at the default 10 s heartbeat
// timeout) was shorter than such a beat (2 s + 2 s + the poll), and the joiner was dropped.
TEST(ElasticRendezvous, AJoinersLeaseOutlastsAnEtcdFailover) {
  const LaunchOptions o =
      parse_options({"--nnodes", "1:3", "--rdzv-backend", "etcd", "--rdzv-endpoints", "127.0.0.1:2379",
                     "--rdzv-id", "lease", "--heartbeat-timeout", "2", "prog"},
                    1);
  const Duration attempt = etcd_store_options(o, "", false).attempt_timeout;  // 500 ms at 2 s
  MemStore store;
  JoinerBeats beats(joiner_lease(o));
  const std::vector<std::string> entry{"7:h:70"};
  std::atomic<bool> stop{false};
  std::thread joiner([&] {
    for (int i = 0; !stop; ++i) {
      // The tenth beat fails over: one attempt timeout on a dead member, one on the next.
      std::this_thread::sleep_for(i == 10 ? 2 * attempt + 150ms : 50ms);
      store.add(joiner_beat_key(7), 1);
    }
  });
  Stopwatch sw;
  bool seen = false, dropped = false;
  while (sw.elapsed() < 2 * attempt + 1500ms) {
    beats.observe(store, entry);
    const bool alive = !beats.alive(entry).empty();
    seen |= alive;
    dropped |= seen && !alive;
    std::this_thread::sleep_for(50ms);
  }
  stop = true;
  joiner.join();
  EXPECT_TRUE(seen);
  EXPECT_FALSE(dropped) << "a live joiner was taken for dead during an etcd failover (lease "
                        << joiner_lease(o).count() << " ms, failover " << (2 * attempt).count() << " ms)";
}

TEST(ElasticRendezvous, TheMonitorAdmitsOnlyLiveJoiners) {
  auto mem = std::make_shared<MemStore>();
  PrefixStore store("job", mem);
  auto o = short_lease("2:3", 0.1);
  Node a(o, store, 0), b(o, store, 1);
  auto fa = join_async(a), fb = join_async(b);
  RoundInfo ra = fa.get(), rb = fb.get();
  ASSERT_EQ(ra.nnodes, 2);
  // Node b's gzrun heartbeats (for a's monitor) while the test runs.
  std::atomic<bool> stop{false};
  std::thread hb([&] {
    while (!stop) {
      store.add(JobMonitor::round_key(0, "hb/" + std::to_string(rb.node_rank)), 1);
      std::this_thread::sleep_for(50ms);
    }
  });
  JobMonitor mon(
      o, [mem] { return std::make_unique<PrefixStore>("job", mem); }, "test store", false);
  mon.start_round(0, ra.node_rank, 2);
  // A ghost waits for round 1: the running round is not ended for it.
  add_ghost(store, 1);
  std::this_thread::sleep_for(1500ms);
  EXPECT_EQ(mon.failure().kind, JobFailure::Kind::none) << mon.failure().text;
  // A live node waits there too: now the round ends to admit it, and only it is named.
  Node spare(o, store, 2);
  auto fs = join_async(spare);
  Deadline d = Deadline::after(5s);
  while (mon.failure().kind == JobFailure::Kind::none && !d.expired()) std::this_thread::sleep_for(20ms);
  EXPECT_EQ(mon.failure().kind, JobFailure::Kind::admit) << mon.failure().text;
  EXPECT_NE(mon.failure().text.find("h2:102"), std::string::npos) << mon.failure().text;
  EXPECT_EQ(mon.failure().text.find("ghost"), std::string::npos) << mon.failure().text;
  mon.end_round();
  stop = true;
  hb.join();
  a.rdzv.end_job("test over", true);
  EXPECT_TRUE(fs.get().job_done);
}
