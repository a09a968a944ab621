#include "store/handshake.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <mutex>

#include "gz/core/error.h"

namespace gz::wire {

namespace {

// PBKDF2 rounds: about 5 ms once per process and server on this machine; an offline guess at a
// token costs as much.
constexpr int kKeyIterations = 20000;

// One handshake message of type `op` with at most `max_body` bytes and one part.
HandshakeResult judge_frame(const uint8_t* data, size_t size, Op op, size_t max_body, Message& m) {
  HandshakeResult r;
  const size_t budget = kHeaderBytes + max_body;
  size = std::min(size, budget);
  Limits limits;
  limits.max_body_bytes = max_body;
  limits.max_parts = 1;
  DecodeResult d = decode(data, size, Direction::request, limits, m);
  const std::string want = code_name(static_cast<uint8_t>(op));
  switch (d.status) {
    case DecodeStatus::need_more:
      // Cannot happen with a full budget: a body that fits the limit fits the buffer.
      if (size >= budget) {
        r.verdict = HandshakeVerdict::malformed;
        r.detail = "no complete " + want + " in " + std::to_string(size) + " bytes";
      }
      return r;
    case DecodeStatus::too_large:
      r.verdict = HandshakeVerdict::oversized;
      r.detail = "a " + want + " of " + std::to_string(read_u32(data)) + " bytes (at most " +
                 std::to_string(max_body) + ")";
      return r;
    case DecodeStatus::malformed:
      // A request with more parts than the step's message (set, compare_set, wait) is refused
      // like any other out-of-turn request: decode() only knew the part limit.
      if (size > kHeaderBytes && is_request_code(data[kHeaderBytes]) &&
          data[kHeaderBytes] != static_cast<uint8_t>(op)) {
        r.verdict = HandshakeVerdict::unexpected;
        r.detail = code_name(data[kHeaderBytes]) + " before authentication (expected " + want + ")";
      } else {
        r.verdict = HandshakeVerdict::malformed;
        r.detail = d.error;
      }
      return r;
    case DecodeStatus::ok:
      break;
  }
  if (m.code != static_cast<uint8_t>(op)) {
    r.verdict = HandshakeVerdict::unexpected;
    r.detail = code_name(m.code) + " before authentication (expected " + want + ")";
    return r;
  }
  r.verdict = HandshakeVerdict::accept;
  r.consumed = d.consumed;
  return r;
}

std::string hmac_sha256(const std::string& key, const std::string& data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
            reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &len))
    GZ_THROW(Error, "store handshake: HMAC-SHA256 failed (OpenSSL)");
  return std::string(reinterpret_cast<const char*>(out), len);
}

void put_len(std::string& out, size_t n) {
  for (int i = 0; i < 4; ++i) out += static_cast<char>((n >> (8 * i)) & 0xff);
}

}  // namespace

HandshakeResult judge_hello(const uint8_t* data, size_t size) {
  Message m;
  HandshakeResult r = judge_frame(data, size, Op::hello, kMaxHelloBodyBytes, m);
  if (r.verdict != HandshakeVerdict::accept) return r;
  if (m.num != kProtocolVersion) {
    r.verdict = HandshakeVerdict::wrong_protocol;
    r.detail = "protocol version " + std::to_string(m.num) + " not supported (server speaks " +
               std::to_string(kProtocolVersion) + ")";
  } else if (m.parts[0].size() != kNonceBytes) {
    r.verdict = HandshakeVerdict::malformed;
    r.consumed = 0;
    r.detail = "a hello nonce of " + std::to_string(m.parts[0].size()) + " bytes (expected " +
               std::to_string(kNonceBytes) + ")";
  } else {
    r.nonce = std::move(m.parts[0]);
  }
  return r;
}

HandshakeResult judge_auth(const uint8_t* data, size_t size, const std::string& expected) {
  Message m;
  HandshakeResult r = judge_frame(data, size, Op::auth, kMaxAuthBodyBytes, m);
  if (r.verdict != HandshakeVerdict::accept || expected.empty()) return r;
  if (!proofs_equal(m.parts[0], expected)) {
    r.verdict = HandshakeVerdict::wrong_token;
    r.detail = m.parts[0].empty() ? "no rendezvous token" : "wrong rendezvous token";
  }
  return r;
}

const char* verdict_name(HandshakeVerdict v) {
  switch (v) {
    case HandshakeVerdict::need_more:
      return "incomplete handshake";
    case HandshakeVerdict::accept:
      return "accepted";
    case HandshakeVerdict::wrong_token:
      return "wrong token";
    case HandshakeVerdict::wrong_protocol:
      return "wrong protocol version";
    case HandshakeVerdict::unexpected:
      return "request before authentication";
    case HandshakeVerdict::oversized:
      return "oversized handshake message";
    case HandshakeVerdict::malformed:
      return "malformed handshake message";
  }
  return "?";
}

std::string random_bytes(size_t n) {
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    ssize_t k = ::getrandom(&out[got], n - got, 0);
    if (k < 0) {
      if (errno == EINTR) continue;
      throw SystemError("store handshake: getrandom", errno);
    }
    got += static_cast<size_t>(k);
  }
  return out;
}

std::string handshake_key(const std::string& token, const std::string& salt) {
  static std::mutex mu;
  static std::map<std::pair<std::string, std::string>, std::string> cache;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find({token, salt});
    if (it != cache.end()) return it->second;
  }
  unsigned char key[32];
  if (PKCS5_PBKDF2_HMAC(token.data(), static_cast<int>(token.size()),
                        reinterpret_cast<const unsigned char*>(salt.data()), static_cast<int>(salt.size()),
                        kKeyIterations, EVP_sha256(), sizeof key, key) != 1)
    GZ_THROW(Error, "store handshake: PBKDF2 failed (OpenSSL)");
  std::string out(reinterpret_cast<const char*>(key), sizeof key);
  OPENSSL_cleanse(key, sizeof key);
  std::lock_guard<std::mutex> lock(mu);
  if (cache.size() >= 64) cache.clear();  // a process talks to a handful of servers
  cache[{token, salt}] = out;
  return out;
}

std::string handshake_proof(const std::string& key, Prover who, const std::string& server_name,
                            const std::string& client_nonce, const std::string& server_nonce) {
  // Fixed labels per side (a proof is never valid in the other direction), then every field
  // length-prefixed, so no two different inputs share a message.
  std::string msg = who == Prover::server ? "gz-store-v2 server proof" : "gz-store-v2 client proof";
  for (const std::string* f : {&server_name, &client_nonce, &server_nonce}) {
    put_len(msg, f->size());
    msg += *f;
  }
  return hmac_sha256(key, msg);
}

bool proofs_equal(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace gz::wire
