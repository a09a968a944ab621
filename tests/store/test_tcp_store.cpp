// TcpStore server/client: shutdown, tokens, connect retry, client deadlines, limits and
// malformed input from raw sockets.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "gz/core/error.h"
#include "gz/store/tcp_store.h"
#include "store/raw_conn.h"
#include "store/wire.h"

namespace gz {
namespace {

using namespace std::chrono_literals;

TcpStoreServerOptions local(const std::string& token = {}) {
  TcpStoreServerOptions o;
  o.bind_addr = "127.0.0.1";
  o.token = token;
  return o;
}

TcpStoreOptions client_opts(Duration timeout = 5s, const std::string& token = {}) {
  TcpStoreOptions o;
  o.timeout = timeout;
  o.token = token;
  return o;
}

using test::RawConn;

/// The whole handshake with a server without a token (its auth accepts any proof): hello and an
/// empty auth, pipelined.
std::string hello() { return test::hello_frame() + test::auth_frame(""); }

/// The server still answers a well-behaved client.
void expect_serves(int port) {
  TcpStore c("127.0.0.1", port, client_opts(3s));
  c.set("alive", to_bytes("yes"));
  EXPECT_EQ(to_string(c.get("alive", Deadline::after(1s))), "yes");
}

TEST(TcpStore, PortZeroPicksAFreePort) {
  TcpStoreServer a(local()), b(local());
  EXPECT_GT(a.port(), 0);
  EXPECT_GT(b.port(), 0);
  EXPECT_NE(a.port(), b.port());
}

TEST(TcpStore, Ipv6Loopback) {
  TcpStoreServerOptions o;
  o.bind_addr = "::1";
  std::unique_ptr<TcpStoreServer> server;
  try {
    server = std::make_unique<TcpStoreServer>(o);
  } catch (const SystemError& e) {
    GTEST_SKIP() << "no IPv6 loopback here: " << e.what();
  }
  TcpStore c("::1", server->port(), client_opts(2s));
  c.set("k", to_bytes("v6"));
  EXPECT_EQ(to_string(c.get("k", Deadline::after(1s))), "v6");
}

TEST(TcpStore, BindingABusyPortIsASystemError) {
  TcpStoreServer a(local());
  TcpStoreServerOptions o = local();
  o.port = a.port();
  try {
    TcpStoreServer b(o);
    FAIL() << "second server bound the same port";
  } catch (const SystemError& e) {
    EXPECT_EQ(e.code(), EADDRINUSE);
    EXPECT_NE(std::string(e.what()).find(std::to_string(a.port())), std::string::npos) << e.what();
  }
}

TEST(TcpStore, ServerStopWakesABlockedGetPromptly) {
  auto server = std::make_unique<TcpStoreServer>(local());
  TcpStore c("127.0.0.1", server->port(), client_opts());
  std::thread stopper([&] {
    std::this_thread::sleep_for(200ms);
    server->stop();
  });
  Stopwatch sw;
  try {
    c.get("never", Deadline::after(30s));
    FAIL() << "get returned after the server stopped";
  } catch (const PeerError& e) {
    EXPECT_NE(std::string(e.what()).find("never"), std::string::npos) << e.what();
  }
  EXPECT_LT(sw.elapsed().count(), 2000);
  stopper.join();
  // Later requests fail within their deadline too (nothing listens any more).
  c.set_timeout(300ms);
  sw.reset();
  EXPECT_THROW(c.set("k", to_bytes("v")), TimeoutError);
  EXPECT_LT(sw.elapsed().count(), 1500);
}

TEST(TcpStore, ServerDestructionWakesManyWaiters) {
  auto server = std::make_unique<TcpStoreServer>(local());
  int port = server->port();
  std::vector<std::thread> ts;
  std::atomic<int> peer_errors{0};
  for (int i = 0; i < 6; ++i)
    ts.emplace_back([&] {
      try {
        TcpStore c("127.0.0.1", port, client_opts());
        c.wait({"k"}, Deadline::after(30s));
      } catch (const PeerError&) {
        ++peer_errors;
      } catch (...) {
      }
    });
  std::this_thread::sleep_for(300ms);
  Stopwatch sw;
  server.reset();
  for (auto& t : ts) t.join();
  EXPECT_EQ(peer_errors.load(), 6);
  EXPECT_LT(sw.elapsed().count(), 2000);
}

TEST(TcpStore, TokenAcceptedAndRefused) {
  TcpStoreServer server(local("s3cret"));
  TcpStore good("127.0.0.1", server.port(), client_opts(2s, "s3cret"));
  good.set("k", to_bytes("v"));
  for (std::string bad : {"", "s3creT", "s3cret-and-more"}) {
    try {
      TcpStore c("127.0.0.1", server.port(), client_opts(2s, bad));
      FAIL() << "token '" << bad << "' was accepted";
    } catch (const TimeoutError& e) {
      FAIL() << "refusal must not look like a timeout: " << e.what();
    } catch (const Error& e) {
      // Without a token the client sees the server has one and stops (the port may be another
      // job's); with another one the client refuses the server (it cannot prove the client's
      // token), before sending anything derived from it.
      const std::string why = bad.empty() ? "has a rendezvous token and this client has none"
                                          : "did not prove that it knows the rendezvous token";
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(to_string(good.get("k", Deadline::after(1s))), "v");
  EXPECT_EQ(server.stats().wrong_token, 0u);  // no client reached the auth with a wrong proof
}

TEST(TcpStore, RawClientWithoutHelloIsDisconnected) {
  TcpStoreServer server(local("tok"));
  RawConn raw(server.port());
  wire::Message m;
  m.code = static_cast<uint8_t>(wire::Op::num_keys);
  raw.send(wire::encode(m));
  raw.read_until_close(2s);
  EXPECT_TRUE(raw.closed());
}

TEST(TcpStore, ConnectRetriesUntilTheServerStarts) {
  int port;
  {
    TcpStoreServer probe(local());
    port = probe.port();
  }
  std::unique_ptr<TcpStoreServer> server;
  // Started before the starter thread: its 300 ms sleep begins after this, so the connect below
  // ends at least 300 ms later even if this thread is descheduled once the thread is created.
  Stopwatch sw;
  std::thread starter([&] {
    std::this_thread::sleep_for(300ms);
    TcpStoreServerOptions o = local();
    o.port = port;
    server = std::make_unique<TcpStoreServer>(o);
  });
  TcpStore c("127.0.0.1", port, client_opts(5s));
  EXPECT_GE(sw.elapsed().count(), 200);
  c.set("k", to_bytes("v"));
  starter.join();
}

TEST(TcpStore, ConnectTimesOutWhenNobodyListens) {
  int port;
  {
    TcpStoreServer probe(local());
    port = probe.port();
  }
  Stopwatch sw;
  try {
    TcpStore c("127.0.0.1", port, client_opts(300ms));
    FAIL() << "connected to nothing";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(port)), std::string::npos) << e.what();
  }
  EXPECT_LT(sw.elapsed().count(), 1500);
}

/// A fake server that accepts, answers hello, then never answers anything else.
class StuckServer {
 public:
  StuckServer() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
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
  ~StuckServer() {
    stop_ = true;
    thread_.join();
    for (int c : conns_) ::close(c);
    ::close(fd_);
  }
  int port() const { return port_; }
  int accepted() const { return accepted_.load(); }

 private:
  void run() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) continue;
      conns_.push_back(c);
      ++accepted_;
      // The handshake of a server without a token: hello (a nonce), challenge (no proof), auth
      // (an empty proof from a client without a token), ok.
      auto read_exactly = [c](size_t n) {
        std::string b(n, '\0');
        size_t got = 0;
        while (got < n) {
          ssize_t k = ::recv(c, &b[got], n - got, 0);
          if (k <= 0) break;
          got += static_cast<size_t>(k);
        }
      };
      auto reply = [c](wire::Reply code, std::vector<std::string> parts) {
        wire::Message m;
        m.code = static_cast<uint8_t>(code);
        m.parts = std::move(parts);
        std::string f = wire::encode(m);
        (void)!::send(c, f.data(), f.size(), MSG_NOSIGNAL);
      };
      read_exactly(wire::kMaxHelloFrameBytes);
      reply(wire::Reply::challenge,
            {std::string(wire::kNonceBytes, 's'), std::string(wire::kSaltBytes, 'x'), "", ""});
      read_exactly(wire::kHeaderBytes + wire::kMinBodyBytes + 4);
      reply(wire::Reply::ok, {});
    }
  }
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0};
  std::vector<int> conns_;
  std::thread thread_;
};

TEST(TcpStore, UnresolvableHostSaysSo) {
  try {
    TcpStore c("no-such-host.invalid", 29500, client_opts(200ms));
    FAIL() << "connected to an unresolvable host";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot resolve"), std::string::npos) << e.what();
  }
}

TEST(TcpStore, ClientGivesUpOnAStuckServerAndReconnects) {
  StuckServer stuck;
  TcpStore c("127.0.0.1", stuck.port(), client_opts(2s));
  EXPECT_EQ(stuck.accepted(), 1);
  Stopwatch sw;
  EXPECT_THROW(c.get("k", Deadline::after(200ms)), TimeoutError);
  EXPECT_LT(sw.elapsed().count(), 1500);  // deadline + a short grace for the server's own answer
  // Non-blocking requests use the store's timeout.
  c.set_timeout(200ms);
  sw.reset();
  EXPECT_THROW(c.set("k", to_bytes("v")), TimeoutError);
  EXPECT_LT(sw.elapsed().count(), 1500);
  // The connection was out of step after the first timeout: the second request reconnected.
  EXPECT_EQ(stuck.accepted(), 2);
}

TEST(TcpStore, ServerSideTimeoutKeepsTheConnection) {
  TcpStoreServer server(local());
  TcpStore c("127.0.0.1", server.port(), client_opts(2s));
  for (int i = 0; i < 3; ++i) EXPECT_THROW(c.wait({"a", "b"}, Deadline::after(50ms)), TimeoutError);
  c.set("a", to_bytes("1"));
  EXPECT_TRUE(c.check({"a"}));
}

TEST(TcpStore, OversizedValueIsRejectedAndTheClientRecovers) {
  TcpStoreServerOptions o = local();
  o.max_value_bytes = 1024;
  TcpStoreServer server(o);
  TcpStore c("127.0.0.1", server.port(), client_opts(2s));
  Bytes big((2u << 20), 1);  // beyond max_value_bytes + slack
  EXPECT_THROW(c.set("big", big), InvalidArgument);
  c.set("small", to_bytes("fine"));
  EXPECT_EQ(to_string(c.get("small", Deadline::after(1s))), "fine");
  EXPECT_FALSE(c.check({"big"}));
}

TEST(TcpStore, StoreFullIsAClearError) {
  TcpStoreServerOptions o = local();
  o.max_total_bytes = 4096;
  TcpStoreServer server(o);
  TcpStore c("127.0.0.1", server.port(), client_opts(2s));
  c.set("a", Bytes(3000, 1));
  try {
    c.set("b", Bytes(3000, 2));
    FAIL() << "store grew past max_total_bytes";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("store full"), std::string::npos) << e.what();
  }
  c.delete_key("a");
  c.set("b", Bytes(3000, 2));  // room again
  EXPECT_EQ(c.num_keys(), 1);
}

TEST(TcpStore, MaxClientsRefusesExtraConnections) {
  TcpStoreServerOptions o = local();
  o.max_clients = 2;
  TcpStoreServer server(o);
  TcpStore a("127.0.0.1", server.port(), client_opts(2s));
  TcpStore b("127.0.0.1", server.port(), client_opts(2s));
  try {
    TcpStore c("127.0.0.1", server.port(), client_opts(1s));
    FAIL() << "third client accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("too many clients"), std::string::npos) << e.what();
  }
  a.set("k", to_bytes("v"));
  EXPECT_TRUE(b.check({"k"}));
}

TEST(TcpStore, MalformedInputNeverKillsTheServer) {
  TcpStoreServerOptions o = local();
  o.max_value_bytes = 4096;
  TcpStoreServer server(o);
  std::vector<std::string> attacks = {
      std::string(1000, '\xff'),                                                 // garbage, huge length
      std::string("\x00\x00\x00\x00", 4),                                        // zero-length body
      std::string("\x05\x00\x00\x00\x01\x02", 6),                                // body shorter than a header
      hello() + std::string("\xff\xff\xff\x7f", 4),                              // oversized announced length
      hello() + std::string("\x0d\x00\x00\x00\x63", 5) + std::string(12, '\0'),  // unknown op 99
  };
  // Right size but a part length overrunning the frame.
  {
    wire::Message m;
    m.code = static_cast<uint8_t>(wire::Op::set);
    m.parts = {"key", "value"};
    std::string f = wire::encode(m);
    f[4 + 13] = '\x7f';  // first part length low byte
    attacks.push_back(hello() + f);
    // Part count far beyond what fits.
    std::string g = wire::encode(m);
    g[4 + 9] = '\xff';
    g[4 + 10] = '\xff';
    attacks.push_back(hello() + g);
    // Wrong arity: set with one part.
    m.parts = {"only-key"};
    attacks.push_back(hello() + wire::encode(m));
  }
  for (auto& bytes : attacks) {
    RawConn raw(server.port());
    raw.send(bytes);
    raw.read_until_close(2s);
    EXPECT_TRUE(raw.closed()) << "server kept a connection that sent garbage";
    expect_serves(server.port());
  }
  // A truncated frame followed by a hang-up.
  {
    RawConn raw(server.port());
    wire::Message m;
    m.code = static_cast<uint8_t>(wire::Op::set);
    m.parts = {"k", std::string(100, 'v')};
    std::string f = wire::encode(m);
    raw.send(hello() + f.substr(0, f.size() / 2));
  }
  expect_serves(server.port());
  // Many idle half-open connections do not stop service either.
  std::vector<std::unique_ptr<RawConn>> idle;
  for (int i = 0; i < 50; ++i) {
    idle.push_back(std::make_unique<RawConn>(server.port()));
    idle.back()->send(std::string("\x10\x00", 2));
  }
  expect_serves(server.port());
}

TEST(TcpStore, FloodOfPipelinedRequestsIsBounded) {
  TcpStoreServerOptions o = local();
  o.max_value_bytes = 1024;
  TcpStoreServer server(o);
  RawConn raw(server.port());
  raw.send(hello());
  wire::Message m;
  m.code = static_cast<uint8_t>(wire::Op::get);
  m.num = 60000;
  m.parts = {"blocks-forever"};
  std::string frame = wire::encode(m);
  std::string flood;
  while (flood.size() < (4u << 20)) flood += frame;
  std::thread sender([&] { raw.send(flood); });
  raw.read_until_close(5s);
  EXPECT_TRUE(raw.closed()) << "server buffered a flood without bound";
  sender.join();
  expect_serves(server.port());
}

}  // namespace
}  // namespace gz
