// libFuzzer entry point for the TCP store's wire format: decode a stream of frames from
// arbitrary bytes (as a server connection would), check that every decoded message re-encodes
// to exactly the bytes it came from, and apply decoded requests to an in-memory StoreState.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "store/store_state.h"
#include "store/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gz::wire;
  Limits limits;
  limits.max_body_bytes = 1u << 16;  // small, so the too_large path is reachable
  limits.max_parts = 64;
  StoreState state(1u << 16);  // small budget: the "store full" path too
  size_t pos = 0;
  bool authed = false;
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
    if (m.code == static_cast<uint8_t>(Op::hello)) {
      authed = true;
      continue;
    }
    if (!authed) continue;
    Message reply;
    if (state.apply(m, reply) == StoreState::Outcome::blocked && state.missing(m).empty()) std::abort();
    if (!is_reply_code(reply.code)) std::abort();
  }
  return 0;
}
