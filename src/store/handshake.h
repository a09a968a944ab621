// The store handshake, protocol version 2: a mutual challenge-response on the rendezvous token.
//
//   client                                         server
//   hello(version, client nonce)           ->
//                                          <-      challenge(server nonce, salt, server proof, name)
//   [checks the server proof and name]
//   auth(client proof)                     ->
//                                          <-      ok | refused
//
// key = PBKDF2-HMAC-SHA256(token, salt), salt random per server; proofs are HMAC-SHA256(key,
// label | name | client nonce | server nonce) with distinct labels for the two sides. The token
// itself never travels. The server proves first and the client answers only a valid proof, so a
// server that does not know the token (something else bound to the port) learns one random nonce
// and nothing derived from the token; each side's nonce makes every proof good for one
// connection only. The judging functions are pure (bytes in, verdict out): the server and the
// fuzz target share them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "gz/store/rdzv_auth.h"
#include "store/wire.h"

namespace gz::wire {

constexpr size_t kNonceBytes = 32;
constexpr size_t kSaltBytes = 16;
constexpr size_t kProofBytes = 32;  ///< HMAC-SHA256
/// @brief Longest server name (TcpStoreServerOptions::name) a challenge carries.
constexpr size_t kMaxServerNameBytes = 128;

/// @brief Largest hello body: fixed fields, one part length, the nonce.
constexpr size_t kMaxHelloBodyBytes = kMinBodyBytes + 4 + kNonceBytes;
/// @brief All an unauthenticated client may have buffered before its hello is judged.
constexpr size_t kMaxHelloFrameBytes = kHeaderBytes + kMaxHelloBodyBytes;
/// @brief Largest auth body and frame (the proof; empty when the client has no token).
constexpr size_t kMaxAuthBodyBytes = kMinBodyBytes + 4 + kProofBytes;
constexpr size_t kMaxAuthFrameBytes = kHeaderBytes + kMaxAuthBodyBytes;
/// @brief Largest challenge body a client accepts.
constexpr size_t kMaxChallengeBodyBytes =
    kMinBodyBytes + 4 * 4 + kNonceBytes + kSaltBytes + kProofBytes + kMaxServerNameBytes;

enum class HandshakeVerdict {
  need_more,       ///< an incomplete message (fewer bytes than its step's budget)
  accept,          ///< hello: well formed, our version; auth: the proof expected
  wrong_token,     ///< auth: a well-formed proof that is not the expected one (or none)
  wrong_protocol,  ///< hello of another protocol version
  unexpected,      ///< a well-formed request that is not this step's: refused, never executed
  oversized,       ///< announces a body larger than the step allows: refused before it is read
  malformed,       ///< anything else that is not this step's message
};

struct HandshakeResult {
  HandshakeVerdict verdict = HandshakeVerdict::need_more;
  size_t consumed = 0;  ///< bytes of the judged frame (accept / wrong_*)
  std::string nonce;    ///< hello accepted: the client's nonce
  std::string detail;   ///< why, for refusals (never contains a token or proof)
};

/// @brief Judge the first `size` buffered bytes of a new connection as a hello. Reads at most
/// kMaxHelloFrameBytes; with that many buffered the verdict is never need_more.
HandshakeResult judge_hello(const uint8_t* data, size_t size);

/// @brief Judge the bytes after the hello as the client's auth. `expected` is the client proof
/// the server computed for this connection; empty (a server without a token) accepts any
/// well-formed auth. Reads at most kMaxAuthFrameBytes; with that many buffered the verdict is
/// never need_more.
HandshakeResult judge_auth(const uint8_t* data, size_t size, const std::string& expected);

/// @brief The budget of unauthenticated input for a step (hello, then auth).
inline size_t handshake_budget(bool challenged) {
  return challenged ? kMaxAuthFrameBytes : kMaxHelloFrameBytes;
}

/// @brief Short name of a verdict for logs ("wrong token", ...).
const char* verdict_name(HandshakeVerdict v);

/// @brief `n` bytes from the kernel's CSPRNG. Throws gz::SystemError when none can be had.
std::string random_bytes(size_t n);

/// @brief The key both sides derive from the token and the server's salt (PBKDF2-HMAC-SHA256):
/// each guess at a weak token then costs an offline attacker the iterations too. Cached per
/// (token, salt) in the process, so a client pays it once per server.
std::string handshake_key(const std::string& token, const std::string& salt);

enum class Prover { server, client };

/// @brief The proof `who` sends on the connection with these nonces, from the derived key.
std::string handshake_proof(const std::string& key, Prover who, const std::string& server_name,
                            const std::string& client_nonce, const std::string& server_nonce);

/// @brief Constant-time comparison of two proofs (lengths leak).
bool proofs_equal(const std::string& a, const std::string& b);

}  // namespace gz::wire
