// The first frame on a store connection, judged before the client is trusted with anything:
// a bounded hello (token + protocol version). Pure function of the bytes received so far, shared
// by the server and the fuzz target.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "gz/store/rdzv_auth.h"
#include "store/wire.h"

namespace gz::wire {

/// @brief Largest hello body: fixed fields, one part length, the longest token.
constexpr size_t kMaxHelloBodyBytes = kMinBodyBytes + 4 + kMaxRdzvTokenBytes;
/// @brief All an unauthenticated client may have buffered at the server: one maximal hello.
constexpr size_t kMaxHelloFrameBytes = kHeaderBytes + kMaxHelloBodyBytes;

enum class HelloVerdict {
  need_more,       ///< an incomplete hello (fewer than kMaxHelloFrameBytes bytes buffered)
  accept,          ///< a hello with the right token and protocol version
  wrong_token,     ///< a well-formed hello with another token
  wrong_protocol,  ///< a hello of another protocol version
  not_hello,       ///< a well-formed request that is not hello: refused, never executed
  oversized,       ///< announces a body larger than any hello: refused before it is read
  malformed,       ///< anything else that is not a frame
};

struct HelloResult {
  HelloVerdict verdict = HelloVerdict::need_more;
  size_t consumed = 0;  ///< bytes of the hello frame (accept / wrong_*)
  std::string detail;   ///< why, for refusals (never contains the token)
};

/// @brief Judge the first `size` buffered bytes of a connection against `token` (empty: any
/// token is accepted). Reads at most kMaxHelloFrameBytes; with that many bytes buffered the
/// verdict is never need_more, so a server never has to buffer more before deciding.
HelloResult judge_hello(const uint8_t* data, size_t size, const std::string& token);

/// @brief Short name of a verdict for logs ("wrong token", ...).
const char* verdict_name(HelloVerdict v);

}  // namespace gz::wire
