// A raw loopback TCP connection for speaking (bad) store protocol by hand in tests.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "gz/core/deadline.h"
#include "store/wire.h"

namespace gz::test {

class RawConn {
 public:
  /// @brief Connect to 127.0.0.1:port, from `source` (another 127/8 address) when given.
  explicit RawConn(int port, const char* source = nullptr) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (source) {
      sockaddr_in s{};
      s.sin_family = AF_INET;
      inet_pton(AF_INET, source, &s.sin_addr);
      if (bind(fd_, reinterpret_cast<sockaddr*>(&s), sizeof s) != 0) ADD_FAILURE() << "bind to " << source;
    }
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) ADD_FAILURE() << "raw connect failed";
  }
  ~RawConn() { ::close(fd_); }
  RawConn(const RawConn&) = delete;
  RawConn& operator=(const RawConn&) = delete;
  void send(const std::string& bytes) { (void)!::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL); }
  /// Read until EOF or `limit`; returns what came (EOF detection: closed() afterwards).
  std::string read_until_close(Duration limit) {
    std::string got;
    Deadline d = Deadline::after(limit);
    char buf[4096];
    while (!d.expired()) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, d.remaining_ms()) <= 0) break;
      ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) {
        closed_ = true;
        break;
      }
      got.append(buf, static_cast<size_t>(n));
    }
    return got;
  }
  /// Whether the server has closed the connection by now (reads pending bytes without waiting).
  bool closed_now() {
    read_until_close(Duration(0));
    if (closed_) return true;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 0) > 0) read_until_close(Duration(1));
    return closed_;
  }
  bool closed() const { return closed_; }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  bool closed_ = false;
};

inline std::string hello_frame(const std::string& token = {}, int64_t version = wire::kProtocolVersion) {
  wire::Message m;
  m.code = static_cast<uint8_t>(wire::Op::hello);
  m.num = version;
  m.parts = {token};
  return wire::encode(m);
}

/// @brief The first reply frame in `bytes` (code 0 when there is none).
inline wire::Message first_reply(const std::string& bytes) {
  wire::Message m;
  wire::Limits l;
  auto r = wire::decode(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), wire::Direction::reply,
                        l, m);
  if (r.status != wire::DecodeStatus::ok) m.code = 0;
  return m;
}

/// @brief Raise the soft descriptor limit to at least `n` (tests that open many sockets).
inline bool raise_fd_limit(rlim_t n) {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return false;
  if (r.rlim_cur >= n) return true;
  if (r.rlim_max < n) return false;
  r.rlim_cur = n;
  return setrlimit(RLIMIT_NOFILE, &r) == 0;
}

}  // namespace gz::test
