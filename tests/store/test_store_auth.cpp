// The TcpStore server against unauthenticated clients: nothing readable or writable without the
// token, a deadline to authenticate, a small budget per handshake message, bounded slots per source
// (per local user on loopback), no client kept waiting by others' wrong tokens, and authenticated
// ranks served unharmed through all of it.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "gz/core/error.h"
#include "gz/core/log.h"
#include "gz/store/tcp_store.h"
#include "store/handshake.h"
#include "store/raw_conn.h"

namespace gz {
namespace {

using namespace std::chrono_literals;
using test::auth_frame;
using test::first_reply;
using test::hello_frame;
using test::RawConn;

const std::string kToken = "0123456789abcdef-test-token";

TcpStoreServerOptions secured() {
  TcpStoreServerOptions o;
  o.bind_addr = "127.0.0.1";
  o.token = kToken;
  return o;
}

TcpStoreOptions client(Duration timeout = 5s, const std::string& token = kToken) {
  TcpStoreOptions o;
  o.timeout = timeout;
  o.token = token;
  return o;
}

std::string request(wire::Op op, std::vector<std::string> parts, int64_t num = 0) {
  wire::Message m;
  m.code = static_cast<uint8_t>(op);
  m.num = num;
  m.parts = std::move(parts);
  return wire::encode(m);
}

// Every op a rank uses, as an attacker would send it.
std::vector<std::string> all_ops() {
  return {request(wire::Op::set, {"victim", "owned"}),
          request(wire::Op::get, {"victim"}, 200),
          request(wire::Op::get, {"secret"}, 200),
          request(wire::Op::add, {"counter"}, 5),
          request(wire::Op::append, {"victim", "owned"}),
          request(wire::Op::compare_set, {"victim", "original", "owned"}),
          request(wire::Op::wait, {"secret"}, 200),
          request(wire::Op::check, {"secret"}),
          request(wire::Op::delete_key, {"secret"}),
          request(wire::Op::num_keys, {})};
}

TEST(StoreAuth, ServerBeyondLoopbackNeedsATokenOrAnExplicitOptOut) {
  TcpStoreServerOptions o;
  o.bind_addr = "0.0.0.0";
  try {
    TcpStoreServer s(o);
    FAIL() << "a server on 0.0.0.0 started without a token";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("needs a rendezvous token"), std::string::npos) << e.what();
  }
  o.bind_addr = "";
  EXPECT_THROW(TcpStoreServer{o}, InvalidArgument);
  // Loopback needs none; a token that cannot fit a hello is refused up front.
  o.bind_addr = "127.0.0.1";
  EXPECT_NO_THROW(TcpStoreServer{o});
  o.token = std::string(kMaxRdzvTokenBytes + 1, 't');
  EXPECT_THROW(TcpStoreServer{o}, InvalidArgument);
  TcpStoreOptions co;
  co.token = o.token;
  EXPECT_THROW(TcpStore("127.0.0.1", 1, co), InvalidArgument);
}

TEST(StoreAuth, UnauthenticatedClientsCanNeitherReadNorWrite) {
  TcpStoreServer server(secured());
  TcpStore rank("127.0.0.1", server.port(), client());
  rank.set("victim", to_bytes("original"));
  rank.set("secret", to_bytes("s"));
  rank.add("counter", 1);
  const int64_t keys = rank.num_keys();

  // No handshake; a hello and no auth; a wrong proof; no proof; another protocol version.
  std::vector<std::string> openings = {"", hello_frame(), hello_frame() + auth_frame(),
                                       hello_frame() + auth_frame(""), hello_frame(std::string(32, 'n'), 99)};
  for (const auto& opening : openings)
    for (const auto& op : all_ops()) {
      RawConn raw(server.port());
      raw.send(opening + op);
      std::string got = raw.read_until_close(3s);
      EXPECT_TRUE(raw.closed()) << "connection kept open";
      // At most the challenge (for a well-formed hello), then the refusal, then nothing: no
      // further reply could carry a value.
      wire::Message rep = first_reply(got);
      if (rep.code == static_cast<uint8_t>(wire::Reply::challenge)) {
        got.erase(0, wire::encode(rep).size());
        rep = first_reply(got);
      }
      EXPECT_EQ(rep.code, static_cast<uint8_t>(wire::Reply::refused)) << "got " << wire::code_name(rep.code);
      EXPECT_EQ(got.size(), wire::encode(rep).size()) << "more than one reply to an unauthenticated client";
      EXPECT_EQ(got.find("original"), std::string::npos);
    }
  EXPECT_EQ(to_string(rank.get("victim", Deadline::after(1s))), "original");
  EXPECT_TRUE(rank.check({"secret"}));
  EXPECT_EQ(rank.add("counter", 0), 1);
  EXPECT_EQ(rank.num_keys(), keys);
  auto st = server.stats();
  EXPECT_EQ(st.authenticated, 1u);
  EXPECT_EQ(st.wrong_token, 2u * all_ops().size());
}

TEST(StoreAuth, SilentClientsAreClosedAtTheAuthDeadline) {
  TcpStoreServerOptions o = secured();
  o.auth_timeout = 300ms;
  TcpStoreServer server(o);
  TcpStore rank("127.0.0.1", server.port(), client());
  Stopwatch sw;
  RawConn silent(server.port());
  RawConn partial(server.port());
  partial.send(hello_frame().substr(0, 10));  // a hello that never completes
  silent.read_until_close(3s);
  const auto first = sw.elapsed();
  partial.read_until_close(3s);
  EXPECT_TRUE(silent.closed());
  EXPECT_TRUE(partial.closed());
  EXPECT_GE(first.count(), 250);
  EXPECT_LT(sw.elapsed().count(), 1500);
  EXPECT_EQ(server.stats().auth_timeouts, 2u);
  // The authenticated connection, idle all along, is untouched (a closed one would fail here).
  rank.set("still", to_bytes("here"));
  EXPECT_EQ(server.stats().accepted, 3u);
  EXPECT_EQ(server.stats().clients, 1u);
}

TEST(StoreAuth, OversizedFrameBeforeHelloIsRefusedUnread) {
  TcpStoreServerOptions o = secured();
  o.max_value_bytes = 64u << 20;  // after authentication 32 MiB would be a legal request
  TcpStoreServer server(o);
  {
    RawConn raw(server.port());
    raw.send(std::string("\x00\x00\x00\x02", 4));  // announces 32 MiB, sends nothing more
    Stopwatch sw;
    std::string got = raw.read_until_close(2s);
    EXPECT_TRUE(raw.closed()) << "the server waited for the body";
    EXPECT_LT(sw.elapsed().count(), 1500);
    EXPECT_EQ(first_reply(got).code, static_cast<uint8_t>(wire::Reply::refused));
  }
  {
    // Streaming the body anyway: the server never buffers more than a hello's worth.
    RawConn raw(server.port());
    std::string frame("\x00\x00\x00\x01", 4);
    frame += std::string(1u << 20, 'x');
    std::thread sender([&] { raw.send(frame); });
    raw.read_until_close(3s);
    sender.join();
    EXPECT_TRUE(raw.closed());
  }
  auto st = server.stats();
  EXPECT_EQ(st.oversized, 2u);
  EXPECT_LE(st.peak_pending_bytes, wire::kMaxHelloFrameBytes);
  TcpStore rank("127.0.0.1", server.port(), client());
  rank.set("k", to_bytes("v"));
}

TEST(StoreAuth, SlotsPerSourceEvictTheOldestNeverAnAuthenticatedClient) {
  TcpStoreServerOptions o = secured();
  o.max_pending_per_source = 4;
  o.max_pending_auth = 100;
  TcpStoreServer server(o);
  TcpStore rank("127.0.0.1", server.port(), client());
  std::vector<std::unique_ptr<RawConn>> flood;
  for (int i = 0; i < 10; ++i) {
    flood.push_back(std::make_unique<RawConn>(server.port()));
    std::this_thread::sleep_for(5ms);  // accepted in this order
  }
  Deadline d = Deadline::after(3s);
  while (server.stats().evicted < 6 && !d.expired()) std::this_thread::sleep_for(5ms);
  // The counter moves when a connection is marked for closing; its socket closes a moment later.
  auto closed_soon = [&](RawConn& c) {
    while (!c.closed_now() && !d.expired()) std::this_thread::sleep_for(5ms);
    return c.closed();
  };
  for (int i = 0; i < 10; ++i) {
    auto& c = *flood[static_cast<size_t>(i)];
    EXPECT_EQ(i < 6 ? closed_soon(c) : c.closed_now(), i < 6) << "connection " << i;
  }
  auto st = server.stats();
  EXPECT_EQ(st.evicted, 6u);
  EXPECT_EQ(st.pending, 4u);
  EXPECT_EQ(st.peak_pending, 4u);
  // The authenticated rank was never a candidate; a new rank still gets in (evicting a raw one).
  rank.set("k", to_bytes("v"));
  TcpStore late("127.0.0.1", server.port(), client());
  EXPECT_EQ(to_string(late.get("k", Deadline::after(1s))), "v");
  EXPECT_EQ(server.stats().clients, 2u);
}

TEST(StoreAuth, WrongTokensAreRefusedAtOnceAndLoggedOnce) {
  TcpStoreServer server(secured());
  testing::internal::CaptureStderr();
  Stopwatch sw;
  // Sequential and parallel guesses over separate connections: each is refused as soon as its
  // proof arrives (a pause would only slow an online guesser, never an offline one: the server
  // proves itself first, so the token's strength is the defence).
  for (int i = 0; i < 3; ++i) {
    RawConn guess(server.port());
    guess.send(hello_frame() + auth_frame("guess-" + std::to_string(i)));
    EXPECT_EQ(guess.read_frame(3s).code, static_cast<uint8_t>(wire::Reply::challenge));
    EXPECT_EQ(guess.read_frame(3s).code, static_cast<uint8_t>(wire::Reply::refused));
  }
  std::vector<std::unique_ptr<RawConn>> parallel;
  for (int i = 0; i < 3; ++i) parallel.push_back(std::make_unique<RawConn>(server.port()));
  for (auto& p : parallel) p->send(hello_frame() + auth_frame());
  for (auto& p : parallel) {
    EXPECT_EQ(p->read_frame(3s).code, static_cast<uint8_t>(wire::Reply::challenge));
    EXPECT_EQ(p->read_frame(3s).code, static_cast<uint8_t>(wire::Reply::refused));
  }
  // The rightful token right after them is not kept waiting either.
  TcpStore rank("127.0.0.1", server.port(), client());
  const auto all = sw.elapsed();
  std::string log = testing::internal::GetCapturedStderr();
  EXPECT_LT(all.count(), 1500);
  EXPECT_EQ(server.stats().wrong_token, 6u);
  // One line for the source (on loopback: the local user), never a presented proof.
  const std::string who = "refused local user " + std::to_string(::geteuid());
  size_t lines = 0;
  for (size_t p = log.find("refused "); p != std::string::npos; p = log.find("refused ", p + 1)) ++lines;
  if (log_level() <= LogLevel::warn) {
    EXPECT_EQ(lines, 1u) << log;
    EXPECT_NE(log.find(who), std::string::npos) << log;
  }
  EXPECT_EQ(log.find("guess-"), std::string::npos) << "a presented proof reached the log:\n" << log;
}

// The all-wrong-token pattern of issue 24: from this process (the same local user as the
// ranks), connection after connection completes the handshake with a wrong proof, as fast as it
// can. The ranks' clients must still get in at once: a correct proof is judged the moment it
// arrives (no pause behind the wrong ones), and refused connections are the first evicted.
TEST(StoreAuth, AWrongTokenFloodLocksNoClientOut) {
  TcpStoreServer server(secured());
  std::atomic<bool> stop{false};
  std::vector<std::thread> flood;
  for (int t = 0; t < 3; ++t)
    flood.emplace_back([&] {
      while (!stop) {
        RawConn raw(server.port());
        raw.send(hello_frame());
        if (raw.read_frame(500ms).code == static_cast<uint8_t>(wire::Reply::challenge))
          raw.send(auth_frame());
      }
    });
  Deadline warm = Deadline::after(3s);
  while (server.stats().wrong_token < 50 && !warm.expired()) std::this_thread::sleep_for(5ms);
  const uint64_t before = server.stats().wrong_token;
  for (int i = 0; i < 5; ++i) {
    Stopwatch sw;
    try {
      TcpStore rank("127.0.0.1", server.port(), client(3s));
      rank.set("k" + std::to_string(i), to_bytes("v"));
    } catch (const Error& e) {
      ADD_FAILURE() << "client " << i << " locked out after " << sw.elapsed().count() << " ms: " << e.what();
    }
    // 2.5 s, not 1 s: a loaded 2-core CI host under TSan stretches an honest connect; a client
    // queued behind the flood would still wait out its 3 s connect timeout and fail above.
    EXPECT_LT(sw.elapsed().count(), 2500) << "client " << i << " waited behind the flood";
    std::this_thread::sleep_for(100ms);  // the flood goes on between the clients
  }
  stop = true;
  for (auto& t : flood) t.join();
  EXPECT_GT(server.stats().wrong_token, before + 20) << "the flood did not run during the connects";
  EXPECT_EQ(server.stats().authenticated, 5u);
}

// Another local user floods the store with connections that never authenticate (idle, or a
// hello and nothing more) from `addr`, an address of this host that every rank dials too. The
// slots of unauthenticated connections are counted per local user for every peer on this host:
// the flood crowds out only itself. Needs root (to run the flood as another user).
void another_local_users_flood_crowds_out_only_itself(const char* addr) {
  int ports[2];
  ASSERT_EQ(::pipe(ports), 0);
  // Forked before the server's thread exists: the child runs raw syscalls only.
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(ports[1]);
    int port = 0;
    if (::read(ports[0], &port, sizeof port) != sizeof port) _exit(1);
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) _exit(2);
    int fds[64];
    for (int& f : fds) f = -1;
    const std::string hello = hello_frame();
    for (unsigned n = 0;; ++n) {
      int& f = fds[n % 64];
      if (f >= 0) ::close(f);
      f = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(port));
      inet_pton(AF_INET, addr, &a.sin_addr);
      if (::connect(f, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && n % 2)
        (void)!::send(f, hello.data(), hello.size(), MSG_NOSIGNAL);
      pollfd p{ports[0], POLLIN, 0};
      if (::poll(&p, 1, 0) > 0) _exit(0);  // the parent closed the pipe: stop
    }
  }
  ::close(ports[0]);
  TcpStoreServerOptions o = secured();
  o.bind_addr = addr;
  o.max_pending_per_source = 4;  // few slots: a newcomer sharing them would be evicted at once
  {
    TcpStoreServer server(o);
    const int port = server.port();
    ASSERT_EQ(::write(ports[1], &port, sizeof port), static_cast<ssize_t>(sizeof port));
    Deadline warm = Deadline::after(3s);
    while (server.stats().evicted < 200 && !warm.expired()) std::this_thread::sleep_for(5ms);
    const uint64_t before = server.stats().evicted;
    EXPECT_GE(before, 200u) << "the flood did not start";
    // A slow client of ours, waiting to authenticate among thousands of the flood's connections
    // from the same address, keeps its slot...
    RawConn slow(port, nullptr, addr);
    std::this_thread::sleep_for(300ms);
    EXPECT_FALSE(slow.closed_now()) << "the other user's flood evicted our waiting connection";
    EXPECT_EQ(slow.handshake(kToken).code, static_cast<uint8_t>(wire::Reply::ok));
    // ...and clients get in at once.
    for (int i = 0; i < 5; ++i) {
      Stopwatch sw;
      try {
        TcpStore rank(addr, port, client(3s));
        rank.set("k", to_bytes("v"));
      } catch (const Error& e) {
        ADD_FAILURE() << "client " << i << " locked out after " << sw.elapsed().count()
                      << " ms: " << e.what();
      }
      EXPECT_LT(sw.elapsed().count(), 2500) << "client " << i;  // loaded CI hosts: see above
      std::this_thread::sleep_for(100ms);  // the flood goes on between the clients
    }
    EXPECT_GT(server.stats().evicted, before + 100) << "the flood did not run during the connects";
    EXPECT_EQ(server.stats().authenticated, 6u);
  }
  ::close(ports[1]);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "flood child status " << status;
}

TEST(StoreAuth, AnotherLocalUsersFloodCrowdsOutOnlyItself) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a flood as another user";
  another_local_users_flood_crowds_out_only_itself("127.0.0.1");
}

// The same from the host's own address (not loopback), which gzrun's store host and workers dial
// (MASTER_ADDR) and every local user shares: told apart by user too. Before, only 127/8 peers
// were, and such a flood locked ranks out.
TEST(StoreAuth, AnotherLocalUsersFloodFromTheHostsOwnAddressCrowdsOutOnlyItself) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a flood as another user";
  const bool ran = test::in_netns_with_address(
      "10.213.7.1", [] { another_local_users_flood_crowds_out_only_itself("10.213.7.1"); });
  if (!ran) GTEST_SKIP() << "cannot make a network namespace with an address here";
}

// A store without a token (torchrun-style runs on one node, ranks without GZ_RDZV_TOKEN) listens
// on loopback, where every local user can reach it: it admits only its own user's processes.
// Before, another user's process could read and write the job's keys. Needs root (to be another
// user).
TEST(StoreAuth, TokenlessStoreAdmitsOnlyItsOwnUser) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to connect as another user";
  TcpStoreServerOptions o;
  o.bind_addr = "127.0.0.1";
  TcpStoreServer server(o);
  const int port = server.port();
  // Our own processes: admitted without a token.
  TcpStore mine("127.0.0.1", port, client(3s, ""));
  mine.set("k", to_bytes("v"));
  int verdict[2];
  ASSERT_EQ(::pipe(verdict), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(verdict[0]);
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(3);
    RawConn other(port);
    const wire::Message m = other.handshake("");
    std::string out(1, static_cast<char>(m.code));
    if (!m.parts.empty()) out += m.parts[0];
    (void)!::write(verdict[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(verdict[1]);
  std::string got;
  char buf[512];
  for (ssize_t n; (n = ::read(verdict[0], buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(n));
  ::close(verdict[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(static_cast<uint8_t>(got[0]), static_cast<uint8_t>(wire::Reply::refused))
      << "another local user was admitted to a tokenless store";
  EXPECT_NE(got.find("admits only processes of local user 0"), std::string::npos) << got.substr(1);
  EXPECT_EQ(to_string(mine.get("k", Deadline::after(2s))), "v");
  // allow_insecure opts out: every local user is admitted.
  o.allow_insecure = true;
  TcpStoreServer open(o);
  const pid_t child2 = ::fork();
  ASSERT_GE(child2, 0);
  if (child2 == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(3);
    RawConn other(open.port());
    ::_exit(other.handshake("").code == static_cast<uint8_t>(wire::Reply::ok) ? 0 : 1);
  }
  ::waitpid(child2, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "insecure store refused another user: " << status;
}

TEST(StoreAuth, ThousandPendingSocketsDoNotDelayAuthenticatedRanks) {
  if (!test::raise_fd_limit(4096)) GTEST_SKIP() << "cannot raise the descriptor limit to 4096";
  TcpStoreServerOptions o = secured();
  o.max_pending_auth = 2000;  // all 1,000 stay pending: the loop must cope with them
  o.max_pending_per_source = 2000;
  o.auth_timeout = 60s;
  TcpStoreServer server(o);
  TcpStore rank("127.0.0.1", server.port(), client());
  auto ops_ms = [&](int n) {
    std::vector<double> ms;
    for (int i = 0; i < n; ++i) {
      auto t0 = Clock::now();
      rank.set("k" + std::to_string(i % 8), to_bytes("v"));
      rank.get("k" + std::to_string(i % 8), Deadline::after(2s));
      ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    return ms;
  };
  ops_ms(20);  // warm
  auto before = ops_ms(200);
  std::vector<std::unique_ptr<RawConn>> idle;
  for (int i = 0; i < 1000; ++i) {
    idle.push_back(std::make_unique<RawConn>(server.port()));
    if (i % 3 == 1) idle.back()->send(std::string("\x10\x00", 2));  // half a header, never finished
    if (i % 3 == 2) {  // a hello, then part of the auth, never finished
      idle.back()->send(hello_frame());
      ASSERT_EQ(idle.back()->read_frame(3s).code, static_cast<uint8_t>(wire::Reply::challenge)) << i;
      idle.back()->send(auth_frame().substr(0, 10));
    }
  }
  Deadline d = Deadline::after(10s);
  while (server.stats().pending < 1000 && !d.expired()) std::this_thread::sleep_for(5ms);
  ASSERT_EQ(server.stats().pending, 1000u);
  // With 1,000 silent or stalled sockets pending, a round trip stays a round trip.
  auto during = ops_ms(200);
  // Judged against the same rank's round trips just before, with slack for a loaded CI host
  // (2 cores, TSan): a server that served pending sockets before ready ones, or polled each of
  // them (even 1 ms apiece), would take ~1 s per round trip and still fail this test.
  const double base = before[before.size() / 2];
  const double p50 = during[during.size() / 2], worst = during.back();
  EXPECT_LT(p50, 5 * base + 20.0) << "median set+get with 1,000 pending sockets (" << base << " ms without)";
  EXPECT_LT(worst, 2000.0) << "slowest set+get with 1,000 pending sockets";
  // A new rank authenticates among them promptly too.
  Stopwatch sw;
  TcpStore late("127.0.0.1", server.port(), client());
  EXPECT_LT(sw.elapsed().count(), 3000);
  EXPECT_EQ(server.stats().evicted, 0u);
  std::printf(
      "set+get: median %.2f ms, max %.2f ms without; median %.2f ms, max %.2f ms with 1,000 pending "
      "sockets\n",
      before[before.size() / 2], before.back(), p50, worst);
}

// Connections that stall in the middle of their auth (a hello, then 10 bytes of the proof) cost
// nothing while they wait: each is judged when its bytes arrive, never again until more come.
// Before, the server recomputed every waiting connection's expected proof (an HMAC) on every pass
// of its loop, and 250 of them raised an authenticated rank's set+get from 0.06 ms to 3-4 ms.
TEST(StoreAuth, StalledHandshakesAreNotJudgedAgainWhileTheyWait) {
  TcpStoreServerOptions o = secured();
  o.max_pending_auth = 1000;
  o.max_pending_per_source = 1000;
  o.auth_timeout = 60s;
  TcpStoreServer server(o);
  TcpStore rank("127.0.0.1", server.port(), client());
  auto median_ms = [&](int n) {
    std::vector<double> ms;
    for (int i = 0; i < n; ++i) {
      auto t0 = Clock::now();
      rank.set("k" + std::to_string(i % 8), to_bytes("v"));
      rank.get("k" + std::to_string(i % 8), Deadline::after(2s));
      ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };
  median_ms(20);  // warm
  const double quiet = median_ms(200);
  std::vector<std::unique_ptr<RawConn>> stalled;
  for (int i = 0; i < 250; ++i) {
    stalled.push_back(std::make_unique<RawConn>(server.port()));
    stalled.back()->send(hello_frame());
    ASSERT_EQ(stalled.back()->read_frame(3s).code, static_cast<uint8_t>(wire::Reply::challenge)) << i;
    stalled.back()->send(auth_frame().substr(0, 10));
  }
  // Every partial auth has arrived and been looked at once.
  Deadline settle = Deadline::after(5s);
  uint64_t passes = 0;
  do {
    passes = server.stats().handshake_passes;
    std::this_thread::sleep_for(100ms);
  } while (server.stats().handshake_passes != passes && !settle.expired());
  const double busy = median_ms(200);
  const uint64_t during = server.stats().handshake_passes - passes;
  EXPECT_LT(during, 20u) << "stalled handshakes were judged again " << during << " times while a rank worked";
  EXPECT_EQ(server.stats().pending, 250u);
  EXPECT_LT(busy, 20.0) << "median set+get with 250 stalled handshakes";
  std::printf("set+get median: %.3f ms quiet, %.3f ms with 250 handshakes stalled mid-auth\n", quiet, busy);
}

/// A fake server that hangs up on its first connection without a word (as a loaded store sheds
/// an unauthenticated connection), then answers hello and one request.
class SheddingServer {
 public:
  SheddingServer() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    listen(fd_, 16);
    socklen_t len = sizeof a;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~SheddingServer() {
    thread_.join();
    ::close(fd_);
  }
  int port() const { return port_; }
  int accepted() const { return accepted_; }

 private:
  static bool read_one(int c, wire::Message& m) {
    char hdr[4];
    if (::recv(c, hdr, 4, MSG_WAITALL) != 4) return false;
    std::string frame(hdr, 4);
    frame.resize(4 + wire::read_u32(reinterpret_cast<const uint8_t*>(hdr)));
    if (::recv(c, &frame[4], frame.size() - 4, MSG_WAITALL) != static_cast<ssize_t>(frame.size() - 4))
      return false;
    return wire::decode(reinterpret_cast<const uint8_t*>(frame.data()), frame.size(),
                        wire::Direction::request, wire::Limits{}, m)
               .status == wire::DecodeStatus::ok;
  }
  static bool reply(int c, wire::Reply code, std::vector<std::string> parts = {}) {
    wire::Message m;
    m.code = static_cast<uint8_t>(code);
    m.parts = std::move(parts);
    std::string f = wire::encode(m);
    return ::send(c, f.data(), f.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(f.size());
  }
  // The server's side of the handshake with kToken, then ok to one request.
  static void serve(int c) {
    wire::Message hello, auth, req;
    if (!read_one(c, hello)) return;
    const std::string nonce = wire::random_bytes(wire::kNonceBytes),
                      salt = wire::random_bytes(wire::kSaltBytes);
    const std::string key = wire::handshake_key(kToken, salt);
    reply(c, wire::Reply::challenge,
          {nonce, salt, wire::handshake_proof(key, wire::Prover::server, "", hello.parts[0], nonce), ""});
    if (read_one(c, auth) && reply(c, wire::Reply::ok) && read_one(c, req)) reply(c, wire::Reply::ok);
  }
  void run() {
    for (int i = 0; i < 2; ++i) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 5000) <= 0) return;
      int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      ++accepted_;
      if (i == 0) {
        ::close(c);  // shed
        continue;
      }
      serve(c);
      ::close(c);
    }
  }
  int fd_ = -1;
  int port_ = 0;
  std::atomic<int> accepted_{0};
  std::thread thread_;
};

TEST(StoreAuth, ClientRetriesWhenTheServerShedsItsConnection) {
  SheddingServer server;
  TcpStore rank("127.0.0.1", server.port(), client(5s));
  EXPECT_EQ(server.accepted(), 2);
  rank.set("k", to_bytes("v"));
}

}  // namespace
}  // namespace gz
