// The pieces of the store's authentication, alone: judging the handshake (handshake.h), slots and
// gates of unauthenticated connections (admission.h), the abuse log, and tokens (rdzv_auth.h).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>

#include "gz/core/error.h"
#include "gz/store/rdzv_auth.h"
#include "store/admission.h"
#include "store/handshake.h"
#include "store/peer_identity.h"
#include "store/raw_conn.h"

namespace gz {
namespace {

using namespace std::chrono_literals;
using test::auth_frame;
using test::hello_frame;
using wire::HandshakeVerdict;

const uint8_t* u8(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }
wire::HandshakeResult hello(const std::string& bytes) { return wire::judge_hello(u8(bytes), bytes.size()); }
wire::HandshakeResult auth(const std::string& bytes, const std::string& expected = std::string(32, 'e')) {
  return wire::judge_auth(u8(bytes), bytes.size(), expected);
}

TEST(Handshake, VerdictsOfCompleteHellos) {
  const std::string nonce(wire::kNonceBytes, 'c');
  auto h = hello(hello_frame(nonce));
  EXPECT_EQ(h.verdict, HandshakeVerdict::accept);
  EXPECT_EQ(h.consumed, hello_frame(nonce).size());
  EXPECT_EQ(h.nonce, nonce);
  EXPECT_EQ(hello(hello_frame(nonce, 1)).verdict,
            HandshakeVerdict::wrong_protocol);  // version 1 sent the token
  EXPECT_EQ(hello(hello_frame("short")).verdict, HandshakeVerdict::malformed);
  EXPECT_EQ(hello(hello_frame("short")).consumed, 0u);
  // An auth before any hello is out of turn.
  EXPECT_EQ(hello(auth_frame()).verdict, HandshakeVerdict::unexpected);
}

TEST(Handshake, VerdictsOfCompleteAuths) {
  const std::string expected(wire::kProofBytes, 'e');
  EXPECT_EQ(auth(auth_frame(expected)).verdict, HandshakeVerdict::accept);
  EXPECT_EQ(auth(auth_frame(expected)).consumed, auth_frame(expected).size());
  EXPECT_EQ(auth(auth_frame(std::string(32, 'x'))).verdict, HandshakeVerdict::wrong_token);
  EXPECT_EQ(auth(auth_frame("")).verdict, HandshakeVerdict::wrong_token);
  EXPECT_NE(auth(auth_frame("")).detail.find("no rendezvous token"), std::string::npos);
  // A server without a token takes any well-formed auth.
  EXPECT_EQ(auth(auth_frame("anything"), "").verdict, HandshakeVerdict::accept);
  // A second hello is out of turn; the refusal text never repeats a proof.
  EXPECT_EQ(auth(hello_frame()).verdict, HandshakeVerdict::unexpected);
  EXPECT_EQ(auth(auth_frame("guess-123")).detail.find("guess-123"), std::string::npos);
}

TEST(Handshake, IncompleteMessagesNeedMoreUntilTheBudget) {
  std::string h = hello_frame();
  EXPECT_EQ(h.size(), wire::kMaxHelloFrameBytes);
  for (size_t n = 0; n < h.size(); ++n)
    EXPECT_EQ(hello(h.substr(0, n)).verdict, HandshakeVerdict::need_more) << n;
  std::string a = auth_frame(std::string(wire::kProofBytes, 'e'));
  EXPECT_EQ(a.size(), wire::kMaxAuthFrameBytes);
  for (size_t n = 0; n < a.size(); ++n)
    EXPECT_EQ(auth(a.substr(0, n)).verdict, HandshakeVerdict::need_more) << n;
  // One byte more than a message may have is refused from the header.
  EXPECT_EQ(hello(hello_frame(std::string(wire::kNonceBytes + 1, 'n'))).verdict, HandshakeVerdict::oversized);
  EXPECT_EQ(auth(auth_frame(std::string(wire::kProofBytes + 1, 'p'))).verdict, HandshakeVerdict::oversized);
}

TEST(Handshake, RequestsBeforeAuthenticationAreRefusedWhateverTheirShape) {
  for (auto op : {wire::Op::get, wire::Op::set, wire::Op::add, wire::Op::append, wire::Op::wait,
                  wire::Op::check, wire::Op::compare_set, wire::Op::delete_key, wire::Op::num_keys}) {
    wire::Message m;
    m.code = static_cast<uint8_t>(op);
    size_t arity = op == wire::Op::num_keys                          ? 0
                   : op == wire::Op::compare_set                     ? 3
                   : (op == wire::Op::set || op == wire::Op::append) ? 2
                                                                     : 1;
    for (size_t i = 0; i < arity; ++i) m.parts.push_back("k");
    for (const auto& r : {hello(wire::encode(m)), auth(wire::encode(m))})
      EXPECT_EQ(r.verdict, HandshakeVerdict::unexpected) << wire::code_name(m.code) << ": " << r.detail;
  }
  // A large set before authentication is judged on its header alone.
  wire::Message big;
  big.code = static_cast<uint8_t>(wire::Op::set);
  big.parts = {"k", std::string(4096, 'v')};
  EXPECT_EQ(hello(wire::encode(big).substr(0, 4)).verdict, HandshakeVerdict::oversized);
  EXPECT_EQ(auth(wire::encode(big).substr(0, 4)).verdict, HandshakeVerdict::oversized);
}

TEST(Handshake, OversizedIsDecidedFromTheHeaderAlone) {
  // 4 bytes announcing 60 MB: refused before a single body byte arrives.
  std::string header("\x00\x00\x00\x04", 4);
  auto r = hello(header);
  EXPECT_EQ(r.verdict, HandshakeVerdict::oversized);
  EXPECT_NE(r.detail.find("67108864"), std::string::npos) << r.detail;
}

TEST(Handshake, NeverNeedsMoreThanTheBudget) {
  // Whatever the bytes, a full budget gets a final verdict (the server never buffers more).
  std::srand(7);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string junk(wire::kMaxHelloFrameBytes + static_cast<size_t>(std::rand() % 64), '\0');
    for (auto& c : junk) c = static_cast<char>(std::rand());
    if (trial % 3 == 0) {  // a plausible length prefix
      uint32_t len = static_cast<uint32_t>(std::rand() % 400);
      for (int i = 0; i < 4; ++i) junk[static_cast<size_t>(i)] = static_cast<char>((len >> (8 * i)) & 0xff);
    }
    EXPECT_NE(hello(junk).verdict, HandshakeVerdict::need_more) << trial;
    EXPECT_NE(auth(junk).verdict, HandshakeVerdict::need_more) << trial;
  }
}

TEST(Handshake, ProofsBindSideNameAndBothNonces) {
  const std::string key = wire::handshake_key("0123456789abcdef-token", std::string(wire::kSaltBytes, 's'));
  EXPECT_EQ(key.size(), 32u);
  // The same (token, salt) gives the same key; another salt or token another one.
  EXPECT_EQ(wire::handshake_key("0123456789abcdef-token", std::string(wire::kSaltBytes, 's')), key);
  EXPECT_NE(wire::handshake_key("0123456789abcdef-token", std::string(wire::kSaltBytes, 't')), key);
  EXPECT_NE(wire::handshake_key("0123456789abcdef-tokeN", std::string(wire::kSaltBytes, 's')), key);
  const std::string cn(32, 'c'), sn(32, 's');
  const std::string p = wire::handshake_proof(key, wire::Prover::client, "gzrun", cn, sn);
  EXPECT_EQ(p.size(), wire::kProofBytes);
  EXPECT_TRUE(wire::proofs_equal(p, wire::handshake_proof(key, wire::Prover::client, "gzrun", cn, sn)));
  // Any change of side, name or nonce changes the proof: none can be replayed elsewhere.
  for (const auto& other :
       {wire::handshake_proof(key, wire::Prover::server, "gzrun", cn, sn),
        wire::handshake_proof(key, wire::Prover::client, "gzrun2", cn, sn),
        wire::handshake_proof(key, wire::Prover::client, "gzrun", std::string(32, 'C'), sn),
        wire::handshake_proof(key, wire::Prover::client, "gzrun", cn, std::string(32, 'S'))})
    EXPECT_FALSE(wire::proofs_equal(p, other));
  // Nothing of the token shows in the key or the proof.
  EXPECT_EQ(key.find("token"), std::string::npos);
  EXPECT_EQ(p.find("token"), std::string::npos);
  EXPECT_NE(wire::random_bytes(32), wire::random_bytes(32));
}

TEST(Admission, PerSourceLimitEvictsThatSourcesOldest) {
  wire::AdmissionLimits l;
  l.max_pending = 100;
  l.max_pending_per_source = 3;
  wire::Admission a(l);
  for (uint64_t id = 1; id <= 3; ++id) EXPECT_TRUE(a.admit(id, "10.0.0.9").empty());
  EXPECT_TRUE(a.admit(10, "10.0.0.1").empty());
  EXPECT_EQ(a.admit(4, "10.0.0.9"), std::vector<uint64_t>{1});
  EXPECT_EQ(a.admit(5, "10.0.0.9"), std::vector<uint64_t>{2});
  EXPECT_EQ(a.pending_from("10.0.0.9"), 3u);
  EXPECT_EQ(a.pending_from("10.0.0.1"), 1u);
  // An authenticated connection leaves the books: it is never a candidate again.
  a.release(3, "10.0.0.9");
  EXPECT_TRUE(a.admit(6, "10.0.0.9").empty());
  EXPECT_EQ(a.admit(7, "10.0.0.9"), std::vector<uint64_t>{4});
  EXPECT_EQ(a.pending(), 4u);
}

TEST(Admission, TotalLimitTakesFromTheBiggestSource) {
  wire::AdmissionLimits l;
  l.max_pending = 4;
  l.max_pending_per_source = 10;
  wire::Admission a(l);
  EXPECT_TRUE(a.admit(1, "honest").empty());
  for (uint64_t id = 2; id <= 4; ++id) EXPECT_TRUE(a.admit(id, "flood").empty());
  // Full: the flood gives up its oldest, the honest client (older still) keeps its slot.
  EXPECT_EQ(a.admit(5, "flood"), std::vector<uint64_t>{2});
  EXPECT_EQ(a.admit(6, "other"), std::vector<uint64_t>{3});
  EXPECT_EQ(a.pending_from("honest"), 1u);
  // Equal shares: the longest waiting goes.
  wire::Admission b(l);
  for (uint64_t id = 1; id <= 4; ++id) b.admit(id, "s" + std::to_string(id));
  EXPECT_EQ(b.admit(5, "s5"), std::vector<uint64_t>{1});
}

TEST(Admission, RefusedConnectionsGoFirst) {
  wire::AdmissionLimits l;
  l.max_pending = 4;
  l.max_pending_per_source = 10;
  wire::Admission a(l);
  EXPECT_TRUE(a.admit(1, "honest").empty());
  for (uint64_t id = 2; id <= 4; ++id) EXPECT_TRUE(a.admit(id, "flood").empty());
  // The flood's connections are refused as they come: they linger only to deliver the reason,
  // are no longer counted against their source, and are the first to go.
  a.refused(2, "flood");
  a.refused(3, "flood");
  EXPECT_EQ(a.pending_from("flood"), 1u);
  EXPECT_EQ(a.refused_count(), 2u);
  EXPECT_EQ(a.admit(5, "flood"), std::vector<uint64_t>{2});
  EXPECT_EQ(a.admit(6, "flood"), std::vector<uint64_t>{3});
  // Nothing refused left: now the source waiting with the most gives up its oldest, and the
  // honest client (the oldest of all) keeps its slot.
  EXPECT_EQ(a.admit(7, "flood"), std::vector<uint64_t>{4});
  EXPECT_EQ(a.pending_from("honest"), 1u);
  // A refused connection that closes by itself frees its slot; unknown ids are ignored.
  a.refused(5, "flood");
  a.release(5, "flood");
  a.release(99, "nobody");
  EXPECT_EQ(a.refused_count(), 0u);
  EXPECT_EQ(a.pending(), 3u);
  a.release(1, "honest");
  a.forget_idle();
  EXPECT_EQ(a.sources(), 1u);
}

// A connected loopback pair: the server's end and both addresses, as accept() sees them.
struct LoopbackPair {
  int listener = -1, client = -1, server = -1;
  sockaddr_storage peer{}, local{};
  LoopbackPair() {
    listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    ::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(listener, 4);
    ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len);
    client = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (::connect(client, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) ADD_FAILURE() << "connect";
    len = sizeof peer;
    server = ::accept(listener, reinterpret_cast<sockaddr*>(&peer), &len);
    len = sizeof local;
    ::getsockname(server, reinterpret_cast<sockaddr*>(&local), &len);
  }
  ~LoopbackPair() {
    for (int fd : {listener, client, server}) ::close(fd);
  }
};

TEST(PeerIdentity, LocalPeersAreTheirUsers) {
  LoopbackPair c;
  wire::PeerIdentity id;
  EXPECT_EQ(id.source(c.peer, c.local), "local user " + std::to_string(::geteuid()));
  EXPECT_FALSE(id.unavailable());
  // A peer that is no socket of this host: its address.
  sockaddr_storage remote = c.peer;
  inet_pton(AF_INET, "192.0.2.77", &reinterpret_cast<sockaddr_in*>(&remote)->sin_addr);
  EXPECT_EQ(id.source(remote, c.local), "192.0.2.77");
}

// Without sock_diag for the sockets' protocol (here: asking the UDP table about TCP sockets)
// every lookup fails, and may make the kernel try to load a module: after the first failed probe
// none is made until the probe is due again. Before, every accepted connection asked.
TEST(PeerIdentity, NoLookupsOnceSockDiagIsKnownMissing) {
  LoopbackPair c;
  wire::PeerIdentity id(IPPROTO_UDP);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(id.source(c.peer, c.local), "loopback, user unknown");
  EXPECT_TRUE(id.unavailable());
  EXPECT_EQ(id.queries(), 1u);
}

TEST(AbuseLog, FirstRefusalPerSourceThenSummaries) {
  wire::AbuseLog log(Duration(1000));
  auto t = Clock::now();
  using K = wire::AbuseLog::Kind;
  std::string first = log.note(K::wrong_token, "10.0.0.4", "wrong rendezvous token", t);
  EXPECT_NE(first.find("10.0.0.4"), std::string::npos) << first;
  for (int i = 0; i < 100; ++i)
    EXPECT_EQ(log.note(K::wrong_token, "10.0.0.4", "wrong rendezvous token", t), "");
  for (int i = 0; i < 50; ++i) EXPECT_EQ(log.note(K::evicted, "10.0.0.5", "", t), "");
  EXPECT_EQ(log.summary(t + Duration(10)), "");  // not due yet
  std::string s = log.summary(t + Duration(2000));
  EXPECT_NE(s.find("101 wrong token"), std::string::npos) << s;
  EXPECT_NE(s.find("50 evicted"), std::string::npos) << s;
  EXPECT_NE(s.find("2 sources"), std::string::npos) << s;
  EXPECT_EQ(log.summary(t + Duration(4000)), "");  // nothing new
  // Many sources: a few are named, the rest only counted, until the next period.
  int named = 0;
  for (int i = 0; i < 100; ++i)
    named += log.note(K::bad_hello, "10.1.0." + std::to_string(i), "junk", t) != "";
  EXPECT_EQ(named, static_cast<int>(wire::AbuseLog::kLinesPerPeriod));
  EXPECT_NE(log.summary(t + Duration(6000)).find("100 bad first message"), std::string::npos);
  EXPECT_NE(log.note(K::bad_hello, "10.2.0.1", "junk", t + Duration(6000)), "");
}

TEST(RdzvAuth, GeneratedTokensAreLongAndDistinct) {
  std::set<std::string> seen;
  for (int i = 0; i < 64; ++i) {
    std::string t = generate_rdzv_token();
    EXPECT_EQ(t.size(), 64u);
    EXPECT_EQ(t.find_first_not_of("0123456789abcdef"), std::string::npos) << t;
    seen.insert(t);
  }
  EXPECT_EQ(seen.size(), 64u);
}

TEST(RdzvAuth, TokenFiles) {
  char tmpl[] = "/tmp/gz_au_token_XXXXXX";
  int fd = mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  ::close(fd);
  const std::string path = tmpl;
  auto write = [&](const std::string& s, mode_t mode) {
    std::ofstream(path, std::ios::trunc) << s;
    ::chmod(path.c_str(), mode);
  };
  std::string warning;
  write("  s3cret-token-value \n second line\n", 0600);
  EXPECT_EQ(read_rdzv_token_file(path, &warning), "s3cret-token-value");
  EXPECT_EQ(warning, "");
  write("abc", 0644);
  EXPECT_EQ(read_rdzv_token_file(path, &warning), "abc");
  EXPECT_NE(warning.find("readable by other users"), std::string::npos) << warning;
  write("\n", 0600);
  EXPECT_THROW(read_rdzv_token_file(path), InvalidArgument);
  write(std::string(kMaxRdzvTokenBytes + 1, 'x'), 0600);
  EXPECT_THROW(read_rdzv_token_file(path), InvalidArgument);
  write(std::string(kMaxRdzvTokenBytes, 'x') + "\n", 0600);
  EXPECT_EQ(read_rdzv_token_file(path).size(), kMaxRdzvTokenBytes);
  std::remove(path.c_str());
  EXPECT_THROW(read_rdzv_token_file(path), InvalidArgument);
}

TEST(RdzvAuth, LoopbackOrNot) {
  for (const char* h : {"127.0.0.1", "127.1.2.3", "localhost", "::1", "::ffff:127.0.0.1"})
    EXPECT_TRUE(is_loopback_host(h)) << h;
  for (const char* h :
       {"0.0.0.0", "", "::", "10.0.0.1", "128.0.0.1", "my-host", "localhost.example.com", "fe80::1"})
    EXPECT_FALSE(is_loopback_host(h)) << h;
}

TEST(RdzvAuth, TokensEqualComparesEverything) {
  EXPECT_TRUE(tokens_equal("abc", "abc"));
  EXPECT_TRUE(tokens_equal("", ""));
  EXPECT_FALSE(tokens_equal("abc", "abd"));
  EXPECT_FALSE(tokens_equal("abc", "ab"));
  EXPECT_FALSE(tokens_equal("ab", "abc"));
  EXPECT_FALSE(tokens_equal(std::string("a\0", 2), "a"));
}

}  // namespace
}  // namespace gz
