// libFuzzer entry point for the TCP store's wire format: judge the first frames as the server
// does before a client is authenticated (handshake.h: a bounded hello, then a bounded auth),
// then decode the rest as a stream of frames (as a server connection would), check that every
// decoded message re-encodes to exactly the bytes it came from, and apply decoded requests to an
// in-memory StoreState.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "store/handshake.h"
#include "store/store_state.h"
#include "store/wire.h"

namespace {

using namespace gz::wire;

// A judged handshake message is a well-formed frame of its op within its budget; a refusal or
// need_more consumes nothing; a full budget always decides.
void check_judged(const uint8_t* data, size_t size, const HandshakeResult& h, Op op, size_t budget) {
  if (size >= budget && h.verdict == HandshakeVerdict::need_more) std::abort();
  if (h.verdict == HandshakeVerdict::accept || h.verdict == HandshakeVerdict::wrong_token ||
      h.verdict == HandshakeVerdict::wrong_protocol) {
    Message m;
    if (h.consumed == 0 || h.consumed > budget) std::abort();
    if (decode(data, size, Direction::request, Limits{}, m).status != DecodeStatus::ok ||
        m.code != static_cast<uint8_t>(op))
      std::abort();
  } else if (h.consumed != 0) {
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Limits limits;
  limits.max_body_bytes = 1u << 16;  // small, so the too_large path is reachable
  limits.max_parts = 64;
  StoreState state(1u << 16);  // small budget: the "store full" path too
  HandshakeResult hello = judge_hello(data, size);
  check_judged(data, size, hello, Op::hello, kMaxHelloFrameBytes);
  if (judge_hello(data, std::min(size, kMaxHelloFrameBytes)).verdict != hello.verdict) std::abort();
  if (hello.verdict == HandshakeVerdict::accept && hello.nonce.size() != kNonceBytes) std::abort();
  if (hello.verdict != HandshakeVerdict::accept) return 0;  // a server refuses and closes here
  size_t pos = hello.consumed;
  // The auth, judged as a server with a token (a fixed expected proof) and as one without would.
  const std::string expected(kProofBytes, 'k');
  HandshakeResult open_result;
  for (const std::string& proof : {expected, std::string()}) {
    HandshakeResult a = judge_auth(data + pos, size - pos, proof);
    check_judged(data + pos, size - pos, a, Op::auth, kMaxAuthFrameBytes);
    if (judge_auth(data + pos, std::min(size - pos, kMaxAuthFrameBytes), proof).verdict != a.verdict)
      std::abort();
    if (a.verdict == HandshakeVerdict::accept && !proof.empty()) {
      // Accepted with a token means exactly the expected proof.
      Message m;
      decode(data + pos, size - pos, Direction::request, Limits{}, m);
      if (m.parts[0] != proof) std::abort();
    }
    open_result = a;
  }
  if (open_result.verdict != HandshakeVerdict::accept) return 0;
  pos += open_result.consumed;
  while (pos < size) {
    Message m;
    DecodeResult r = decode(data + pos, size - pos, Direction::any, limits, m);
    if (r.status != DecodeStatus::ok) break;  // need_more / malformed / too_large: a server stops here
    if (r.consumed == 0 || r.consumed > size - pos) std::abort();
    if (encode(m) != std::string(reinterpret_cast<const char*>(data + pos), r.consumed)) std::abort();
    pos += r.consumed;
    if (!is_request_code(m.code)) continue;
    // Requests decoded with Direction::request must decode identically.
    Message again;
    if (decode(data + pos - r.consumed, r.consumed, Direction::request, limits, again).status !=
        DecodeStatus::ok)
      std::abort();
    Message reply;
    if (state.apply(m, reply) == StoreState::Outcome::blocked && state.missing(m).empty()) std::abort();
    if (!is_reply_code(reply.code)) std::abort();
  }
  return 0;
}
