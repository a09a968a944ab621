// Wire format of the TCP store (also the record format of FileStore).
//
// A frame is a little-endian u32 body length followed by the body:
//   u8 code | i64 num | u32 nparts | nparts x (u32 len | len bytes)
// Requests carry an Op code, replies a Reply code. `num` is the add delta, the blocking timeout
// in milliseconds, the protocol version (hello) or the integer result of a reply; on an
// invalid/error/refused reply, num = 1 means the server closes the connection after it.
// A connection starts with the handshake (handshake.h): hello -> challenge -> auth -> ok.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace gz::wire {

/// Version 2: mutual challenge-response (version 1 sent the token itself in the hello).
constexpr int64_t kProtocolVersion = 2;
constexpr size_t kHeaderBytes = 4;
/// Smallest body: code + num + nparts.
constexpr size_t kMinBodyBytes = 1 + 8 + 4;

enum class Op : uint8_t {
  hello = 1,        ///< parts: [client nonce]; num: protocol version
  set = 2,          ///< parts: [key, value]
  get = 3,          ///< parts: [key]; num: timeout ms
  add = 4,          ///< parts: [key]; num: delta
  compare_set = 5,  ///< parts: [key, expected, desired]
  wait = 6,         ///< parts: keys; num: timeout ms
  check = 7,        ///< parts: keys
  delete_key = 8,   ///< parts: [key]
  num_keys = 9,     ///< no parts
  append = 10,      ///< parts: [key, value]; reply num: the new length
  auth = 11,        ///< parts: [client proof] (the answer to a challenge)
};

enum class Reply : uint8_t {
  ok = 128,         ///< parts / num: the result
  timeout = 129,    ///< parts: the keys still missing
  invalid = 130,    ///< parts: [message] (caller's fault: bad value, bad request)
  error = 131,      ///< parts: [message] (server-side limit: store full, ...)
  refused = 132,    ///< parts: [message] (handshake rejected: token, protocol, too many clients)
  challenge = 133,  ///< parts: [server nonce, salt, server proof, server name] (the answer to hello)
};

/// @brief One decoded message (request or reply).
struct Message {
  uint8_t code = 0;
  int64_t num = 0;
  std::vector<std::string> parts;
};

/// @brief Which codes decode() accepts.
enum class Direction { request, reply, any };

/// @brief Bounds decode() enforces before allocating anything.
struct Limits {
  size_t max_body_bytes = 64u << 20;
  size_t max_parts = 1u << 16;
};

enum class DecodeStatus {
  ok,         ///< `out` holds one message; `consumed` bytes were used
  need_more,  ///< the buffer holds an incomplete frame (nothing consumed)
  malformed,  ///< bad code, arity, counts or lengths; `error` says which
  too_large,  ///< the announced body exceeds Limits::max_body_bytes
};

struct DecodeResult {
  DecodeStatus status = DecodeStatus::need_more;
  size_t consumed = 0;
  std::string error;
};

/// @brief Decode one frame from the front of [data, data+size). Validates the length prefix,
/// the code for `dir`, the part count and every part length against the frame; for requests
/// also the number of parts each op needs. Never reads outside the buffer.
DecodeResult decode(const uint8_t* data, size_t size, Direction dir, const Limits& limits, Message& out);

/// @brief Append the frame of `m` to `out`.
void encode(const Message& m, std::string& out);
std::string encode(const Message& m);

/// @brief Body length announced by a frame header (4 bytes at `p`).
uint32_t read_u32(const uint8_t* p);

/// @brief "get", "set", ... for messages; "op#17" for unknown codes.
std::string code_name(uint8_t code);

/// @brief Whether `code` is a known request op / reply code.
bool is_request_code(uint8_t code);
bool is_reply_code(uint8_t code);

}  // namespace gz::wire
