#include "store/handshake.h"

#include <algorithm>

namespace gz::wire {

HelloResult judge_hello(const uint8_t* data, size_t size, const std::string& token) {
  HelloResult r;
  size = std::min(size, kMaxHelloFrameBytes);
  Limits limits;
  limits.max_body_bytes = kMaxHelloBodyBytes;
  limits.max_parts = 1;
  Message m;
  DecodeResult d = decode(data, size, Direction::request, limits, m);
  switch (d.status) {
    case DecodeStatus::need_more:
      // Cannot happen with a full budget: a body that fits the limit fits the buffer.
      if (size >= kMaxHelloFrameBytes) {
        r.verdict = HelloVerdict::malformed;
        r.detail = "no complete hello in " + std::to_string(size) + " bytes";
      }
      return r;
    case DecodeStatus::too_large:
      r.verdict = HelloVerdict::oversized;
      r.detail = "a first message of " + std::to_string(read_u32(data)) + " bytes (a hello has at most " +
                 std::to_string(kMaxHelloBodyBytes) + ")";
      return r;
    case DecodeStatus::malformed:
      // A request with more parts than a hello (set, compare_set, wait) is refused the same way
      // as any other non-hello: decode() only knew the part limit.
      if (size > kHeaderBytes && is_request_code(data[kHeaderBytes]) &&
          data[kHeaderBytes] != static_cast<uint8_t>(Op::hello)) {
        r.verdict = HelloVerdict::not_hello;
        r.detail = code_name(data[kHeaderBytes]) + " before hello";
      } else {
        r.verdict = HelloVerdict::malformed;
        r.detail = d.error;
      }
      return r;
    case DecodeStatus::ok:
      break;
  }
  if (m.code != static_cast<uint8_t>(Op::hello)) {
    r.verdict = HelloVerdict::not_hello;
    r.detail = code_name(m.code) + " before hello";
    return r;
  }
  r.consumed = d.consumed;
  if (m.num != kProtocolVersion) {
    r.verdict = HelloVerdict::wrong_protocol;
    r.detail = "protocol version " + std::to_string(m.num) + " not supported (server speaks " +
               std::to_string(kProtocolVersion) + ")";
  } else if (!token.empty() && !tokens_equal(m.parts[0], token)) {
    r.verdict = HelloVerdict::wrong_token;
    r.detail = m.parts[0].empty() ? "no rendezvous token" : "wrong rendezvous token";
  } else {
    r.verdict = HelloVerdict::accept;
  }
  return r;
}

const char* verdict_name(HelloVerdict v) {
  switch (v) {
    case HelloVerdict::need_more:
      return "incomplete hello";
    case HelloVerdict::accept:
      return "accepted";
    case HelloVerdict::wrong_token:
      return "wrong token";
    case HelloVerdict::wrong_protocol:
      return "wrong protocol version";
    case HelloVerdict::not_hello:
      return "request before hello";
    case HelloVerdict::oversized:
      return "oversized first message";
    case HelloVerdict::malformed:
      return "malformed first message";
  }
  return "?";
}

}  // namespace gz::wire
