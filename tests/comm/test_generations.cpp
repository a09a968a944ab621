// Generations of a group (in-place recovery): survivors of a lost rank and its replacement meet
// in the next generation without any other coordination, over shm and over gloo.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "gz/comm/flight_dump.h"
#include "gz/comm/generations.h"
#include "gz/comm/move_watcher.h"
#include "gz/core/error.h"
#include "gz/store/mem_store.h"
#include "gz/store/prefix_store.h"
#include "gz/store/rendezvous.h"
#include "gz/store/round_move.h"
#include "gz/store/tcp_store.h"
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

// A node of two ranks (2 and 3) is lost; the launcher moves the job to a new round in which
// the survivors swap ranks (old rank 0 is rank 1, old 1 is rank 0) and a returning node's fresh
// process is rank 2. The survivors, waiting in generation 1 for ranks that never come, follow
// the move; the fresh process meets them in the new run's rendezvous and generation 0.
// Mutation check: a mover never consulted (await_members without it) times out here.
TEST_P(GenerationsTest, SurvivorsOfALostNodeFollowTheLaunchersMove) {
  constexpr int n = 4;
  auto base = std::make_shared<MemStore>();
  auto run_store = [&](const std::string& run) {
    return std::make_shared<PrefixStore>(run_prefix(run), base);
  };
  auto group_options = [&](int rank, int size, const std::string& run) {
    comm::CommOptions o = options(rank, size, base, GetParam());
    o.store = std::make_shared<PrefixStore>("grp", run_store(run));
    return o;
  };
  auto world = [](int rank, int size) {
    WorldInfo w;
    w.rank = rank;
    w.world_size = size;
    return w;
  };
  std::atomic<int> done{0};
  run_ranks(n + 1, [&](int rank, std::shared_ptr<Store>) {
    if (rank == n) {  // the launcher: moves the survivors once they wait, then the fresh process
      std::this_thread::sleep_for(300ms);
      for (int old : {0, 1}) {
        RoundMove m{1, "job-1", 1 - old, 3, 0, 2, "node 1 lost"};
        run_store("job-0")->set(round_move_key(old), to_bytes(encode_round_move(m)));
      }
      WorldInfo w = world(2, 3);
      meet(*run_store("job-1"), w, Deadline::after(20s), "test");
      comm::Generations fresh(group_options(2, 3, "job-1"));
      comm::CommPtr c = fresh.join();
      EXPECT_EQ(sum_of_ranks(*c), 6.f);
      ++done;
      return;
    }
    comm::Generations gens(group_options(rank, n, "job-0"));
    auto follower = std::make_shared<RoundFollower>(base, "job-0", world(rank, n));
    gens.set_mover(comm::follow_moves(follower, "grp", 20s));
    comm::CommPtr c = gens.join();
    EXPECT_EQ(sum_of_ranks(*c), 10.f);
    if (rank >= 2) {  // the lost node
      c->abort("node 1 was lost");
      return;
    }
    float v = 1.f;
    EXPECT_THROW(c->allreduce(&v, 1, DType::f32, comm::ReduceOp::sum), Error);
    c = gens.rejoin(c, "lost node 1");
    EXPECT_EQ(c->rank(), 1 - rank) << "the survivor did not take its new rank";
    EXPECT_EQ(c->size(), 3);
    EXPECT_EQ(gens.generation(), 0);
    EXPECT_EQ(follower->run_id(), "job-1");
    EXPECT_EQ(sum_of_ranks(*c), 6.f);
    ++done;
  });
  EXPECT_EQ(done.load(), 3);
}

// An admission: nothing failed, the launcher wrote rank 0's move first (its gzrun was quicker)
// and rank 0 left the old group; rank 1, failing on the abort, rejoins before its own move is
// written. Rank 0 must not claim a slot of the old group on its way out, or rank 1 would find
// that generation complete and wait in it for a rank 0 that never comes (a timeout). Mutation
// check: claiming the slot before consulting the mover times this test out.
TEST_P(GenerationsTest, ARankThatMovedNeverCompletesTheOldGeneration) {
  auto base = std::make_shared<MemStore>();
  auto run_store = [&](const std::string& run) {
    return std::make_shared<PrefixStore>(run_prefix(run), base);
  };
  auto move = [&](int rank) {
    RoundMove m{1, "job-1", rank, 3, 0, 2, "node admitted"};
    run_store("job-0")->set(round_move_key(rank), to_bytes(encode_round_move(m)));
  };
  std::atomic<int> done{0};
  run_ranks(3, [&](int rank, std::shared_ptr<Store>) {
    if (rank == 2) {  // the admitted node's fresh process, and the launchers
      move(0);
      std::this_thread::sleep_for(500ms);
      move(1);
      WorldInfo w;
      w.rank = 2;
      w.world_size = 3;
      meet(*run_store("job-1"), w, Deadline::after(20s), "test");
      comm::CommOptions o = options(2, 3, base, GetParam());
      o.store = std::make_shared<PrefixStore>("grp", run_store("job-1"));
      comm::Generations fresh(o);
      EXPECT_EQ(sum_of_ranks(*fresh.join()), 6.f);
      ++done;
      return;
    }
    comm::CommOptions o = options(rank, 2, base, GetParam());
    o.store = std::make_shared<PrefixStore>("grp", run_store("job-0"));
    o.timeout = 10s;
    comm::Generations gens(o);
    WorldInfo w;
    w.rank = rank;
    w.world_size = 2;
    comm::CommPtr c = gens.join();  // before any move: generation 0 of the old run
    auto follower = std::make_shared<RoundFollower>(base, "job-0", w);
    gens.set_mover(comm::follow_moves(follower, "grp", 20s));
    // Rank 0 rejoins at once (its move is there); rank 1 after rank 0 left.
    if (rank == 1) std::this_thread::sleep_for(200ms);
    c = gens.rejoin(c, "the launcher moved the job");
    EXPECT_EQ(c->size(), 3);
    EXPECT_EQ(sum_of_ranks(*c), 6.f);
    ++done;
  });
  EXPECT_EQ(done.load(), 3);
}

// A move during a move: a node is lost (ranks 2, 3 of run job-0) and the launcher moves the
// survivors to job-1 with an admitted node's rank 2, which never arrives (that node died before
// its workers met); it moves them again, to job-2 with 2 ranks. The survivors, waiting in
// job-1's rendezvous, must follow the second move at once, not after the 20 s timeout. Mutation
// check: meet() without the move check (follow waiting for job-1 to complete) times this out.
TEST_P(GenerationsTest, AMoveWhileFollowingAMoveIsFollowedAtOnce) {
  auto base = std::make_shared<MemStore>();
  auto run_store = [&](const std::string& run) {
    return std::make_shared<PrefixStore>(run_prefix(run), base);
  };
  auto write_move = [&](const std::string& from, int old, const RoundMove& m) {
    run_store(from)->set(round_move_key(old), to_bytes(encode_round_move(m)));
  };
  std::atomic<int> done{0};
  run_ranks(5, [&](int rank, std::shared_ptr<Store>) {
    if (rank == 4) {  // the launcher
      std::this_thread::sleep_for(300ms);
      for (int old : {0, 1}) write_move("job-0", old, {1, "job-1", old, 3, 0, 2, "node 1 lost"});
      std::this_thread::sleep_for(500ms);  // the admitted node dies: the job moves on without it
      for (int old : {0, 1}) write_move("job-1", old, {2, "job-2", old, 2, 0, 1, "node 1 lost"});
      return;
    }
    comm::CommOptions o = options(rank, 4, base, GetParam());
    o.store = std::make_shared<PrefixStore>("grp", run_store("job-0"));
    comm::Generations gens(o);
    WorldInfo w;
    w.rank = rank;
    w.world_size = 4;
    gens.set_mover(comm::follow_moves(std::make_shared<RoundFollower>(base, "job-0", w), "grp", 20s));
    comm::CommPtr c = gens.join();
    if (rank >= 2) {
      c->abort("node 1 was lost");
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    c = gens.rejoin(c, "lost node 1");
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s) << "waited for the admitted rank that never came";
    EXPECT_EQ(c->size(), 2);
    EXPECT_EQ(sum_of_ranks(*c), 3.f);
    ++done;
  });
  EXPECT_EQ(done.load(), 2);
}

// A group's store with hooks: a call after each add, a delay before compare-and-sets.
class HookedStore : public Store {
 public:
  explicit HookedStore(std::shared_ptr<Store> base) : base_(std::move(base)) {}
  void set(const std::string& k, const Bytes& v) override { base_->set(k, v); }
  Bytes get(const std::string& k, Deadline d) override { return base_->get(k, d); }
  int64_t add(const std::string& k, int64_t d) override {
    const int64_t v = base_->add(k, d);
    if (after_add) after_add(k);
    return v;
  }
  Bytes compare_set(const std::string& k, const Bytes& e, const Bytes& d) override {
    ++cas_calls;
    std::this_thread::sleep_for(cas_delay);
    return base_->compare_set(k, e, d);
  }
  int64_t append(const std::string& k, const Bytes& v) override { return base_->append(k, v); }
  void wait(const std::vector<std::string>& ks, Deadline d) override { base_->wait(ks, d); }
  bool check(const std::vector<std::string>& ks) override { return base_->check(ks); }
  bool delete_key(const std::string& k) override { return base_->delete_key(k); }
  int64_t num_keys() override { return base_->num_keys(); }
  std::function<void(const std::string&)> after_add;
  Duration cas_delay{0};
  std::atomic<int> cas_calls{0};

 private:
  std::shared_ptr<Store> base_;
};

// The launcher's notice to rank 0 lands just after rank 0 claimed its slot in generation 1 and
// completed it; rank 1 already waits there and its own notice comes 1 s later. Rank 0 must mark
// the generation abandoned as it leaves, so that rank 1 waits for its move instead of building
// generation 1's communicator with a rank that never comes (until the 5 s timeout). Mutation
// check: await_members leaving on a move without settling the generation's fate, and taking a
// complete generation as formed (as before), fails rank 1's rejoin at that timeout; asking the
// fate again on every poll once it is known abandoned fails the count of rank 1's settles.
TEST(Generations, ARankThatLeavesACompleteGenerationAbandonsIt) {
  auto base = std::make_shared<MemStore>();
  auto run_store = [&](const std::string& run) {
    return std::make_shared<PrefixStore>(run_prefix(run), base);
  };
  auto notice = [&](int rank) {
    run_store("job-0")->set(round_move_key(rank),
                            to_bytes(encode_round_move({1, "job-1", rank, 2, 0, 1, "moved"})));
  };
  run_ranks(3, [&](int rank, std::shared_ptr<Store>) {
    if (rank == 2) {  // the launcher of rank 1's node, slower than rank 0's
      std::this_thread::sleep_for(1s);
      notice(1);
      return;
    }
    auto hooked = std::make_shared<HookedStore>(std::make_shared<PrefixStore>("grp", run_store("job-0")));
    if (rank == 0)
      hooked->after_add = [&](const std::string& k) {
        if (k == "joined/1") notice(0);
      };
    if (rank == 1) hooked->cas_delay = 200ms;  // rank 0 settles first: no race in the test
    comm::CommOptions o = options(rank, 2, base, "shm");
    o.store = hooked;
    o.timeout = 5s;
    comm::Generations gens(o);
    WorldInfo w;
    w.rank = rank;
    w.world_size = 2;
    gens.set_mover(comm::follow_moves(std::make_shared<RoundFollower>(base, "job-0", w), "grp", 5s));
    comm::CommPtr c = gens.join();
    if (rank == 0) std::this_thread::sleep_for(200ms);  // rank 1 waits in generation 1 first
    const auto t0 = std::chrono::steady_clock::now();
    const int cas_before = hooked->cas_calls;
    c = gens.rejoin(c, "a peer was lost");
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 4s);
    // Rank 1 settles generation 1 once (finding it abandoned), then only awaits its move.
    if (rank == 1) EXPECT_LE(hooked->cas_calls - cas_before, 1) << "asked the known fate again";
    EXPECT_EQ(gens.generation(), 0) << "not in the new run's group";
    EXPECT_EQ(sum_of_ranks(*c), 3.f);
  });
}

TEST(RoundMove, EncodesAndRefusesWhatIsNotAMove) {
  RoundMove m{3, "4301.9f03c2a1-3", 5, 6, 2, 3, "node 1 (h1) lost: no heartbeat for 3.0 s"};
  RoundMove back = decode_round_move(encode_round_move(m));
  EXPECT_EQ(back.round, 3);
  EXPECT_EQ(back.run_id, m.run_id);
  EXPECT_EQ(back.rank, 5);
  EXPECT_EQ(back.world_size, 6);
  EXPECT_EQ(back.node_rank, 2);
  EXPECT_EQ(back.num_nodes, 3);
  EXPECT_EQ(back.why, m.why);
  for (const char* bad : {"", "v2 1 r 0 1 0 1 x", "v1 1 r 1 1 0 1 x", "v1 1 r 0 1 1 1", "v1 x r 0 1 0 1"})
    EXPECT_THROW(decode_round_move(bad), Error) << bad;
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

// gzrun's claim on a worker's accepts key against the worker's withdrawal, over a real TcpStore:
// claims are all or none; a claimed worker's withdrawal waits, goes through once gzrun releases
// it and fails (gz::MovedError) naming the move once gzrun commits and writes it. Mutation check: a
// withdrawal that ignores the claim (a plain delete or set, as before) returns at once: "withdrew while
// claimed".
TEST(RoundMove, AWorkerClaimedForAMoveDoesNotWithdrawSilently) {
  TcpStoreServer server(TcpStoreServerOptions{});
  auto client = [&] { return std::make_shared<TcpStore>("127.0.0.1", server.port()); };
  PrefixStore run(run_prefix("job-0"), client());  // gzrun's
  auto world = [](int rank) {
    WorldInfo w;
    w.rank = rank;
    w.world_size = 2;
    return w;
  };
  RoundFollower f0(client(), "job-0", world(0)), f1(client(), "job-0", world(1));
  const Deadline soon = Deadline::after(10s);
  f0.accept(true, soon);
  f1.accept(false, soon);  // never accepted: nothing to withdraw
  EXPECT_FALSE(claim_round_moves(run, {0, 1}));
  EXPECT_TRUE(round_accepts(run, 0)) << "a failed claim kept rank 0 claimed";
  f1.accept(true, soon);
  ASSERT_TRUE(claim_round_moves(run, {0, 1}));
  EXPECT_FALSE(round_accepts(run, 0));
  auto withdraw = [&](RoundFollower& f, std::atomic<bool>& done, std::string& error) {
    return std::thread([&] {
      try {
        f.accept(false, Deadline::after(10s));
      } catch (const Error& e) {
        error = e.what();
      }
      done = true;
    });
  };
  std::atomic<bool> done0{false}, done1{false};
  std::string error0, error1;
  std::thread t1 = withdraw(f1, done1, error1), t0 = withdraw(f0, done0, error0);
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(done0.load()) << "rank 0 withdrew while claimed";
  EXPECT_FALSE(done1.load()) << "rank 1 withdrew while claimed";
  release_round_moves(run, {1});
  t1.join();
  EXPECT_EQ(error1, "");
  EXPECT_FALSE(claim_round_moves(run, {1})) << "rank 1 withdrew: no claim";
  ASSERT_TRUE(commit_round_moves(run, {0}));
  run.set(round_move_key(0), to_bytes(encode_round_move({1, "job-1", 2, 4, 1, 2, "node 2 admitted"})));
  t0.join();
  EXPECT_NE(error0.find("moved this worker to round 1 as rank 2 of 4"), std::string::npos) << error0;
  EXPECT_THROW(f0.accept(false, Deadline::after(10s)), MovedError) << "a committed worker withdrew";
}

// gzrun holds its claim longer than the worker's deadline (its next-round rendezvous): at the
// deadline the worker takes the key back and returns withdrawn, and gzrun's commit then fails
// (it stops the node's workers instead of writing notices). Had gzrun committed first, the
// worker's withdrawal fails with gz::MovedError at once, whatever its deadline. Mutation checks:
// the deadline throwing gz::TimeoutError (as before) fails "withdrew at its deadline"; a commit
// that sets "moving" without compare-and-set succeeds over the withdrawal.
TEST(RoundMove, AtItsDeadlineAClaimedWorkerWithdrawsUnlessGzrunCommittedFirst) {
  TcpStoreServer server(TcpStoreServerOptions{});
  auto client = [&] { return std::make_shared<TcpStore>("127.0.0.1", server.port()); };
  PrefixStore run(run_prefix("job-0"), client());  // gzrun's
  WorldInfo w0, w1;
  w1.rank = 1;
  w0.world_size = w1.world_size = 2;
  RoundFollower f0(client(), "job-0", w0), f1(client(), "job-0", w1);
  f0.accept(true, Deadline::after(10s));
  f1.accept(true, Deadline::after(10s));
  ASSERT_TRUE(claim_round_moves(run, {0, 1}));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_NO_THROW(f0.accept(false, Deadline::after(300ms))) << "withdrew at its deadline";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  EXPECT_FALSE(commit_round_moves(run, {0, 1})) << "committed a worker that withdrew";
  EXPECT_FALSE(claim_round_moves(run, {0})) << "rank 0 withdrew: no claim";
  const auto t1 = std::chrono::steady_clock::now();
  try {
    f1.accept(false, Deadline::after(100ms));  // committed above with rank 0: no notice comes
    ADD_FAILURE() << "rank 1 withdrew although gzrun committed it to a move";
  } catch (const MovedError& e) {
    EXPECT_NE(std::string(e.what()).find("moved this worker to its next round"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t1, 5s);
}

// After a move the flight recorder's dumps and ready file go where gzrun looks for the new
// round's (its dump folder per run, rank-<new rank>), with the new identity in the header.
// Mutation check: not setting the identity when the move is followed leaves job-0/rank-0.
TEST(Generations, AMovedWorkersDumpsCarryItsNewIdentity) {
  char tmpl[] = "/tmp/gz-gen-dumps-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string root = tmpl;
  setenv("GZ_DUMP_DIR", (root + "/job-0").c_str(), 1);
  setenv("GZ_RUN_ID", "job-0", 1);
  setenv("RANK", "0", 1);
  auto base = std::make_shared<MemStore>();
  auto group_store = [&](const std::string& run) {
    return std::make_shared<PrefixStore>("grp", std::make_shared<PrefixStore>(run_prefix(run), base));
  };
  run_ranks(2, [&](int rank, std::shared_ptr<Store>) {
    WorldInfo w;
    if (rank == 1) {  // the admitted node's fresh process (rank 0 of job-1) and the launcher
      std::this_thread::sleep_for(200ms);
      RoundMove m{1, "job-1", 1, 2, 1, 2, "node admitted"};
      std::make_shared<PrefixStore>(run_prefix("job-0"), base)
          ->set(round_move_key(0), to_bytes(encode_round_move(m)));
      w.world_size = 2;
      meet(*std::make_shared<PrefixStore>(run_prefix("job-1"), base), w, Deadline::after(20s), "test");
      comm::CommOptions o = options(0, 2, base, "shm");
      o.store = group_store("job-1");
      comm::Generations fresh(o);
      EXPECT_EQ(sum_of_ranks(*fresh.join()), 3.f);
      return;
    }
    comm::CommOptions o = options(0, 1, base, "shm");
    o.store = group_store("job-0");
    comm::Generations gens(o);
    gens.set_mover(comm::follow_moves(std::make_shared<RoundFollower>(base, "job-0", w), "grp", 20s));
    comm::CommPtr c = gens.join();
    EXPECT_EQ(sum_of_ranks(*c), 1.f);  // starts the dump service: its ready file is job-0's
    std::this_thread::sleep_for(400ms);
    c = gens.rejoin(c, "the launcher moved the job");
    EXPECT_EQ(sum_of_ranks(*c), 3.f);
  });
  EXPECT_EQ(comm::flight_dump_path(), root + "/job-1/rank-1.jsonl");
  EXPECT_TRUE(std::filesystem::exists(root + "/job-1/rank-1.ready")) << "gzrun would not signal it";
  const std::string path = comm::write_flight_dump(comm::DumpReason::request);
  unsetenv("GZ_DUMP_DIR");
  unsetenv("GZ_RUN_ID");
  unsetenv("RANK");
  std::ifstream in(path);
  std::string header;
  std::getline(in, header);
  EXPECT_NE(header.find("\"job\":\"job-1\""), std::string::npos) << header;
  EXPECT_NE(header.find("\"rank\":1,\"world\":2"), std::string::npos) << header;
  std::filesystem::remove_all(root);
}

// A store request that does not return (its host unreachable) holds the move watcher's thread;
// stopping it, and a process exit that never stopped it, must not wait for that.
class HangingStore : public MemStore {
 public:
  bool check(const std::vector<std::string>& keys) override {
    entered = true;
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, hang, [this] { return released; });
    return MemStore::check(keys);
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    released = true;
    cv_.notify_all();
  }
  std::atomic<bool> entered{false};
  bool released = false;
  Duration hang{60000};

 private:
  std::mutex mu_;
  std::condition_variable cv_;
};

std::unique_ptr<comm::MoveWatcher> hung_watcher(std::shared_ptr<HangingStore> store, comm::CommPtr group) {
  auto follower = std::make_shared<RoundFollower>(store, "job-0", WorldInfo{});
  auto w = std::make_unique<comm::MoveWatcher>(
      follower, [group] { return group; }, 10ms);
  while (!store->entered) std::this_thread::sleep_for(5ms);
  return w;
}

// Run by the test below in a fresh process (this binary again): holds a watcher in a static, as
// gz::init does, and exits without stopping it. A fork() would do under TSan only while this
// process has no other thread.
TEST(MoveWatcher, ExitHelper) {
  if (!getenv("GZ_TEST_MOVE_WATCHER_EXIT")) GTEST_SKIP() << "run by StopsWithinItsBound...";
  static std::unique_ptr<comm::MoveWatcher> held;
  held = hung_watcher(std::make_shared<HangingStore>(),
                      comm::create_communicator(options(0, 1, std::make_shared<MemStore>(), "shm")));
  std::exit(0);
}

// Mutation checks: a stop that joins the thread unconditionally (as the watcher's destructor
// did) waits for the store: the bound is missed, and the exiting helper is killed at 10 s; a
// stop that does not remember an earlier one (no `released` flag) waits its bound again.
TEST(MoveWatcher, StopsWithinItsBoundAndAtExitWhileTheStoreHangs) {
  const char* argv[] = {"test_generations", "--gtest_filter=MoveWatcher.ExitHelper", nullptr};
  std::vector<char*> env;
  for (char** e = environ; *e; ++e) env.push_back(*e);
  std::string flag = "GZ_TEST_MOVE_WATCHER_EXIT=1";
  env.push_back(flag.data());
  env.push_back(nullptr);
  pid_t child = -1;
  ASSERT_EQ(posix_spawn(&child, "/proc/self/exe", nullptr, nullptr, const_cast<char**>(argv), env.data()), 0);
  int status = 0;
  pid_t done = 0;
  for (int i = 0; i < 200 && done == 0; ++i) {
    done = waitpid(child, &status, WNOHANG);
    if (done == 0) std::this_thread::sleep_for(50ms);
  }
  if (done == 0) {
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
  }
  EXPECT_EQ(done, child) << "the process hung at exit on its move watcher";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  auto store = std::make_shared<HangingStore>();
  comm::CommPtr group = comm::create_communicator(options(0, 1, std::make_shared<MemStore>(), "shm"));
  auto w = hung_watcher(store, group);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(w->stop(100ms));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  // A second stop (the destructor after gz's stop at exit) does not wait its bound again.
  const auto t1 = std::chrono::steady_clock::now();
  EXPECT_FALSE(w->stop(5s));
  w.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - t1, 500ms) << "a stopped watcher waited again";
  EXPECT_FALSE(group->aborted());
  store->release();
  std::this_thread::sleep_for(50ms);  // the thread left alone ends
}

INSTANTIATE_TEST_SUITE_P(Backends, GenerationsTest, ::testing::Values("shm", "gloo"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace gz::test
