// The store's mutual challenge-response (handshake.h) from the client's side: a TcpStore client
// never reveals its token, nor anything derived from it, to a server that has not proved it
// knows the token; nothing either side sends can be replayed on another connection; a server
// proves its name too; and every refusal says clearly whose fault it is.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <thread>

#include "gz/core/error.h"
#include "gz/store/tcp_store.h"
#include "store/handshake.h"
#include "store/impostor.h"
#include "store/raw_conn.h"

namespace gz {
namespace {

using namespace std::chrono_literals;

const std::string kToken = "0123456789abcdef-handshake-token";

TcpStoreOptions client(const std::string& token = kToken, const std::string& name = {}) {
  TcpStoreOptions o;
  o.timeout = 3s;
  o.token = token;
  o.server_name = name;
  return o;
}

using test::frame_of;
using test::Impostor;

/// What an impostor may have seen: exactly one hello frame of our version whose only part is a
/// 32-byte nonce: no token, no proof, nothing derived from the token.
void expect_only_a_hello(const std::vector<std::string>& received) {
  ASSERT_FALSE(received.empty());
  for (const std::string& bytes : received) {
    wire::Message m;
    auto r = wire::decode(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                          wire::Direction::request, wire::Limits{}, m);
    ASSERT_EQ(r.status, wire::DecodeStatus::ok);
    EXPECT_EQ(r.consumed, bytes.size()) << "the client sent more than its hello";
    EXPECT_EQ(m.code, static_cast<uint8_t>(wire::Op::hello));
    EXPECT_EQ(m.num, wire::kProtocolVersion);
    ASSERT_EQ(m.parts.size(), 1u);
    EXPECT_EQ(m.parts[0].size(), wire::kNonceBytes);
    EXPECT_EQ(bytes.find(kToken), std::string::npos) << "the token reached the impostor";
  }
}

void expect_error(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    FAIL() << "connected; expected an error saying '" << part << "'";
  } catch (const TimeoutError& e) {
    FAIL() << "a timeout instead of a clear error: " << e.what();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(StoreHandshake, ImpostorWithAMadeUpProofLearnsNothing) {
  Impostor impostor([](const wire::Message& hello) {
    return frame_of(wire::Reply::challenge,
                    {wire::random_bytes(32), wire::random_bytes(16), wire::random_bytes(32), ""});
  });
  Stopwatch sw;
  expect_error([&] { TcpStore("127.0.0.1", impostor.port(), client()); }, "did not prove that it knows");
  EXPECT_LT(sw.elapsed().count(), 2000) << "a failed proof must end the connect at once";
  expect_only_a_hello(impostor.received());
}

TEST(StoreHandshake, ImpostorWithoutATokenOrSpeakingAnotherProtocolLearnsNothing) {
  Impostor open([](const wire::Message&) {
    return frame_of(wire::Reply::challenge, {wire::random_bytes(32), wire::random_bytes(16), "", ""});
  });
  expect_error([&] { TcpStore("127.0.0.1", open.port(), client()); }, "runs without a rendezvous token");
  expect_only_a_hello(open.received());
  // An old server would answer "ok" to any hello: that is no challenge.
  Impostor old([](const wire::Message&) { return frame_of(wire::Reply::ok, {}); });
  expect_error([&] { TcpStore("127.0.0.1", old.port(), client()); }, "unexpected ok reply to hello");
  expect_only_a_hello(old.received());
  // Some other program's bytes.
  Impostor other([](const wire::Message&) { return std::string("HTTP/1.1 400 Bad Request\r\n\r\n"); });
  expect_error([&] { TcpStore("127.0.0.1", other.port(), client()); }, "not the gz store protocol");
  expect_only_a_hello(other.received());
}

// A man in the middle records one real session; nothing of it works on another connection.
TEST(StoreHandshake, NothingOfARecordedSessionCanBeReplayed) {
  TcpStoreServerOptions so;
  so.token = kToken;
  TcpStoreServer server(so);
  // The real session, by hand: hello, challenge, auth, ok.
  test::RawConn real(server.port());
  const std::string nonce = wire::random_bytes(wire::kNonceBytes);
  real.send(test::hello_frame(nonce));
  wire::Message ch = real.read_frame(3s);
  ASSERT_EQ(ch.code, static_cast<uint8_t>(wire::Reply::challenge));
  const std::string key = wire::handshake_key(kToken, ch.parts[1]);
  const std::string client_proof =
      wire::handshake_proof(key, wire::Prover::client, ch.parts[3], nonce, ch.parts[0]);
  real.send(test::auth_frame(client_proof));
  ASSERT_EQ(real.read_frame(3s).code, static_cast<uint8_t>(wire::Reply::ok));
  // (a) The recorded challenge, replayed to a new client by an impostor: the client's nonce
  // differs, so the recorded server proof does not prove anything; the client stops.
  Impostor replay([&](const wire::Message&) { return wire::encode(ch); });
  expect_error([&] { TcpStore("127.0.0.1", replay.port(), client()); }, "did not prove that it knows");
  expect_only_a_hello(replay.received());
  // (b) The recorded client proof, replayed to the real server on a new connection (even with
  // the recorded nonce): the server's nonce differs, so it is refused.
  test::RawConn again(server.port());
  again.send(test::hello_frame(nonce) + test::auth_frame(client_proof));
  EXPECT_EQ(again.read_frame(3s).code, static_cast<uint8_t>(wire::Reply::challenge));
  EXPECT_EQ(again.read_frame(3s).code, static_cast<uint8_t>(wire::Reply::refused));
  // (c) The server proof, sent back as a client proof (reflection): refused.
  test::RawConn reflect(server.port());
  reflect.send(test::hello_frame(nonce));
  wire::Message ch2 = reflect.read_frame(3s);
  ASSERT_EQ(ch2.code, static_cast<uint8_t>(wire::Reply::challenge));
  reflect.send(test::auth_frame(ch2.parts[2]));
  EXPECT_EQ(reflect.read_frame(3s).code, static_cast<uint8_t>(wire::Reply::refused));
  EXPECT_EQ(server.stats().authenticated, 1u);
  EXPECT_EQ(server.stats().wrong_token, 2u);
}

TEST(StoreHandshake, TheServerProvesItsName) {
  TcpStoreServerOptions so;
  so.token = kToken;
  so.name = "gzrun";
  TcpStoreServer server(so);
  TcpStore any("127.0.0.1", server.port(), client());
  TcpStore named("127.0.0.1", server.port(), client(kToken, "gzrun"));
  named.set("k", to_bytes("v"));
  expect_error([&] { TcpStore("127.0.0.1", server.port(), client(kToken, "workers")); },
               "is 'gzrun', not 'workers'");
  TcpStoreServerOptions other = so;
  other.name = "workers";
  TcpStoreServer workers(other);
  expect_error([&] { TcpStore("127.0.0.1", workers.port(), client(kToken, "gzrun")); },
               "is 'workers', not 'gzrun'");
  // The name is part of the proof: a relay that passes the client's hello to the "workers" store
  // and renames its challenge to "gzrun" fails the proof check.
  Impostor relay([&](const wire::Message& hello) {
    test::RawConn up(workers.port());
    up.send(wire::encode(hello));
    wire::Message ch = up.read_frame(3s);
    if (ch.parts.size() == 4) ch.parts[3] = "gzrun";
    return wire::encode(ch);
  });
  expect_error([&] { TcpStore("127.0.0.1", relay.port(), client(kToken, "gzrun")); },
               "did not prove that it knows");
  expect_only_a_hello(relay.received());
  EXPECT_THROW(
      [&] {
        TcpStoreServerOptions o;
        o.name = std::string(wire::kMaxServerNameBytes + 1, 'n');
        TcpStoreServer s(o);
      }(),
      InvalidArgument);
}

TEST(StoreHandshake, WhoseFaultEachRefusalIs) {
  TcpStoreServerOptions secured;
  secured.token = kToken;
  TcpStoreServer with_token(secured);
  TcpStoreServer without(TcpStoreServerOptions{});
  // No token at the client: it sees the server has one and says both possible causes (its own
  // missing token, or the port taken by another job's store), sending nothing.
  expect_error([&] { TcpStore("127.0.0.1", with_token.port(), client("")); },
               "has a rendezvous token and this client has none");
  EXPECT_EQ(with_token.stats().wrong_token, 0u);
  // A token at the client, none at the server: the client refuses the server.
  expect_error([&] { TcpStore("127.0.0.1", without.port(), client()); }, "runs without a rendezvous token");
  // Neither has one: loopback without authentication works as before.
  TcpStore open("127.0.0.1", without.port(), client(""));
  open.set("k", to_bytes("v"));
  // A client of protocol version 1 (which sent its token in the hello) is told the version.
  test::RawConn v1(with_token.port());
  wire::Message old;
  old.code = static_cast<uint8_t>(wire::Op::hello);
  old.num = 1;
  old.parts = {std::string(wire::kNonceBytes, 't')};
  v1.send(wire::encode(old));
  wire::Message rep = v1.read_frame(3s);
  ASSERT_EQ(rep.code, static_cast<uint8_t>(wire::Reply::refused));
  EXPECT_NE(rep.parts.at(0).find("protocol version 1 not supported (server speaks 2)"), std::string::npos);
}

}  // namespace
}  // namespace gz
