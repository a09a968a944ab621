// A fake store server for tests: listens on a loopback port, records every byte each connection
// sends and answers the first frame (the hello) as told: an impostor holding a store's port.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gz/core/deadline.h"
#include "store/wire.h"

namespace gz::test {

using namespace std::chrono_literals;

inline std::string frame_of(wire::Reply code, std::vector<std::string> parts) {
  wire::Message m;
  m.code = static_cast<uint8_t>(code);
  m.parts = std::move(parts);
  return wire::encode(m);
}

/// Listens on a loopback port and records every byte each connection sends; `answer` says what
/// to send back once a connection's first frame (the hello) is complete (nothing when empty).
class Impostor {
 public:
  using Answer = std::function<std::string(const wire::Message& hello)>;
  /// `port` 0: any free one. ok() tells whether the port could be bound.
  explicit Impostor(Answer answer, int port = 0) : answer_(std::move(answer)) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ok_ = bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    listen(fd_, 16);
    socklen_t len = sizeof a;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~Impostor() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  int port() const { return port_; }
  bool ok() const { return ok_; }
  /// Everything received, per connection (waits up to 3 s for the client's first connection to
  /// end: the client's error and the impostor's reading race).
  std::vector<std::string> received() {
    Deadline d = Deadline::after(3s);
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!received_.empty() || d.expired()) return received_;
      }
      std::this_thread::sleep_for(5ms);
    }
  }

 private:
  void run() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) continue;
      std::string got;
      bool answered = false;
      // Read whatever the client sends until it closes (or 2 s): a client that went on after a
      // bad challenge would show its auth here.
      Deadline d = Deadline::after(2s);
      while (!d.expired() && !stop_) {
        pollfd q{c, POLLIN, 0};
        if (::poll(&q, 1, 20) <= 0) continue;
        char buf[4096];
        ssize_t n = ::recv(c, buf, sizeof buf, 0);
        if (n <= 0) break;
        got.append(buf, static_cast<size_t>(n));
        wire::Message hello;
        if (!answered && wire::decode(reinterpret_cast<const uint8_t*>(got.data()), got.size(),
                                      wire::Direction::request, wire::Limits{}, hello)
                                 .status == wire::DecodeStatus::ok) {
          answered = true;
          const std::string reply = answer_(hello);
          if (!reply.empty()) (void)!::send(c, reply.data(), reply.size(), MSG_NOSIGNAL);
        }
      }
      ::close(c);
      std::lock_guard<std::mutex> lock(mu_);
      received_.push_back(got);
    }
  }
  Answer answer_;
  int fd_ = -1;
  int port_ = 0;
  bool ok_ = false;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<std::string> received_;
  std::thread thread_;
};

}  // namespace gz::test
