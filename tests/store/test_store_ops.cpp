// Every Store operation, on every implementation (MemStore, FileStore, TcpStore, PrefixStore, and
// EtcdStore against a real etcd member on loopback when etcd is installed).
#include <algorithm>
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <random>
#include <thread>

#include "gz/core/error.h"
#include "store/store_fixtures.h"

namespace gz {
namespace {

using namespace std::chrono_literals;

class StoreOps : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam().find("etcd") != std::string::npos && test::etcd_binary().empty())
      GTEST_SKIP() << "etcd is not installed (apt-get install etcd-server)";
    env_ = test::make_store_env(GetParam());
    ASSERT_TRUE(env_.client) << "unknown store kind " << GetParam();
    store_ = env_.client();
  }
  test::StoreEnv env_;
  std::shared_ptr<Store> store_;
};

TEST_P(StoreOps, SetGetOverwrite) {
  store_->set("a", to_bytes("1"));
  EXPECT_EQ(to_string(store_->get("a", Deadline::after(1s))), "1");
  store_->set("a", to_bytes("two"));
  EXPECT_EQ(to_string(store_->get("a", Deadline::after(1s))), "two");
  // Another handle sees the same data.
  auto other = env_.client();
  EXPECT_EQ(to_string(other->get("a", Deadline::after(1s))), "two");
}

TEST_P(StoreOps, BinaryAndLargeValues) {
  Bytes bin;
  std::mt19937 rng(7);
  for (int i = 0; i < 3 << 20; ++i) bin.push_back(static_cast<uint8_t>(rng()));
  bin[0] = 0;
  store_->set(std::string("k\0ey", 4), bin);
  EXPECT_EQ(store_->get(std::string("k\0ey", 4), Deadline::after(5s)), bin);
  store_->set("empty", {});
  EXPECT_TRUE(store_->get("empty", Deadline::after(1s)).empty());
  EXPECT_TRUE(store_->check({"empty"}));
}

TEST_P(StoreOps, GetWaitsForALaterSet) {
  auto writer = env_.client();
  // The clock starts before the writer exists: its set comes at least 100 ms later whatever the
  // scheduler does. (Started after the thread, as it was, the writer's sleep could begin before
  // the clock did: a main thread descheduled for 20 ms between the two, which TSan's slower
  // pthread_create and a loaded machine make likely, measured less than 80 ms.)
  Stopwatch sw;
  std::thread t([&] {
    std::this_thread::sleep_for(100ms);
    writer->set("late", to_bytes("here"));
  });
  EXPECT_EQ(to_string(store_->get("late", Deadline::after(5s))), "here");
  EXPECT_GE(sw.elapsed().count(), 100);
  t.join();
}

TEST_P(StoreOps, GetTimesOutNamingTheKey) {
  Stopwatch sw;
  try {
    store_->get("never/there", Deadline::after(300ms));
    FAIL() << "get on a missing key returned";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("never/there"), std::string::npos) << e.what();
  }
  EXPECT_GE(sw.elapsed().count(), 250);
  EXPECT_LT(sw.elapsed().count(), 1500);
  // The store is still usable afterwards.
  store_->set("x", to_bytes("y"));
  EXPECT_EQ(to_string(store_->get("x", Deadline::after(1s))), "y");
}

TEST_P(StoreOps, DefaultTimeoutOverloads) {
  store_->set_timeout(200ms);
  EXPECT_THROW(store_->get("missing"), TimeoutError);
  EXPECT_THROW(store_->wait({"missing"}), TimeoutError);
}

TEST_P(StoreOps, AddCounts) {
  EXPECT_EQ(store_->add("c", 5), 5);
  EXPECT_EQ(store_->add("c", -7), -2);
  EXPECT_EQ(store_->add("c", 0), -2);
  EXPECT_EQ(to_string(store_->get("c", Deadline::after(1s))), "-2");
  store_->set("text", to_bytes("abc"));
  EXPECT_THROW(store_->add("text", 1), InvalidArgument);
  EXPECT_EQ(to_string(store_->get("text", Deadline::after(1s))), "abc");  // unchanged
}

TEST_P(StoreOps, CompareSet) {
  // Missing key + empty expectation: set.
  EXPECT_EQ(to_string(store_->compare_set("cs", {}, to_bytes("v1"))), "v1");
  // Wrong expectation: unchanged, current value returned.
  EXPECT_EQ(to_string(store_->compare_set("cs", to_bytes("nope"), to_bytes("v2"))), "v1");
  EXPECT_EQ(to_string(store_->get("cs", Deadline::after(1s))), "v1");
  // Right expectation: swapped.
  EXPECT_EQ(to_string(store_->compare_set("cs", to_bytes("v1"), to_bytes("v2"))), "v2");
  EXPECT_EQ(to_string(store_->get("cs", Deadline::after(1s))), "v2");
  // Missing key + non-empty expectation: nothing stored, expectation echoed.
  EXPECT_EQ(to_string(store_->compare_set("cs2", to_bytes("x"), to_bytes("y"))), "x");
  EXPECT_FALSE(store_->check({"cs2"}));
}

TEST_P(StoreOps, WaitCheckDelete) {
  EXPECT_TRUE(store_->check({}));
  EXPECT_FALSE(store_->check({"w1"}));
  store_->set("w1", to_bytes("1"));
  EXPECT_TRUE(store_->check({"w1"}));
  EXPECT_FALSE(store_->check({"w1", "w2"}));
  try {
    store_->wait({"w1", "w2"}, Deadline::after(200ms));
    FAIL() << "wait returned with w2 missing";
  } catch (const TimeoutError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("w2"), std::string::npos) << msg;
  }
  auto writer = env_.client();
  std::thread t([&] {
    std::this_thread::sleep_for(50ms);
    writer->set("w2", to_bytes("2"));
  });
  store_->wait({"w1", "w2"}, Deadline::after(5s));
  t.join();
  EXPECT_TRUE(store_->delete_key("w1"));
  EXPECT_FALSE(store_->delete_key("w1"));
  EXPECT_FALSE(store_->check({"w1"}));
  EXPECT_THROW(store_->get("w1", Deadline::after(100ms)), TimeoutError);
}

TEST_P(StoreOps, NumKeys) {
  int64_t base = store_->num_keys();
  store_->set("n1", to_bytes("1"));
  store_->set("n2", to_bytes("1"));
  store_->set("n2", to_bytes("2"));
  store_->add("n3", 1);
  EXPECT_EQ(store_->num_keys(), base + 3);
  store_->delete_key("n1");
  EXPECT_EQ(store_->num_keys(), base + 2);
}

TEST_P(StoreOps, ConcurrentAddsSeparateClients) {
  // etcd: each add is a consensus round between processes; fewer keep the suite lean.
  const int threads = 8, adds = GetParam().find("etcd") != std::string::npos ? 50 : 200;
  std::vector<std::thread> ts;
  std::vector<std::exception_ptr> errs(threads);
  for (int i = 0; i < threads; ++i)
    ts.emplace_back([&, i] {
      try {
        auto c = env_.client();
        for (int j = 0; j < adds; ++j) c->add("total", 1);
      } catch (...) {
        errs[i] = std::current_exception();
      }
    });
  for (auto& t : ts) t.join();
  for (auto& e : errs)
    if (e) std::rethrow_exception(e);
  EXPECT_EQ(store_->add("total", 0), threads * adds);
}

TEST_P(StoreOps, ConcurrentThreadsShareOneClient) {
  const int threads = 8, adds = GetParam().find("etcd") != std::string::npos ? 50 : 200;
  std::vector<std::thread> ts;
  std::atomic<int> failures{0};
  std::atomic<int64_t> max_seen{0};
  for (int i = 0; i < threads; ++i)
    ts.emplace_back([&, i] {
      try {
        for (int j = 0; j < adds; ++j) {
          int64_t v = store_->add("shared", 1);
          int64_t m = max_seen.load();
          while (v > m && !max_seen.compare_exchange_weak(m, v)) {
          }
          if (j % 50 == 0) store_->set("t" + std::to_string(i), to_bytes(std::to_string(j)));
        }
      } catch (...) {
        ++failures;
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(store_->add("shared", 0), threads * adds);
  EXPECT_EQ(max_seen.load(), threads * adds);  // every add saw a distinct, increasing value
}

TEST_P(StoreOps, BarrierAcrossClients) {
  const int world = 7;
  std::atomic<int> before{0}, bad{0};
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&] {
      auto c = env_.client();
      ++before;
      store_barrier(*c, "b0", world, Deadline::after(10s));
      if (before.load() != world) ++bad;  // nobody leaves before everyone arrived
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(bad.load(), 0);
  // A barrier short of one participant times out.
  EXPECT_THROW(store_barrier(*store_, "b1", 2, Deadline::after(200ms)), TimeoutError);
}

TEST_P(StoreOps, AppendIsAtomicAcrossClients) {
  EXPECT_EQ(store_->append("log", to_bytes("ab")), 2);
  EXPECT_EQ(store_->append("log", to_bytes("c")), 3);
  EXPECT_EQ(to_string(store_->get("log", Deadline::after(1s))), "abc");
  const int threads = 6, appends = 50;
  std::vector<std::thread> ts;
  for (int i = 0; i < threads; ++i)
    ts.emplace_back([&, i] {
      auto c = env_.client();
      for (int j = 0; j < appends; ++j) c->append("many", to_bytes(std::string(1, static_cast<char>('a' + i))));
    });
  for (auto& t : ts) t.join();
  const std::string all = to_string(store_->get("many", Deadline::after(1s)));
  ASSERT_EQ(all.size(), static_cast<size_t>(threads * appends)) << "an append was lost";
  for (int i = 0; i < threads; ++i)
    EXPECT_EQ(std::count(all.begin(), all.end(), static_cast<char>('a' + i)), appends);
}

TEST_P(StoreOps, AllgatherReturnsEveryRankInOrderAndNamesTheMissing) {
  const int world = 7;
  std::vector<std::vector<Bytes>> got(world);
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      auto c = env_.client();
      got[r] = store_allgather(*c, "g", r, world, to_bytes(std::string(static_cast<size_t>(r), 'x')), Deadline::after(10s));
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(got[r].size(), static_cast<size_t>(world));
    for (int q = 0; q < world; ++q) EXPECT_EQ(to_string(got[r][q]), std::string(static_cast<size_t>(q), 'x'));
  }
  // Rank 1 of 3 never comes: rank 0 times out naming it.
  try {
    store_allgather(*store_, "h", 0, 3, to_bytes("a"), Deadline::after(200ms));
    ADD_FAILURE() << "allgather short of two ranks succeeded";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("rank(s) 1, 2"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(AllStores, StoreOps,
                         ::testing::Values("mem", "file", "tcp", "prefix_mem", "prefix_tcp", "etcd",
                                           "prefix_etcd"),
                         [](const auto& info) { return info.param; });

TEST(PrefixStore, IsolatesPrefixes) {
  auto base = std::make_shared<MemStore>();
  PrefixStore a("run/1", base), b("run/2", base);
  a.set("k", to_bytes("a"));
  b.set("k", to_bytes("b"));
  EXPECT_EQ(to_string(a.get("k", Deadline::after(1s))), "a");
  EXPECT_EQ(to_string(b.get("k", Deadline::after(1s))), "b");
  EXPECT_EQ(to_string(base->get("run/1/k", Deadline::after(1s))), "a");
  EXPECT_FALSE(a.check({"run/2/k"}));
}

TEST(FileStore, SurvivesATornTailAndSeesOtherWriters) {
  test::TempDir dir;
  std::string path = dir.file("log");
  FileStore a(path);
  a.set("k1", to_bytes("v1"));
  {
    // A writer that died half-way through a record.
    FILE* f = std::fopen(path.c_str(), "ab");
    ASSERT_NE(f, nullptr);
    std::fwrite("\x40\x00\x00\x00\x02", 1, 5, f);
    std::fclose(f);
  }
  FileStore b(path);
  EXPECT_EQ(to_string(b.get("k1", Deadline::after(1s))), "v1");
  b.set("k2", to_bytes("v2"));  // truncates the torn record first
  EXPECT_EQ(to_string(a.get("k2", Deadline::after(1s))), "v2");
  FileStore c(path);
  EXPECT_EQ(c.num_keys(), 2);
}

TEST(FileStore, CorruptLogIsAClearError) {
  test::TempDir dir;
  std::string path = dir.file("log");
  {
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    // A complete frame whose record type is unknown (an incomplete tail would count as torn).
    std::string junk = std::string("\x10\x00\x00\x00", 4) + std::string(16, '\x7f');
    std::fwrite(junk.data(), 1, junk.size(), f);
    std::fclose(f);
  }
  FileStore s(path);
  try {
    s.num_keys();
    FAIL() << "corrupt log accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST(FileStore, ProcessesShareOneFile) {
  test::TempDir dir;
  std::string path = dir.file("log");
  const int procs = 4, adds = 100;
  std::vector<pid_t> kids;
  for (int p = 0; p < procs; ++p) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int code = 0;
      try {
        FileStore s(path);
        for (int i = 0; i < adds; ++i) s.add("count", 1);
        s.set("done/" + std::to_string(p), to_bytes("1"));
      } catch (...) {
        code = 1;
      }
      _exit(code);
    }
    kids.push_back(pid);
  }
  FileStore s(path);
  std::vector<std::string> done;
  for (int p = 0; p < procs; ++p) done.push_back("done/" + std::to_string(p));
  s.wait(done, Deadline::after(std::chrono::seconds(20)));
  for (pid_t k : kids) {
    int status = 0;
    waitpid(k, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  EXPECT_EQ(s.add("count", 0), procs * adds);
}

TEST(FileStore, UnwritablePathIsASystemError) {
  EXPECT_THROW(FileStore("/nonexistent-dir-gz/x/store"), SystemError);
}

}  // namespace
}  // namespace gz
