// The etcd store against real etcd members on loopback (started here, killed at the end): watches
// instead of polling, exactly-once add after a lost answer, member failure and a silent member in a
// 3-member cluster, quorum loss within the deadline, authentication, TLS, and the rule that a
// password never travels in clear text to a server that has not proved who it is. The Store
// semantics themselves are checked by test_store_ops (kinds "etcd" and "prefix_etcd").
// Exits 77 (ctest: skipped) when etcd is not installed.
#include <dirent.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <thread>

#include "gz/core/error.h"
#include "gz/store/etcd_store.h"
#include "gz/store/prefix_store.h"
#include "gz/store/rendezvous.h"
#include "gz/store/round_move.h"
#include "store/etcd/etcd_client.h"
#include "store/etcd_cluster.h"
#include "store/store_fixtures.h"

namespace gz {
namespace {

using namespace std::chrono_literals;
using etcd::json;
using test::EtcdCluster;
using test::EtcdClusterOptions;

std::string text_of(const Bytes& b) { return to_string(b); }

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// ---- watch, not poll --------------------------------------------------------------------------

TEST(EtcdStore, GetWatchesInsteadOfPolling) {
  auto o = test::shared_etcd().client_options();
  o.watch_check_interval = 5s;  // a poller would only see the key after this
  EtcdStore reader(o), writer(o);
  std::thread t([&] {
    std::this_thread::sleep_for(300ms);
    writer.set("late", to_bytes("v"));
  });
  const uint64_t before = EtcdStore::requests_sent();
  Stopwatch sw;
  EXPECT_EQ(text_of(reader.get("late", Deadline::after(10s))), "v");
  const auto ms = sw.elapsed().count();
  t.join();
  EXPECT_GE(ms, 250);
  EXPECT_LT(ms, 1500) << "get() saw the key only after " << ms << " ms: it polls instead of watching";
  // One read, one watch (+ the writer's put): no request per few milliseconds.
  EXPECT_LE(EtcdStore::requests_sent() - before, 6u);
}

TEST(EtcdStore, WaitWatchesSeveralKeysAndKeepsItsDeadline) {
  auto o = test::shared_etcd().client_options();
  o.watch_check_interval = 5s;
  EtcdStore waiter(o), writer(o);
  writer.set("a", to_bytes("1"));
  std::thread t([&] {
    std::this_thread::sleep_for(200ms);
    writer.set("b", to_bytes("2"));
    std::this_thread::sleep_for(200ms);
    writer.set("c", to_bytes("3"));
  });
  Stopwatch sw;
  waiter.wait({"a", "b", "c"}, Deadline::after(10s));
  EXPECT_LT(sw.elapsed().count(), 1500);
  t.join();
  sw.reset();
  try {
    waiter.wait({"a", "never"}, Deadline::after(700ms));
    FAIL() << "wait for a missing key returned";
  } catch (const TimeoutError& e) {
    EXPECT_TRUE(contains(e.what(), "never")) << e.what();
    EXPECT_FALSE(contains(e.what(), "a, ")) << "names a key that is there: " << e.what();
  }
  EXPECT_GE(sw.elapsed().count(), 650);
  EXPECT_LT(sw.elapsed().count(), 1700);
}

// ---- exactly once -------------------------------------------------------------------------------

/// A TCP relay to one member that can lose answers: the request reaches etcd, the answer is
/// dropped and the connection closed, as when a member dies right after applying a request.
class LossyProxy {
 public:
  explicit LossyProxy(int upstream_port) : upstream_(upstream_port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    ::bind(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
    ::listen(fd_, 16);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&sa), &len);
    port_ = ntohs(sa.sin_port);
    accept_ = std::thread([this] { accept_loop(); });
  }
  ~LossyProxy() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    accept_.join();
    for (auto& t : relays_) t.join();
    ::close(fd_);
  }
  int port() const { return port_; }
  std::atomic<int> drop_answers{0};
  std::atomic<int> dropped{0};

 private:
  void accept_loop() {
    while (!stop_) {
      int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) return;
      relays_.emplace_back([this, c] { relay(c); });
    }
  }
  void relay(int c) {
    int u = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons(static_cast<uint16_t>(upstream_));
    if (::connect(u, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
      ::close(c);
      ::close(u);
      return;
    }
    char buf[65536];
    while (!stop_) {
      pollfd p[2] = {{c, POLLIN, 0}, {u, POLLIN, 0}};
      if (::poll(p, 2, 100) <= 0) continue;
      if (p[0].revents) {
        ssize_t n = ::recv(c, buf, sizeof buf, 0);
        if (n <= 0 || ::send(u, buf, static_cast<size_t>(n), MSG_NOSIGNAL) != n) break;
      }
      if (p[1].revents) {
        ssize_t n = ::recv(u, buf, sizeof buf, 0);
        if (n <= 0) break;
        if (drop_answers > 0) {
          --drop_answers;
          ++dropped;
          break;  // applied by etcd, answer lost
        }
        if (::send(c, buf, static_cast<size_t>(n), MSG_NOSIGNAL) != n) break;
      }
    }
    ::close(c);
    ::close(u);
  }
  int upstream_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread accept_;
  std::vector<std::thread> relays_;
};

int port_of(const std::string& endpoint) {
  return std::atoi(endpoint.substr(endpoint.rfind(':') + 1).c_str());
}

TEST(EtcdStore, AddAndAppendAreAppliedOnceWhenTheAnswerIsLost) {
  EtcdCluster& etcd = test::shared_etcd();
  LossyProxy proxy(port_of(etcd.endpoint(0)));
  auto o = etcd.client_options();
  // The proxy twice: after a lost answer the client moves to "the next member" and retries
  // there, which is the same etcd member, where the first try was applied.
  const std::string via = "http://127.0.0.1:" + std::to_string(proxy.port());
  o.endpoints = {via, via};
  EtcdStore s(o);
  auto d = o;
  d.endpoints = {etcd.endpoint(0)};
  EtcdStore direct(d);
  for (int i = 1; i <= 3; ++i) {
    proxy.drop_answers = 1;
    EXPECT_EQ(s.add("counter", 1), i) << "an add whose answer was lost was applied twice";
    EXPECT_EQ(proxy.dropped.load(), i);
  }
  EXPECT_EQ(direct.add("counter", 0), 3);
  proxy.drop_answers = 1;
  EXPECT_EQ(s.append("log", to_bytes("abc")), 3);
  EXPECT_EQ(proxy.dropped.load(), 4);
  EXPECT_EQ(text_of(direct.get("log", Deadline::after(2s))), "abc") << "append applied twice";
}

// Change records of a key without its value (a client died between its writes, or a job was
// killed): compare_set with an empty expectation must still set the key. Before, its first
// transaction failed on the records, the key read as missing, and it retried that transaction
// back to back until the deadline, then failed with a misleading "no member answered".
TEST(EtcdStore, CompareSetOverOrphanChangeRecordsEnds) {
  auto o = test::shared_etcd().client_options();
  o.timeout = 3s;
  EtcdStore s(o);
  // A record under P/c/<hex of "key">/ (hex "6b6579"), written as another store's key.
  auto orphan_o = o;
  orphan_o.prefix = o.prefix + "/c/6b6579";
  EtcdStore orphan(orphan_o);
  orphan.set("x", to_bytes("c1"));
  EXPECT_FALSE(s.check({"key"}));
  auto done = std::make_shared<std::atomic<bool>>(false);
  auto result = std::make_shared<std::string>();
  std::thread t([&s, done, result] {
    try {
      *result = text_of(s.compare_set("key", Bytes{}, to_bytes("mine")));
    } catch (const std::exception& e) {
      *result = std::string("threw: ") + e.what();
    }
    *done = true;
  });
  Deadline d = Deadline::after(10s);
  while (!*done && !d.expired()) std::this_thread::sleep_for(10ms);
  if (!*done) {
    ADD_FAILURE() << "compare_set over orphan change records did not return within 10 s (3 s deadline)";
    t.detach();
    std::fflush(stdout);
    std::_Exit(1);  // the thread spins on: nothing more can be tested
  }
  t.join();
  EXPECT_EQ(*result, "mine");
  EXPECT_EQ(text_of(s.get("key", Deadline::after(2s))), "mine");
}

// What gzrun's in-place moves need of the store, over etcd: meet() (one append per rank) and the
// claim on a worker's accepts key (compare-and-set, a missing key returning the expectation).
TEST(EtcdStore, MeetingsAndMoveClaimsWork) {
  auto o = test::shared_etcd().client_options();
  std::vector<std::thread> ts;
  std::atomic<int> met{0};
  for (int r = 0; r < 3; ++r)
    ts.emplace_back([&, r] {
      PrefixStore run(run_prefix("meet-etcd"), std::make_shared<EtcdStore>(o));
      WorldInfo w;
      w.rank = r;
      w.world_size = 3;
      if (meet(run, w, Deadline::after(20s), "etcd")) ++met;
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(met.load(), 3);
  auto base = std::make_shared<EtcdStore>(o);
  PrefixStore run(run_prefix("claim-etcd"), base);
  WorldInfo w;
  RoundFollower f(base, "claim-etcd", w);
  EXPECT_FALSE(claim_round_moves(run, {0})) << "claimed a worker that never accepted";
  f.accept(true, Deadline::after(10s));
  EXPECT_TRUE(round_accepts(run, 0));
  ASSERT_TRUE(claim_round_moves(run, {0}));
  EXPECT_FALSE(round_accepts(run, 0));
  release_round_moves(run, {0});
  f.accept(false, Deadline::after(10s));  // released: withdraws at once
  EXPECT_FALSE(claim_round_moves(run, {0})) << "claimed a worker that withdrew";
  f.accept(true, Deadline::after(10s));
  ASSERT_TRUE(claim_round_moves(run, {0}));
  f.accept(false, Deadline::after(200ms));  // claimed past its deadline: takes the key back
  EXPECT_FALSE(commit_round_moves(run, {0})) << "committed a worker that withdrew at its deadline";
}

// delete_key says whether the key was there, whatever made it (set, add, append, changes
// folded in or not), as the other stores do.
TEST(EtcdStore, DeleteKeyTellsWhetherTheKeyWasThere) {
  auto o = test::shared_etcd().client_options();
  EtcdStore a(o), b(o);
  EXPECT_FALSE(a.delete_key("never"));
  a.set("k", to_bytes("v"));
  EXPECT_TRUE(a.delete_key("k"));
  EXPECT_FALSE(a.delete_key("k"));
  EXPECT_FALSE(a.check({"k"}));
  // A counter two clients changed (the second add may be a change record).
  a.add("n", 1);
  b.add("n", 2);
  EXPECT_TRUE(b.delete_key("n"));
  EXPECT_FALSE(a.check({"n"}));
  EXPECT_FALSE(a.delete_key("n"));
  EXPECT_EQ(a.add("n", 5), 5) << "a deleted counter starts again from 0";
  a.append("s", to_bytes("x"));
  EXPECT_TRUE(a.delete_key("s"));
}

/// A server that answers every request with 200 and `body`, to see what the client makes of
/// answers of another shape.
class OddServer {
 public:
  /// `raw`: `body` is the whole response, head included, sent as soon as any bytes arrive.
  explicit OddServer(std::string body, bool raw = false) : body_(std::move(body)), raw_(raw) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    ::bind(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
    ::listen(fd_, 16);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&sa), &len);
    port_ = ntohs(sa.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~OddServer() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  int port() const { return port_; }

 private:
  void serve() {
    pollfd p{fd_, POLLIN, 0};
    while (!stop_) {
      if (::poll(&p, 1, 50) <= 0) continue;
      int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) continue;
      std::string in;
      char buf[4096];
      pollfd q{c, POLLIN, 0};
      while (!stop_ && ::poll(&q, 1, 200) > 0) {
        ssize_t n = ::read(c, buf, sizeof buf);
        if (n <= 0) break;
        in.append(buf, static_cast<size_t>(n));
        if (raw_) {
          (void)!::send(c, body_.data(), body_.size(), MSG_NOSIGNAL);
          break;
        }
        const size_t head = in.find("\r\n\r\n");
        if (head == std::string::npos) continue;
        const size_t cl = in.find("Content-Length: ");
        const size_t len = cl == std::string::npos ? 0 : std::strtoul(in.c_str() + cl + 16, nullptr, 10);
        if (in.size() < head + 4 + len) continue;
        in.erase(0, head + 4 + len);
        const std::string out =
            "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body_.size()) + "\r\n\r\n" + body_;
        (void)!::send(c, out.data(), out.size(), MSG_NOSIGNAL);
      }
      ::close(c);
    }
  }
  std::string body_;
  bool raw_ = false;
  int fd_ = -1, port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// A server that announces a huge body (here 200 MiB) is refused from the head alone: no client
// buffers more than 64 MiB of one answer (etcd's requests are 1.5 MiB by default). Before, the
// bound was 512 MiB per answer, per connection.
TEST(EtcdStore, HugeAnswersAreRefusedFromTheirHead) {
  OddServer huge("HTTP/1.1 200 OK\r\nContent-Length: 209715200\r\n\r\n{", true);
  EtcdStoreOptions o;
  o.endpoints = {"127.0.0.1:" + std::to_string(huge.port())};
  o.prefix = "/huge";
  o.timeout = 1s;
  try {
    EtcdStore s(o);
    FAIL() << "accepted an answer announcing 200 MiB";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "bad Content-Length")) << e.what();
  }
}

// Answers of an unexpected shape (fields of other types) are gz errors naming the endpoint, never
// nlohmann::json's exceptions, which no caller of a Store expects.
TEST(EtcdStore, AnswersOfAnotherShapeAreGzErrors) {
  OddServer odd(R"({"succeeded":"yes","count":{"a":1},"header":[],)"
                R"("responses":[{"response_range":{"kvs":[{"key":1,"value":[2],"create_revision":"x"}]}}]})");
  EtcdStoreOptions o;
  o.endpoints = {"127.0.0.1:" + std::to_string(odd.port())};
  o.prefix = "/odd";
  o.timeout = 1s;
  auto gz_error_or_none = [](const char* op, const std::function<void()>& f) {
    try {
      f();
    } catch (const Error&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << op << ": not a gz::Error: " << e.what();
    }
  };
  std::unique_ptr<EtcdStore> s;
  gz_error_or_none("connect", [&] { s = std::make_unique<EtcdStore>(o); });
  ASSERT_TRUE(s) << "the first contact needs no particular field";
  gz_error_or_none("compare_set", [&] { s->compare_set("k", to_bytes("a"), to_bytes("b")); });
  gz_error_or_none("get", [&] { s->get("k", Deadline::after(1s)); });
  gz_error_or_none("add", [&] { s->add("k", 1); });
  gz_error_or_none("num_keys", [&] { s->num_keys(); });
  gz_error_or_none("delete_key", [&] { s->delete_key("k"); });
  gz_error_or_none("check", [&] { s->check({"k"}); });
}

TEST(EtcdStore, ConcurrentAddsAndAppendsTakeOneTransactionEach) {
  // N clients at once on one counter and one record list (a barrier, an all-gather): a
  // compare-and-swap loop would cost the last of them N rounds (N^2/2 requests in all).
  EtcdCluster& etcd = test::shared_etcd();
  auto o = etcd.client_options();
  o.attempt_timeout = 20s;  // a slow answer on a loaded machine is no reason for a retry here
  const int n = 16;
  std::vector<std::unique_ptr<EtcdStore>> clients;
  for (int i = 0; i < n; ++i) clients.push_back(std::make_unique<EtcdStore>(o));
  const uint64_t before = EtcdStore::requests_sent();
  std::vector<std::thread> ts;
  std::vector<int64_t> counts(n);
  for (int i = 0; i < n; ++i)
    ts.emplace_back([&, i] {
      clients[i]->append("records", to_bytes(std::string(1, static_cast<char>('a' + i))));
      counts[i] = clients[i]->add("arrived", 1);
    });
  for (auto& t : ts) t.join();
  const uint64_t requests = EtcdStore::requests_sent() - before;
  // Per client: one append, one add (and a retry now and then on a loaded machine).
  EXPECT_LE(requests, 3u * n) << requests << " requests for " << n << " appends and adds";
  std::sort(counts.begin(), counts.end());
  for (int i = 0; i < n; ++i) EXPECT_EQ(counts[i], i + 1) << "add results must be 1..n, each once";
  std::string all = text_of(clients[0]->get("records", Deadline::after(2s)));
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, "abcdefghijklmnop");
  // More changes than the fold threshold: they are folded into the value, which stays the same.
  for (int round = 0; round < 3; ++round) {
    ts.clear();
    for (int i = 0; i < n; ++i) ts.emplace_back([&, i] { clients[i]->add("arrived", 1); });
    for (auto& t : ts) t.join();
  }
  EXPECT_EQ(clients[0]->add("arrived", 0), 4 * n);
  etcd::Client raw(o);
  const std::string changes = o.prefix + "/c/";
  json r = raw.call("/v3/kv/range",
                    {{"key", etcd::b64_encode(changes)},
                     {"range_end", etcd::b64_encode(o.prefix + "/c0")},
                     {"count_only", true}},
                    Deadline::after(5s), "count");
  EXPECT_LT(etcd::field_i64(r, "count"), 32 + n) << "change records are never folded";
  clients[0]->set("arrived", to_bytes("7"));  // a set drops them
  EXPECT_EQ(clients[1]->add("arrived", 1), 8);
  // The clients' op records go with them.
  clients.clear();
  r = raw.call("/v3/kv/range",
               {{"key", etcd::b64_encode(o.prefix + "/op/")},
                {"range_end", etcd::b64_encode(o.prefix + "/op0")},
                {"count_only", true}},
               Deadline::after(5s), "count");
  EXPECT_EQ(etcd::field_i64(r, "count"), 0);
}

// ---- member failure -------------------------------------------------------------------------------

class EtcdThreeMembers : public ::testing::Test {
 protected:
  void SetUp() override {
    etcd_ = std::make_unique<EtcdCluster>(EtcdClusterOptions{3, "", "", "", {}});
    auto o = etcd_->client_options();
    store_ = std::make_unique<EtcdStore>(o);
    opts_ = o;
  }
  void TearDown() override {
    if (HasFailure()) std::fprintf(stderr, "%s", etcd_->logs().c_str());
  }
  int member_in_use() {
    const std::string ep = store_->endpoint();
    for (int i = 0; i < etcd_->size(); ++i)
      if (etcd_->endpoint(i) == ep) return i;
    return -1;
  }
  std::unique_ptr<EtcdCluster> etcd_;
  std::unique_ptr<EtcdStore> store_;
  EtcdStoreOptions opts_;
};

TEST_F(EtcdThreeMembers, KilledMemberIsLeftForTheNextWithinTheBound) {
  store_->set_timeout(10s);
  store_->set("k", to_bytes("before"));
  EXPECT_EQ(store_->add("n", 1), 1);
  const int victim = member_in_use();
  ASSERT_GE(victim, 0);
  etcd_->kill(victim);
  Stopwatch sw;
  store_->set("k", to_bytes("after"));
  // A refused connection moves on at once; the rest is the survivors' election (1-2 s).
  EXPECT_LT(sw.elapsed().count(), 8000);
  EXPECT_NE(member_in_use(), victim);
  EXPECT_EQ(text_of(store_->get("k", Deadline::after(5s))), "after");
  EXPECT_EQ(store_->add("n", 1), 2);
  EXPECT_TRUE(store_->check({"k", "n"}));
  // A second member lost: no quorum. Operations end at their deadline, naming every member.
  etcd_->kill((victim + 1) % 3);
  store_->set_timeout(1500ms);
  sw.reset();
  try {
    store_->set("k", to_bytes("no quorum"));
    FAIL() << "a write without quorum succeeded";
  } catch (const TimeoutError& e) {
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(contains(e.what(), etcd_->endpoint(i))) << e.what();
  }
  EXPECT_GE(sw.elapsed().count(), 1400);
  EXPECT_LT(sw.elapsed().count(), 5000);
  // A read without quorum also ends at its deadline.
  sw.reset();
  EXPECT_THROW(store_->get("missing", Deadline::after(1s)), TimeoutError);
  EXPECT_LT(sw.elapsed().count(), 4000);
  // The member returns: the job's store works again, data intact. (The write that timed out may
  // still be applied once the proposal it left commits: a timeout says "unknown", not "no".)
  etcd_->start((victim + 1) % 3);
  store_->set_timeout(15s);
  EXPECT_EQ(store_->add("n", 1), 3);
  const std::string k = text_of(store_->get("k", Deadline::after(5s)));
  EXPECT_TRUE(k == "after" || k == "no quorum") << k;
}

TEST_F(EtcdThreeMembers, SilentMemberIsLeftAndWaitersMoveOn) {
  store_->set_timeout(10s);
  const int victim = member_in_use();
  ASSERT_GE(victim, 0);
  // A waiter watching through the member that goes silent.
  auto wo = opts_;
  wo.watch_check_interval = 500ms;
  wo.attempt_timeout = 700ms;
  wo.endpoints = {etcd_->endpoint(victim), etcd_->endpoint((victim + 1) % 3),
                  etcd_->endpoint((victim + 2) % 3)};
  wo.spread = false;  // it starts on the victim
  EtcdStore waiter(wo);
  std::atomic<long long> waited_ms{-1};
  std::string error;
  std::thread t([&] {
    Stopwatch sw;
    try {
      waiter.wait({"release"}, Deadline::after(20s));
      waited_ms = sw.elapsed().count();
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  std::this_thread::sleep_for(300ms);
  etcd_->stop(victim);  // SIGSTOP: no RST, no answer, as a cut cable
  Stopwatch sw;
  store_->set_timeout(10s);
  store_->set("release", to_bytes("1"));
  const auto set_ms = sw.elapsed().count();
  t.join();
  etcd_->resume(victim);
  EXPECT_EQ(error, "");
  // The writer: one attempt's share (1 s) on the silent member, then the next, plus an election.
  EXPECT_LT(set_ms, 8000);
  // The waiter: its check finds the member silent and moves on within interval + attempt + slack.
  EXPECT_GE(waited_ms.load(), 0);
  EXPECT_LT(waited_ms.load(), 300 + set_ms + 500 + 700 + 2500) << "the waiter stayed with the silent member";
}

// ---- security ---------------------------------------------------------------------------------------

std::string local_non_loopback_ipv4() {
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return "";
  std::string out;
  for (ifaddrs* i = ifs; i && out.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    in_addr a = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr;
    if ((ntohl(a.s_addr) >> 24) == 127) continue;
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &a, buf, sizeof buf);
    out = buf;
  }
  freeifaddrs(ifs);
  return out;
}

TEST(EtcdSecurity, OptionRules) {
  EtcdStoreOptions o;
  o.endpoints = {"127.0.0.1:2379"};
  EXPECT_TRUE(check_etcd_options(o).empty());  // loopback, no credentials
  o.user = "gz";
  o.password = "secret";
  EXPECT_TRUE(check_etcd_options(o).empty());  // loopback: the password stays on the machine
  o.endpoints = {"127.0.0.1:2379", "10.1.2.3:2379"};
  EXPECT_THROW(check_etcd_options(o), InvalidArgument);  // clear text beyond loopback
  try {
    check_etcd_options(o);
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(contains(e.what(), "http://10.1.2.3:2379")) << e.what();
    EXPECT_TRUE(contains(e.what(), "https")) << e.what();
  }
  o.allow_insecure = true;
  auto w = check_etcd_options(o);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_TRUE(contains(w[0], "clear text")) << w[0];
  o.allow_insecure = false;
  o.endpoints = {"https://10.1.2.3:2379"};
  EXPECT_TRUE(check_etcd_options(o).empty());  // verified TLS
  o.user.clear();
  o.password.clear();
  EXPECT_THROW(check_etcd_options(o), InvalidArgument);  // beyond loopback, nobody authenticates
  o.cert_file = "c.pem";
  o.key_file = "k.pem";
  EXPECT_TRUE(check_etcd_options(o).empty());  // client certificate over TLS
  o.endpoints = {"http://10.1.2.3:2379"};
  EXPECT_THROW(check_etcd_options(o), InvalidArgument);  // a certificate means nothing in clear text
  o = EtcdStoreOptions{};
  o.endpoints = {"127.0.0.1:2379"};
  o.user = "gz";
  EXPECT_THROW(check_etcd_options(o), InvalidArgument);  // user without password
  o.user.clear();
  o.prefix = "no-slash";
  EXPECT_THROW(check_etcd_options(o), InvalidArgument);
  EXPECT_THROW(parse_etcd_endpoints(" , "), InvalidArgument);
  EXPECT_THROW(parse_etcd_endpoints("h1:2379,ftp://h2:1"), InvalidArgument);
  EXPECT_THROW(parse_etcd_endpoints("h1:99999"), InvalidArgument);
  EXPECT_EQ(parse_etcd_endpoints("h1:2379, https://[::1]:2380,h3").size(), 3u);
}

TEST(EtcdSecurity, PasswordNeverReachesAPlaintextServerBeyondLoopback) {
  const std::string ip = local_non_loopback_ipv4();
  if (ip.empty()) GTEST_SKIP() << "no non-loopback IPv4 address on this machine";
  // A listener that would see the password if the client sent it.
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  inet_pton(AF_INET, ip.c_str(), &sa.sin_addr);
  socklen_t len = sizeof sa;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  EtcdStoreOptions o;
  o.endpoints = {"http://" + ip + ":" + std::to_string(ntohs(sa.sin_port))};
  o.user = "gz";
  o.password = "the-rendezvous-token";
  o.timeout = 1s;
  EXPECT_THROW(EtcdStore s(o), InvalidArgument);
  std::this_thread::sleep_for(100ms);
  EXPECT_LT(::accept(fd, nullptr, nullptr), 0) << "the client connected to a server it must not trust";
  // With the explicit opt-out it does connect (and times out: the listener is no etcd).
  o.allow_insecure = true;
  EXPECT_THROW(EtcdStore s(o), TimeoutError);
  int c = ::accept(fd, nullptr, nullptr);
  EXPECT_GE(c, 0) << "--rdzv-insecure did not reach the server";
  if (c >= 0) ::close(c);
  ::close(fd);
}

// On loopback plain http is allowed (nothing travels beyond the machine), but any local user can
// listen on the port when etcd does not hold it (down, not started yet): the password (the
// rendezvous token) only goes to a listener of this user, root or "etcd". Before, it went to
// whoever listened. Needs root (to listen as another user).
TEST(EtcdSecurity, PasswordNeverReachesAnotherLocalUsersListener) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to listen as another user";
  int to_parent[2];
  ASSERT_EQ(::pipe(to_parent), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Another user's listener that reports what it was sent.
    ::close(to_parent[0]);
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(3);
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || ::listen(fd, 8) != 0) ::_exit(4);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
    const uint16_t port = ntohs(sa.sin_port);
    (void)!::write(to_parent[1], &port, sizeof port);
    std::string seen;
    pollfd p{fd, POLLIN, 0};
    while (::poll(&p, 1, 1500) > 0) {
      int c = ::accept(fd, nullptr, nullptr);
      if (c < 0) break;
      pollfd q{c, POLLIN, 0};
      char buf[4096];
      ssize_t n;
      while (::poll(&q, 1, 300) > 0 && (n = ::read(c, buf, sizeof buf)) > 0)
        seen.append(buf, static_cast<size_t>(n));
      ::close(c);
    }
    (void)!::write(to_parent[1], seen.data(), seen.size());
    ::_exit(0);
  }
  ::close(to_parent[1]);
  uint16_t port = 0;
  ASSERT_EQ(::read(to_parent[0], &port, sizeof port), static_cast<ssize_t>(sizeof port));
  EtcdStoreOptions o;
  o.endpoints = {"http://127.0.0.1:" + std::to_string(port)};
  o.user = "gz";
  o.password = "the-rendezvous-token";
  o.timeout = 1s;
  try {
    EtcdStore s(o);
    ADD_FAILURE() << "connected to another user's listener";
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(contains(e.what(), "local user 65534")) << e.what();
    EXPECT_TRUE(contains(e.what(), "--rdzv-insecure")) << e.what();
  } catch (const Error& e) {
    ADD_FAILURE() << "not refused for its owner: " << e.what();
  }
  std::string seen;
  char buf[4096];
  for (ssize_t n; (n = ::read(to_parent[0], buf, sizeof buf)) > 0;) seen.append(buf, static_cast<size_t>(n));
  ::close(to_parent[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "listener status " << status;
  EXPECT_FALSE(contains(seen, "the-rendezvous-token")) << "the password reached another user's listener";
}

size_t open_fds() {
  size_t n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d)) ++n;
    ::closedir(d);
  }
  return n;
}

// An https endpoint whose TLS handshake fails (here: a listener that hangs up at once) throws from
// the connection's constructor, which runs no destructor. Before, each such try leaked the socket
// and the SSL object, and a client retrying for its whole timeout leaked hundreds.
TEST(EtcdSecurity, FailedTlsHandshakesLeakNothing) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  ASSERT_EQ(::listen(fd, 64), 0);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  std::atomic<bool> stop{false};
  std::thread hangup([&] {
    pollfd p{fd, POLLIN, 0};
    while (!stop)
      if (::poll(&p, 1, 50) > 0) ::close(::accept(fd, nullptr, nullptr));
  });
  etcd::TlsContext tls("", "", "");
  const etcd::Endpoint ep = etcd::parse_endpoint("https://127.0.0.1:" + std::to_string(ntohs(sa.sin_port)));
  auto try_once = [&] {
    try {
      etcd::HttpConn c(ep, &tls, Deadline::after(2s));
      ADD_FAILURE() << "a TLS handshake with a listener that hangs up succeeded";
    } catch (const etcd::TransportError&) {
    }
  };
  try_once();  // OpenSSL's lazily loaded state
  const size_t before = open_fds();
  for (int i = 0; i < 50; ++i) try_once();
  EXPECT_EQ(open_fds(), before) << "descriptors leaked by failed TLS handshakes";
  stop = true;
  hangup.join();
  ::close(fd);
}

// An https endpoint where a plain-http server answers: the TLS handshake fails with a protocol
// error, the same on every try, so the client says so at once. Before, it retried until its
// whole timeout and reported "no member answered".
TEST(EtcdSecurity, TlsProtocolRefusalIsNotRetriedForTheWholeTimeout) {
  // What a plain-http server (etcd's http port) answers to a TLS hello: a 400.
  OddServer plain("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", true);
  EtcdStoreOptions o;
  o.endpoints = {"https://127.0.0.1:" + std::to_string(plain.port())};
  o.timeout = 20s;  // retrying would take all of it; refusing at once stays far below, also under load
  Stopwatch sw;
  try {
    EtcdStore s(o);
    FAIL() << "a TLS handshake with a plain-http server succeeded";
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(contains(e.what(), "TLS handshake refused")) << e.what();
  } catch (const Error& e) {
    ADD_FAILURE() << "not refused at once: " << e.what();
  }
  EXPECT_LT(sw.elapsed().count(), 5000) << "retried the refusal";  // 140 ms here; 2.4 s seen at load 8
}

TEST(EtcdSecurity, UserAndPasswordAuthentication) {
  if (test::etcdctl_binary().empty()) GTEST_SKIP() << "etcdctl not installed (etcd-client)";
  EtcdCluster etcd(EtcdClusterOptions{1, "", "", "", {"--auth-token-ttl", "1"}});
  auto o = etcd.client_options();
  {
    EtcdStore warm(o);  // the member is up
  }
  std::string out;
  for (const std::string& c : std::vector<std::string>{
           "user add root --new-user-password=rootpw", "role add root", "user grant-role root root",
           "user add gz --new-user-password=s3cret", "role add gzjob",
           "role grant-permission gzjob --prefix=true readwrite " + o.prefix + "/",
           "user grant-role gz gzjob", "auth enable"})
    ASSERT_EQ(etcd.etcdctl(c, &out), 0) << c << ": " << out;
  // No credentials: refused with a message that says so (not a timeout).
  Stopwatch sw;
  try {
    EtcdStore s(o);
    FAIL() << "connected without credentials";
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(contains(e.what(), "user")) << e.what();
  }
  // A wrong password: refused at once.
  o.user = "gz";
  o.password = "wrong";
  EXPECT_THROW(EtcdStore s(o), InvalidArgument);
  EXPECT_LT(sw.elapsed().count(), 3000);
  o.password = "s3cret";
  EtcdStore s(o);
  s.set("k", to_bytes("v"));
  EXPECT_EQ(s.add("n", 5), 5);
  // The token expires after 1 s idle (--auth-token-ttl): the client authenticates again.
  std::this_thread::sleep_for(2500ms);
  // A generous deadline: a starved etcd member (load 8 on 2 cores) once took over 5 s to answer.
  EXPECT_EQ(text_of(s.get("k", Deadline::after(20s))), "v");
  // Outside its permission: a clear refusal.
  auto other = o;
  other.prefix = "/elsewhere";
  try {
    EtcdStore x(other);
    x.set("k", to_bytes("v"));
    FAIL() << "wrote outside the user's permission";
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(contains(e.what(), "permission")) << e.what();
  }
}

/// Certificates for the TLS tests, made with the openssl command.
struct Certs {
  std::string dir, ca, server, server_key, wrong_name, wrong_name_key, client, client_key, other_ca;
  bool ok = false;
  explicit Certs(const std::string& d) : dir(d) {
    auto f = [&](const char* n) { return dir + "/" + n; };
    ca = f("ca.pem");
    server = f("server.pem");
    server_key = f("server.key");
    wrong_name = f("wrong.pem");
    wrong_name_key = f("wrong.key");
    client = f("client.pem");
    client_key = f("client.key");
    other_ca = f("other-ca.pem");
    const std::string script = dir + "/make-certs.sh";
    {
      std::ofstream f(script);
      f << "set -e\ncd '" << dir << "'\n"
        << "q() { \"$@\" >/dev/null 2>&1; }\n"
        << "q openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key -out "
           "ca.pem -days 2 -subj /CN=gz-test-ca\n"
        << "q openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout other-ca.key "
           "-out other-ca.pem -days 2 -subj /CN=other\n"
        << "sign() {\n"
        << "  q openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout $1.key -out "
           "$1.csr -subj /CN=$2\n"
        << "  printf 'subjectAltName=%s\\nextendedKeyUsage=serverAuth,clientAuth\\n' \"$3\" > $1.ext\n"
        << "  q openssl x509 -req -in $1.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out $1.pem -days 2 "
           "-extfile $1.ext\n"
        << "}\n"
        << "sign server 127.0.0.1 IP:127.0.0.1\nsign wrong elsewhere DNS:elsewhere.example\nsign client gz "
           "DNS:gz\n";
    }
    ok = std::system(("bash " + script).c_str()) == 0;
  }
};

TEST(EtcdSecurity, TlsVerifiesTheServerAndPresentsTheClientCertificate) {
  if (std::system("command -v openssl >/dev/null 2>&1") != 0) GTEST_SKIP() << "openssl command not installed";
  test::TempDir tmp;
  Certs certs(tmp.file(""));
  ASSERT_TRUE(certs.ok) << "could not make test certificates";
  EtcdCluster etcd(EtcdClusterOptions{1, certs.server, certs.server_key, certs.ca, {}});
  auto o = etcd.client_options();
  o.ca_file = certs.ca;
  o.cert_file = certs.client;
  o.key_file = certs.client_key;
  EtcdStore s(o);
  s.set("k", to_bytes("over tls"));
  EXPECT_EQ(text_of(s.get("k", Deadline::after(5s))), "over tls");
  EXPECT_EQ(s.add("n", 2), 2);
  // get() through a TLS watch.
  std::thread t([&] {
    std::this_thread::sleep_for(200ms);
    EtcdStore w(o);
    w.set("later", to_bytes("x"));
  });
  EXPECT_EQ(text_of(s.get("later", Deadline::after(5s))), "x");
  t.join();
  // A server whose certificate no trusted CA signed: refused, named.
  auto bad = o;
  bad.ca_file = certs.other_ca;
  bad.timeout = 20s;
  Stopwatch sw;
  try {
    EtcdStore x(bad);
    FAIL() << "trusted a server signed by an unknown CA";
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(contains(e.what(), "not trusted")) << e.what();
  }
  EXPECT_LT(sw.elapsed().count(), 5000) << "a certificate nobody trusts is no reason to wait";
  // No client certificate: etcd (--client-cert-auth) refuses the handshake.
  auto anon = o;
  anon.cert_file.clear();
  anon.key_file.clear();
  anon.timeout = 1500ms;
  EXPECT_THROW(EtcdStore x(anon), TimeoutError);
}

TEST(EtcdSecurity, TlsRefusesACertificateForAnotherName) {
  if (std::system("command -v openssl >/dev/null 2>&1") != 0) GTEST_SKIP() << "openssl command not installed";
  test::TempDir tmp;
  Certs certs(tmp.file(""));
  ASSERT_TRUE(certs.ok);
  EtcdCluster etcd(EtcdClusterOptions{1, certs.wrong_name, certs.wrong_name_key, "", {}});
  auto o = etcd.client_options();
  o.ca_file = certs.ca;
  o.timeout = 20s;
  try {
    EtcdStore x(o);
    FAIL() << "trusted a certificate issued for another host";
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(contains(e.what(), "not trusted")) << e.what();
    EXPECT_TRUE(contains(e.what(), "127.0.0.1")) << e.what();
  }
}

}  // namespace
}  // namespace gz

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (gz::test::etcd_binary().empty()) {
    std::printf("SKIP: etcd is not installed (apt-get install etcd-server etcd-client)\n");
    return 77;
  }
  return RUN_ALL_TESTS();
}
