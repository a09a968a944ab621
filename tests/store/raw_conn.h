// A raw loopback TCP connection for speaking (bad) store protocol by hand in tests.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <thread>

#include "gz/core/deadline.h"
#include "store/handshake.h"
#include "store/wire.h"

namespace gz::test {

/// @brief A hello (protocol version 2: a client nonce; a fixed one unless given).
inline std::string hello_frame(const std::string& nonce = std::string(32, 'n'),
                               int64_t version = wire::kProtocolVersion) {
  wire::Message m;
  m.code = static_cast<uint8_t>(wire::Op::hello);
  m.num = version;
  m.parts = {nonce};
  return wire::encode(m);
}

/// @brief An auth frame carrying `proof` (a wrong one unless computed from the challenge).
inline std::string auth_frame(const std::string& proof = std::string(32, 'p')) {
  wire::Message m;
  m.code = static_cast<uint8_t>(wire::Op::auth);
  m.parts = {proof};
  return wire::encode(m);
}

class RawConn {
 public:
  /// @brief Connect to dest:port (127.0.0.1 by default), from `source` (another 127/8 address)
  /// when given.
  explicit RawConn(int port, const char* source = nullptr, const char* dest = "127.0.0.1") {
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
    inet_pton(AF_INET, dest, &a.sin_addr);
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
  /// One whole frame (reply direction), or code 0 when none came within `limit`.
  wire::Message read_frame(Duration limit) {
    Deadline d = Deadline::after(limit);
    for (;;) {
      wire::Message m;
      wire::Limits l;
      auto r = wire::decode(reinterpret_cast<const uint8_t*>(buf_.data()), buf_.size(),
                            wire::Direction::reply, l, m);
      if (r.status == wire::DecodeStatus::ok) {
        buf_.erase(0, r.consumed);
        return m;
      }
      if (r.status != wire::DecodeStatus::need_more || d.expired() || closed_) return wire::Message{};
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, d.remaining_ms()) <= 0) continue;
      char b[4096];
      ssize_t n = ::recv(fd_, b, sizeof b, 0);
      if (n <= 0) {
        closed_ = true;
        continue;
      }
      buf_.append(b, static_cast<size_t>(n));
    }
  }
  /// The whole handshake with `token` (a client's, done by hand); returns the server's last reply.
  wire::Message handshake(const std::string& token, Duration limit = Duration(3000)) {
    const std::string nonce = wire::random_bytes(wire::kNonceBytes);
    send(hello_frame(nonce));
    wire::Message ch = read_frame(limit);
    if (ch.code != static_cast<uint8_t>(wire::Reply::challenge) || ch.parts.size() != 4) return ch;
    const std::string key = wire::handshake_key(token, ch.parts[1]);
    send(auth_frame(wire::handshake_proof(key, wire::Prover::client, ch.parts[3], nonce, ch.parts[0])));
    return read_frame(limit);
  }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  bool closed_ = false;
  std::string buf_;  // read_frame's bytes not yet returned
};

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

/// @brief Run `fn` on a thread of its own inside a new network namespace whose loopback interface
/// also carries `addr` (/32): an address of this host that is not a loopback address, as a node's
/// own address is. Threads and processes `fn` starts live there too. False (fn not run) when a
/// namespace cannot be made here (no CAP_SYS_ADMIN, no `ip`).
inline bool in_netns_with_address(const char* addr, const std::function<void()>& fn) {
  bool ran = false;
  std::thread t([&] {
    if (::unshare(CLONE_NEWNET) != 0) return;
    const std::string cmd = std::string("ip link set lo up && ip addr add ") + addr + "/32 dev lo";
    if (std::system(cmd.c_str()) != 0) return;
    ran = true;
    fn();
  });
  t.join();
  return ran;
}

}  // namespace gz::test
