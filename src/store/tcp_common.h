// Small helpers shared by the TCP store's server (tcp_store_server.cpp) and client (tcp_store.cpp).
#pragma once

#include <fcntl.h>

#include <string>
#include <utility>
#include <vector>

#include "store/wire.h"

namespace gz::wire {

inline void set_nonblocking(int fd) {
  int fl = fcntl(fd, F_GETFL, 0);
  if (fl >= 0) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/// @brief At most 200 printable characters of `s` (keys and server messages in errors).
inline std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s.substr(0, 200)) out += (c >= 32 && c < 127) ? static_cast<char>(c) : '?';
  if (s.size() > 200) out += "...";
  return out;
}

inline Message make(uint8_t code, int64_t num = 0, std::vector<std::string> parts = {}) {
  Message m;
  m.code = code;
  m.num = num;
  m.parts = std::move(parts);
  return m;
}

inline Message make_reply(Reply code, std::string text = {}) {
  return make(static_cast<uint8_t>(code), 0,
              text.empty() ? std::vector<std::string>{} : std::vector<std::string>{text});
}

/// @brief An error reply with num = 1: the server closes the connection after sending it.
inline Message closing_reply(Reply code, std::string text) {
  Message m = make_reply(code, std::move(text));
  m.num = 1;
  return m;
}

}  // namespace gz::wire
