#include "store/wire.h"

#include <cstring>

namespace gz::wire {

namespace {

void put_u32(std::string& out, uint32_t v) {
  char b[4];
  for (int i = 0; i < 4; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  out.append(b, 4);
}

void put_u64(std::string& out, uint64_t v) {
  char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  out.append(b, 8);
}

uint64_t read_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

/// Allowed part counts per request op: [min, max]; max 0 with min 0 means "none".
bool arity_ok(uint8_t code, size_t n) {
  switch (static_cast<Op>(code)) {
    case Op::hello:
      return n == 1;
    case Op::set:
      return n == 2;
    case Op::get:
      return n == 1;
    case Op::add:
      return n == 1;
    case Op::compare_set:
      return n == 3;
    case Op::wait:
      return true;
    case Op::check:
      return true;
    case Op::delete_key:
      return n == 1;
    case Op::num_keys:
      return n == 0;
    case Op::append:
      return n == 2;
    case Op::auth:
      return n == 1;
  }
  return false;
}

DecodeResult fail(DecodeStatus s, std::string why) {
  DecodeResult r;
  r.status = s;
  r.error = std::move(why);
  return r;
}

}  // namespace

uint32_t read_u32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

bool is_request_code(uint8_t code) { return code >= 1 && code <= 11; }
bool is_reply_code(uint8_t code) { return code >= 128 && code <= 133; }

std::string code_name(uint8_t code) {
  switch (code) {
    case 1:
      return "hello";
    case 2:
      return "set";
    case 3:
      return "get";
    case 4:
      return "add";
    case 5:
      return "compare_set";
    case 6:
      return "wait";
    case 7:
      return "check";
    case 8:
      return "delete_key";
    case 9:
      return "num_keys";
    case 10:
      return "append";
    case 11:
      return "auth";
    case 128:
      return "ok";
    case 129:
      return "timeout";
    case 130:
      return "invalid";
    case 131:
      return "error";
    case 132:
      return "refused";
    case 133:
      return "challenge";
  }
  return "op#" + std::to_string(code);
}

DecodeResult decode(const uint8_t* data, size_t size, Direction dir, const Limits& limits, Message& out) {
  if (size < kHeaderBytes) return DecodeResult{};
  const uint64_t body = read_u32(data);
  if (body > limits.max_body_bytes)
    return fail(DecodeStatus::too_large, "message body of " + std::to_string(body) +
                                             " bytes exceeds the limit of " +
                                             std::to_string(limits.max_body_bytes));
  if (body < kMinBodyBytes)
    return fail(DecodeStatus::malformed, "message body of " + std::to_string(body) +
                                             " bytes is shorter than " + std::to_string(kMinBodyBytes));
  if (size - kHeaderBytes < body) return DecodeResult{};

  const uint8_t* p = data + kHeaderBytes;
  const uint8_t* end = p + body;
  const uint8_t code = p[0];
  const bool req = is_request_code(code), rep = is_reply_code(code);
  if ((dir == Direction::request && !req) || (dir == Direction::reply && !rep) || (!req && !rep))
    return fail(DecodeStatus::malformed, "unknown message code " + std::to_string(code));
  const int64_t num = static_cast<int64_t>(read_u64(p + 1));
  const uint64_t nparts = read_u32(p + 9);
  p += kMinBodyBytes;
  if (nparts > limits.max_parts)
    return fail(DecodeStatus::malformed, "message has " + std::to_string(nparts) + " parts, limit " +
                                             std::to_string(limits.max_parts));
  // Each part needs at least its 4-byte length: reject impossible counts before reserving.
  if (nparts > static_cast<uint64_t>(end - p) / 4)
    return fail(DecodeStatus::malformed,
                "message announces " + std::to_string(nparts) + " parts but has room for fewer");
  if (req && !arity_ok(code, nparts))
    return fail(DecodeStatus::malformed,
                code_name(code) + " request with " + std::to_string(nparts) + " parts");

  Message m;
  m.code = code;
  m.num = num;
  m.parts.reserve(nparts);
  for (uint64_t i = 0; i < nparts; ++i) {
    if (end - p < 4) return fail(DecodeStatus::malformed, "truncated part length");
    const uint64_t len = read_u32(p);
    p += 4;
    if (len > static_cast<uint64_t>(end - p))
      return fail(DecodeStatus::malformed,
                  "part " + std::to_string(i) + " of " + std::to_string(len) + " bytes overruns the message");
    m.parts.emplace_back(reinterpret_cast<const char*>(p), len);
    p += len;
  }
  if (p != end)
    return fail(DecodeStatus::malformed, std::to_string(end - p) + " trailing bytes after the last part");
  out = std::move(m);
  DecodeResult r;
  r.status = DecodeStatus::ok;
  r.consumed = kHeaderBytes + body;
  return r;
}

void encode(const Message& m, std::string& out) {
  size_t body = kMinBodyBytes;
  for (auto& s : m.parts) body += 4 + s.size();
  out.reserve(out.size() + kHeaderBytes + body);
  put_u32(out, static_cast<uint32_t>(body));
  out.push_back(static_cast<char>(m.code));
  put_u64(out, static_cast<uint64_t>(m.num));
  put_u32(out, static_cast<uint32_t>(m.parts.size()));
  for (auto& s : m.parts) {
    put_u32(out, static_cast<uint32_t>(s.size()));
    out.append(s);
  }
}

std::string encode(const Message& m) {
  std::string out;
  encode(m, out);
  return out;
}

}  // namespace gz::wire
