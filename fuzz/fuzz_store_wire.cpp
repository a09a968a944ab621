// libFuzzer entry point for the TCP store's wire format: judge the first frame as the server
// does before a client is authenticated (handshake.h: a bounded hello), then decode the rest as a
// stream of frames (as a server connection would), check that every decoded message re-encodes
// to exactly the bytes it came from, and apply decoded requests to an in-memory StoreState.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "store/handshake.h"
#include "store/store_state.h"
#include "store/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gz::wire;
  Limits limits;
  limits.max_body_bytes = 1u << 16;  // small, so the too_large path is reachable
  limits.max_parts = 64;
  StoreState state(1u << 16);  // small budget: the "store full" path too
  // The handshake, judged as a server with a token and as one without would.
  HelloResult open_result;
  for (const std::string& token : {std::string("fuzz-token"), std::string()}) {
    HelloResult h = judge_hello(data, size, token);
    // A full hello budget always decides; nothing beyond it is ever consulted.
    if (size >= kMaxHelloFrameBytes && h.verdict == HelloVerdict::need_more) std::abort();
    if (judge_hello(data, std::min(size, kMaxHelloFrameBytes), token).verdict != h.verdict) std::abort();
    if (h.verdict == HelloVerdict::accept || h.verdict == HelloVerdict::wrong_token ||
        h.verdict == HelloVerdict::wrong_protocol) {
      // A judged hello is a well-formed hello frame within the budget.
      Message m;
      Limits hl;
      if (h.consumed == 0 || h.consumed > kMaxHelloFrameBytes) std::abort();
      if (decode(data, size, Direction::request, hl, m).status != DecodeStatus::ok ||
          m.code != static_cast<uint8_t>(Op::hello))
        std::abort();
      // Accepted means exactly the server's token (or none configured) and our version.
      if (h.verdict == HelloVerdict::accept &&
          (m.num != kProtocolVersion || (!token.empty() && m.parts[0] != token)))
        std::abort();
    } else if (h.consumed != 0) {
      std::abort();
    }
    open_result = h;
  }
  if (open_result.verdict != HelloVerdict::accept) return 0;  // a server refuses and closes here
  size_t pos = open_result.consumed;
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
    if (decode(data + pos - r.consumed, r.consumed, Direction::request, limits, again).status != DecodeStatus::ok)
      std::abort();
    Message reply;
    if (state.apply(m, reply) == StoreState::Outcome::blocked && state.missing(m).empty()) std::abort();
    if (!is_reply_code(reply.code)) std::abort();
  }
  return 0;
}
