#include "gz/store/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>

#include "gz/core/error.h"
#include "gz/core/log.h"
#include "store/store_state.h"
#include "store/wire.h"

namespace gz {

namespace {

std::atomic<uint64_t> g_requests{0};  // see TcpStore::requests_sent()

// Room for keys and framing on top of the largest value.
constexpr size_t kFrameSlack = 1u << 20;
// Clients accept replies up to this size (the server enforces its own, smaller, limits).
constexpr size_t kClientMaxBody = 2048u << 20;
// Longest server-side wait a request may ask for (a day): keeps time arithmetic sane.
constexpr int64_t kMaxWaitMs = 24LL * 3600 * 1000;
// Connections beyond max_clients that still get a polite refusal (then they are just closed).
constexpr size_t kMaxRefusing = 64;
// How long a closing connection is drained before it is closed for good.
constexpr Duration kLinger{1000};
// After its deadline a client waits this much longer for the server's own "timeout" reply.
constexpr Duration kReplyGrace{500};

void set_nonblocking(int fd) {
  int fl = fcntl(fd, F_GETFL, 0);
  if (fl >= 0) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s.substr(0, 200)) out += (c >= 32 && c < 127) ? static_cast<char>(c) : '?';
  if (s.size() > 200) out += "...";
  return out;
}

std::string join_keys(const std::vector<std::string>& keys) {
  std::string out;
  for (size_t i = 0; i < keys.size() && i < 16; ++i) out += (i ? ", " : "") + printable(keys[i]);
  if (keys.size() > 16) out += ", ... (" + std::to_string(keys.size()) + " keys)";
  return out;
}

bool tokens_equal(const std::string& a, const std::string& b) {
  // Length leaks, content does not: compare every byte.
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? a[i] : 0, y = i < b.size() ? b[i] : 0;
    diff |= static_cast<unsigned>(x ^ y);
  }
  return diff == 0;
}

wire::Message make(uint8_t code, int64_t num = 0, std::vector<std::string> parts = {}) {
  wire::Message m;
  m.code = code;
  m.num = num;
  m.parts = std::move(parts);
  return m;
}

wire::Message make_reply(wire::Reply code, std::string text = {}) {
  return make(static_cast<uint8_t>(code), 0, text.empty() ? std::vector<std::string>{} : std::vector<std::string>{text});
}

// An error reply with num = 1: the server closes the connection after sending it.
wire::Message closing_reply(wire::Reply code, std::string text) {
  wire::Message m = make_reply(code, std::move(text));
  m.num = 1;
  return m;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Server: one thread, poll() over the listening socket, a wake-up pipe and every connection.

struct TcpStoreServer::Impl {
  struct Conn {
    int fd = -1;
    std::string peer;
    std::string in;
    std::string out;
    size_t out_off = 0;
    bool authed = false;
    bool closing = false;  // close once `out` is flushed
    bool blocked = false;  // a get/wait is parked until keys appear or `deadline`
    wire::Message pending;
    Clock::time_point deadline{};
    bool fd_dead = false;  // to be closed and removed at the end of this round
    // Closing with unread input makes the kernel send a reset, which can destroy our error reply
    // before the client reads it: shut down our side, drain input briefly, then close.
    bool lingering = false;
    Clock::time_point linger_until{};
  };

  TcpStoreServerOptions opts;
  wire::Limits limits;
  wire::StoreState state;
  int listen_fd = -1;
  int wake[2] = {-1, -1};
  int bound_port = 0;
  std::atomic<bool> stopping{false};
  std::vector<Conn> conns;
  size_t buffered = 0;  // bytes in every connection's input buffer
  std::thread thread;
  std::mutex stop_mu;
  Clock::time_point last_accept_warning{};

  explicit Impl(const TcpStoreServerOptions& o) : opts(o), state(o.max_total_bytes) {
    limits.max_body_bytes = o.max_value_bytes + kFrameSlack;
  }

  void open() {
    GZ_CHECK_ARG(opts.port >= 0 && opts.port <= 65535, "TcpStoreServer port ", opts.port);
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* res = nullptr;
    std::string port = std::to_string(opts.port);
    int rc = getaddrinfo(opts.bind_addr.empty() ? nullptr : opts.bind_addr.c_str(), port.c_str(), &hints, &res);
    if (rc != 0)
      GZ_THROW(InvalidArgument, "store server: cannot resolve bind address '", opts.bind_addr, "': ", gai_strerror(rc));
    int err = 0;
    for (addrinfo* a = res; a; a = a->ai_next) {
      int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) {
        err = errno;
        continue;
      }
      int one = 1;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 1024) == 0) {
        listen_fd = fd;
        break;
      }
      err = errno;
      ::close(fd);
    }
    freeaddrinfo(res);
    if (listen_fd < 0)
      throw SystemError("store server: cannot listen on " + opts.bind_addr + ":" + port, err);
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    getsockname(listen_fd, reinterpret_cast<sockaddr*>(&ss), &len);
    bound_port = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                          : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    set_nonblocking(listen_fd);
    if (pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
      int e = errno;
      ::close(listen_fd);
      throw SystemError("store server: pipe", e);
    }
    thread = std::thread([this] { loop(); });
  }

  void stop() {
    std::lock_guard<std::mutex> lock(stop_mu);
    if (!thread.joinable()) return;
    stopping = true;
    char c = 1;
    ssize_t n = ::write(wake[1], &c, 1);
    (void)n;
    thread.join();
    for (auto& c2 : conns) ::close(c2.fd);
    conns.clear();
    ::close(listen_fd);
    ::close(wake[0]);
    ::close(wake[1]);
    listen_fd = wake[0] = wake[1] = -1;
  }

  void queue(Conn& c, const wire::Message& m) { wire::encode(m, c.out); }

  void flush(Conn& c) {
    while (c.out_off < c.out.size()) {
      ssize_t n = ::send(c.fd, c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_NOSIGNAL);
      if (n > 0) {
        c.out_off += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
      c.closing = true;  // peer gone: drop the rest
      c.out.clear();
      c.out_off = 0;
      c.fd_dead = true;
      return;
    }
    c.out.clear();
    c.out_off = 0;
  }

  // Parse and run requests while the connection is free to answer.
  void process(Conn& c) {
    while (!c.closing && !c.blocked && c.out.empty() && !c.in.empty()) {
      wire::Message req;
      auto r = wire::decode(reinterpret_cast<const uint8_t*>(c.in.data()), c.in.size(), wire::Direction::request,
                            limits, req);
      if (r.status == wire::DecodeStatus::need_more) return;
      if (r.status != wire::DecodeStatus::ok) {
        GZ_LOG(warn, "store server: closing connection from ", c.peer, ": ", r.error);
        queue(c, closing_reply(wire::Reply::invalid, "malformed request: " + r.error));
        c.closing = true;
        drop_input(c);
        return;
      }
      buffered -= r.consumed;
      c.in.erase(0, r.consumed);
      handle(c, req);
    }
  }

  void drop_input(Conn& c) {
    buffered -= c.in.size();
    c.in.clear();
    c.in.shrink_to_fit();
  }

  void handle(Conn& c, const wire::Message& req) {
    if (!c.authed) {
      if (req.code != static_cast<uint8_t>(wire::Op::hello)) {
        queue(c, closing_reply(wire::Reply::refused, "expected hello as the first message"));
        c.closing = true;
      } else if (req.num != wire::kProtocolVersion) {
        queue(c, closing_reply(wire::Reply::refused, "protocol version " + std::to_string(req.num) +
                                                      " not supported (server speaks " +
                                                      std::to_string(wire::kProtocolVersion) + ")"));
        c.closing = true;
      } else if (!opts.token.empty() && !tokens_equal(req.parts[0], opts.token)) {
        GZ_LOG(warn, "store server: refused ", c.peer, ": wrong or missing rendezvous token");
        queue(c, closing_reply(wire::Reply::refused, "rendezvous token refused"));
        c.closing = true;
      } else {
        c.authed = true;
        queue(c, make_reply(wire::Reply::ok));
      }
      return;
    }
    wire::Message reply;
    if (state.apply(req, reply) == wire::StoreState::Outcome::blocked) {
      c.blocked = true;
      c.pending = req;
      int64_t ms = std::clamp<int64_t>(req.num, 0, kMaxWaitMs);
      c.deadline = Clock::now() + Duration(ms);
      return;
    }
    queue(c, reply);
  }

  // After a change, answer parked requests that can now complete; time out the expired ones.
  void retry_blocked(Clock::time_point now) {
    for (auto& c : conns) {
      if (!c.blocked || c.closing) continue;
      wire::Message reply;
      if (state.apply(c.pending, reply) == wire::StoreState::Outcome::done) {
        c.blocked = false;
        queue(c, reply);
      } else if (now >= c.deadline) {
        c.blocked = false;
        queue(c, make(static_cast<uint8_t>(wire::Reply::timeout), 0, state.missing(c.pending)));
      }
    }
  }

  void accept_all() {
    for (;;) {
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      int fd = accept4(listen_fd, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        // Out of descriptors (or similar): the listening socket stays readable, so back off
        // instead of spinning, and do not flood the log.
        auto now = Clock::now();
        if (now - last_accept_warning > std::chrono::seconds(5)) {
          GZ_LOG(warn, "store server: accept: ", std::strerror(errno), " (", conns.size(), " clients connected)");
          last_accept_warning = now;
        }
        std::this_thread::sleep_for(Duration(10));
        return;
      }
      char host[INET6_ADDRSTRLEN] = "?";
      int port = 0;
      if (ss.ss_family == AF_INET) {
        auto* a = reinterpret_cast<sockaddr_in*>(&ss);
        inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
        port = ntohs(a->sin_port);
      } else if (ss.ss_family == AF_INET6) {
        auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
        inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
        port = ntohs(a->sin6_port);
      }
      Conn c;
      c.fd = fd;
      c.peer = std::string(host) + ":" + std::to_string(port);
      if (conns.size() >= opts.max_clients) {
        GZ_LOG(warn, "store server: refusing ", c.peer, ": ", conns.size(), " clients connected (max_clients)");
        if (conns.size() >= opts.max_clients + kMaxRefusing) {  // a flood: no courtesy
          ::close(fd);
          continue;
        }
        queue(c, closing_reply(wire::Reply::refused, "too many clients"));
        c.closing = true;
      }
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      conns.push_back(std::move(c));
    }
  }

  // Read what is there; false when the connection must go away now.
  bool read_some(Conn& c) {
    char buf[65536];
    // Bound the work per wake-up so one fast sender cannot starve the others.
    for (int round = 0; round < 16; ++round) {
      ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
      if (n == 0) return false;
      if (n < 0) {
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK;
      }
      if (c.closing) continue;  // discard: we are only flushing an error reply
      c.in.append(buf, static_cast<size_t>(n));
      buffered += static_cast<size_t>(n);
      // A well-behaved client has at most one request in flight; anything beyond one maximal
      // frame, or beyond the server-wide budget, is abuse.
      if (c.in.size() > limits.max_body_bytes + 2 * wire::kHeaderBytes + 65536 ||
          buffered > opts.max_total_bytes) {
        GZ_LOG(warn, "store server: closing ", c.peer, ": input buffer limit exceeded");
        drop_input(c);
        return false;
      }
      if (static_cast<size_t>(n) < sizeof buf) break;
    }
    return true;
  }

  void loop() {
    std::vector<pollfd> pfds;
    while (!stopping) {
      auto now = Clock::now();
      int timeout = -1;
      for (auto& c : conns)
        if (c.blocked) {
          auto ms = std::chrono::duration_cast<Duration>(c.deadline - now).count() + 1;
          ms = std::max<long long>(0, ms);
          if (timeout < 0 || ms < timeout) timeout = static_cast<int>(std::min<long long>(ms, 1 << 30));
        }
      for (auto& c : conns) {
        if (!c.fd_dead && !c.blocked && !c.closing && c.out.empty() && !c.in.empty()) timeout = 0;
        if (c.lingering) {
          auto ms = std::max<long long>(0, std::chrono::duration_cast<Duration>(c.linger_until - now).count() + 1);
          if (timeout < 0 || ms < timeout) timeout = static_cast<int>(ms);
        }
      }
      pfds.clear();
      pfds.push_back({wake[0], POLLIN, 0});
      pfds.push_back({listen_fd, POLLIN, 0});
      for (auto& c : conns) {
        short ev = POLLIN;
        if (!c.out.empty()) ev |= POLLOUT;
        pfds.push_back({c.fd, ev, 0});
      }
      int n = ::poll(pfds.data(), pfds.size(), timeout);
      if (n < 0) {
        if (errno == EINTR) continue;
        GZ_LOG(error, "store server: poll: ", std::strerror(errno));
        std::this_thread::sleep_for(Duration(10));
        continue;
      }
      if (stopping) break;
      // Connections first (indices match pfds from 2), then accept: accepting appends to conns.
      for (size_t i = 0; i < conns.size(); ++i) {
        Conn& c = conns[i];
        short re = pfds[i + 2].revents;
        if (re & (POLLIN | POLLHUP | POLLERR)) {
          if (!read_some(c)) {
            c.fd_dead = true;
            continue;
          }
        }
        if (re & POLLOUT) flush(c);
      }
      // Run requests, answer parked waiters, flush replies; a flushed reply frees its connection
      // for its next buffered request, and a change can unblock waiters: repeat until quiet
      // (bounded, so one busy client cannot starve the poll loop).
      for (int iter = 0; iter < 64; ++iter) {
        const uint64_t version = state.version();
        bool progress = false;
        for (auto& c : conns) {
          if (c.fd_dead) continue;
          size_t had = c.in.size();
          process(c);
          progress |= c.in.size() != had;
        }
        retry_blocked(Clock::now());
        for (auto& c : conns) {
          if (c.fd_dead) continue;
          if (!c.out.empty()) flush(c);
          if (c.closing && c.out.empty() && !c.lingering) {
            ::shutdown(c.fd, SHUT_WR);
            c.lingering = true;
            c.linger_until = Clock::now() + kLinger;
          }
        }
        if (!progress && state.version() == version) break;
      }
      now = Clock::now();
      for (size_t i = 0; i < conns.size();) {
        if (conns[i].fd_dead || (conns[i].lingering && now >= conns[i].linger_until)) {
          ::close(conns[i].fd);
          buffered -= conns[i].in.size();
          conns[i] = std::move(conns.back());
          conns.pop_back();
        } else {
          ++i;
        }
      }
      if (pfds[1].revents & POLLIN) accept_all();
    }
  }
};

TcpStoreServer::TcpStoreServer(const TcpStoreServerOptions& options) : impl_(std::make_unique<Impl>(options)) {
  impl_->open();
}

TcpStoreServer::~TcpStoreServer() { stop(); }

int TcpStoreServer::port() const { return impl_->bound_port; }

void TcpStoreServer::stop() { impl_->stop(); }

// ---------------------------------------------------------------------------------------------
// Client: one connection, one request at a time (a mutex serialises threads sharing it).

struct TcpStore::Impl {
  std::string host;
  int port;
  TcpStoreOptions opts;
  std::string where;  // "host:port" for messages
  std::mutex mu;
  int fd = -1;
  wire::Limits limits;

  void close_fd() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }

  // One attempt to open a TCP connection; returns -1 and sets err on failure.
  int try_connect(Deadline deadline, int& err, std::string& resolve_error) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* res = nullptr;
    std::string p = std::to_string(port);
    int rc = getaddrinfo(host.c_str(), p.c_str(), &hints, &res);
    if (rc != 0) {
      err = EHOSTUNREACH;
      resolve_error = std::string("cannot resolve '") + host + "': " + gai_strerror(rc);
      return -1;
    }
    resolve_error.clear();
    int out = -1;
    for (addrinfo* a = res; a && out < 0; a = a->ai_next) {
      int s = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
      if (s < 0) {
        err = errno;
        continue;
      }
      if (::connect(s, a->ai_addr, a->ai_addrlen) != 0) {
        if (errno != EINPROGRESS) {
          err = errno;
          ::close(s);
          continue;
        }
        pollfd pfd{s, POLLOUT, 0};
        int pr = ::poll(&pfd, 1, std::min(deadline.remaining_ms(), 2000));
        int soerr = 0;
        socklen_t len = sizeof soerr;
        if (pr <= 0 || getsockopt(s, SOL_SOCKET, SO_ERROR, &soerr, &len) != 0 || soerr != 0) {
          err = pr == 0 ? ETIMEDOUT : (soerr ? soerr : errno);
          ::close(s);
          continue;
        }
      }
      int one = 1;
      setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      out = s;
    }
    freeaddrinfo(res);
    return out;
  }

  void send_all(const std::string& data, Deadline deadline, const std::string& what, const Stopwatch& sw) {
    size_t off = 0;
    while (off < data.size()) {
      ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
      if (n > 0) {
        off += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        pollfd pfd{fd, POLLOUT, 0};
        int pr = ::poll(&pfd, 1, deadline.remaining_ms());
        if (pr == 0) {
          close_fd();
          GZ_THROW(TimeoutError, "store ", what, " at ", where, ": sending timed out after ",
                   format_duration(sw.elapsed()));
        }
        continue;
      }
      int e = errno;
      close_fd();
      GZ_THROW(PeerError, "store ", what, " at ", where, ": connection lost while sending after ",
               format_duration(sw.elapsed()), " (", std::strerror(e), ")");
    }
  }

  // Read exactly n bytes into buf.
  void recv_exact(char* buf, size_t n, Deadline deadline, const std::string& what, const Stopwatch& sw) {
    size_t off = 0;
    while (off < n) {
      ssize_t r = ::recv(fd, buf + off, n - off, 0);
      if (r > 0) {
        off += static_cast<size_t>(r);
        continue;
      }
      if (r == 0) {
        close_fd();
        GZ_THROW(PeerError, "store ", what, " at ", where, ": the store server closed the connection after ",
                 format_duration(sw.elapsed()), " (server stopped or died)");
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        pollfd pfd{fd, POLLIN, 0};
        int pr = ::poll(&pfd, 1, deadline.remaining_ms());
        if (pr == 0) {
          // The reply may still come: this connection is out of step, start afresh next time.
          close_fd();
          GZ_THROW(TimeoutError, "store ", what, " at ", where, ": no reply after ", format_duration(sw.elapsed()));
        }
        continue;
      }
      int e = errno;
      close_fd();
      GZ_THROW(PeerError, "store ", what, " at ", where, ": connection lost after ", format_duration(sw.elapsed()),
               " (", std::strerror(e), ")");
    }
  }

  wire::Message exchange(const wire::Message& req, Deadline deadline, const std::string& what, const Stopwatch& sw) {
    send_all(wire::encode(req), deadline, what, sw);
    char hdr[wire::kHeaderBytes];
    recv_exact(hdr, sizeof hdr, deadline, what, sw);
    uint32_t body = wire::read_u32(reinterpret_cast<const uint8_t*>(hdr));
    if (body > limits.max_body_bytes) {
      close_fd();
      GZ_THROW(PeerError, "store ", what, " at ", where, ": reply of ", body, " bytes exceeds the client limit");
    }
    std::string frame(hdr, sizeof hdr);
    frame.resize(sizeof hdr + body);
    recv_exact(&frame[sizeof hdr], body, deadline, what, sw);
    wire::Message rep;
    auto r = wire::decode(reinterpret_cast<const uint8_t*>(frame.data()), frame.size(), wire::Direction::reply,
                          limits, rep);
    if (r.status != wire::DecodeStatus::ok) {
      close_fd();
      GZ_THROW(PeerError, "store ", what, " at ", where, ": malformed reply: ", r.error);
    }
    return rep;
  }

  void connect(Deadline deadline) {
    Stopwatch sw;
    Duration backoff(10);
    int err = 0;
    std::string resolve_error;
    for (;;) {
      fd = try_connect(deadline, err, resolve_error);
      if (fd >= 0) break;
      if (deadline.expired())
        GZ_THROW(TimeoutError, "store client: could not connect to the store server at ", where, " within ",
                 format_duration(sw.elapsed()), " (last error: ",
                 resolve_error.empty() ? std::strerror(err ? err : ETIMEDOUT) : resolve_error, ")");
      std::this_thread::sleep_for(std::min(backoff, deadline.remaining()));
      backoff = std::min(backoff * 2, Duration(500));
    }
    wire::Message hello = make(static_cast<uint8_t>(wire::Op::hello), wire::kProtocolVersion, {opts.token});
    wire::Message rep;
    try {
      rep = exchange(hello, deadline, "hello", sw);
    } catch (const PeerError&) {
      GZ_THROW(Error, "store client: the store server at ", where,
               " closed the connection during hello: rendezvous token refused? (check GZ_RDZV_TOKEN)");
    }
    if (rep.code == static_cast<uint8_t>(wire::Reply::refused)) {
      close_fd();
      std::string why = rep.parts.empty() ? "refused" : printable(rep.parts[0]);
      GZ_THROW(Error, "store client: the store server at ", where, " refused the connection: ", why,
               why.find("token") != std::string::npos ? " (check GZ_RDZV_TOKEN / the token option)" : "");
    }
    if (rep.code != static_cast<uint8_t>(wire::Reply::ok)) {
      close_fd();
      GZ_THROW(PeerError, "store client: unexpected ", wire::code_name(rep.code), " reply to hello from ", where);
    }
  }

  // Send one request and return an ok reply; maps every other reply to an exception.
  wire::Message request(const wire::Message& req, Deadline deadline, const std::string& what) {
    g_requests.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(mu);
    Stopwatch sw;
    if (fd < 0) connect(deadline);
    // Blocking requests tell the server the deadline; we wait a little longer for its answer.
    bool blocking = req.code == static_cast<uint8_t>(wire::Op::get) || req.code == static_cast<uint8_t>(wire::Op::wait);
    Deadline io_deadline = blocking ? Deadline(deadline.at() + kReplyGrace) : deadline;
    wire::Message rep = exchange(req, io_deadline, what, sw);
    if (rep.code != static_cast<uint8_t>(wire::Reply::ok) && rep.num == 1) close_fd();  // server hangs up
    switch (static_cast<wire::Reply>(rep.code)) {
      case wire::Reply::ok:
        return rep;
      case wire::Reply::timeout:
        GZ_THROW(TimeoutError, "store ", what, " at ", where, " timed out after ", format_duration(sw.elapsed()),
                 "; missing keys: ", join_keys(rep.parts));
      case wire::Reply::invalid:
        GZ_THROW(InvalidArgument, "store ", what, " at ", where, ": ", rep.parts.empty() ? "" : rep.parts[0]);
      case wire::Reply::error:
      case wire::Reply::refused:
        GZ_THROW(Error, "store ", what, " at ", where, ": ", rep.parts.empty() ? "" : rep.parts[0]);
    }
    close_fd();
    GZ_THROW(PeerError, "store ", what, " at ", where, ": unexpected reply ", wire::code_name(rep.code));
  }
};

namespace {

std::string as_str(const Bytes& b) { return std::string(b.begin(), b.end()); }
Bytes as_bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }

int64_t wait_ms(Deadline d) { return static_cast<int64_t>(d.remaining().count()); }

void check_size(const std::string& key, size_t bytes) {
  if (bytes > (size_t{1} << 31))
    GZ_THROW(InvalidArgument, "store set('", printable(key), "'): value of ", bytes, " bytes is too large");
}

}  // namespace

TcpStore::TcpStore(const std::string& host, int port, const TcpStoreOptions& options)
    : impl_(std::make_unique<Impl>()) {
  GZ_CHECK_ARG(port > 0 && port <= 65535, "TcpStore port ", port, " for host ", host);
  impl_->host = host;
  impl_->port = port;
  impl_->opts = options;
  impl_->where = (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
  impl_->limits.max_body_bytes = kClientMaxBody;
  impl_->limits.max_parts = size_t{1} << 20;
  timeout_ = options.timeout;
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->connect(Deadline::after(options.timeout));
}

TcpStore::~TcpStore() { impl_->close_fd(); }

void TcpStore::set(const std::string& key, const Bytes& value) {
  check_size(key, value.size());
  impl_->request(make(static_cast<uint8_t>(wire::Op::set), 0, {key, as_str(value)}), Deadline::after(timeout_),
                 "set('" + printable(key) + "')");
}

Bytes TcpStore::get(const std::string& key, Deadline deadline) {
  auto rep = impl_->request(make(static_cast<uint8_t>(wire::Op::get), wait_ms(deadline), {key}), deadline,
                            "get('" + printable(key) + "')");
  if (rep.parts.size() != 1) GZ_THROW(PeerError, "store get('", printable(key), "'): malformed reply");
  return as_bytes(rep.parts[0]);
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  return impl_->request(make(static_cast<uint8_t>(wire::Op::add), delta, {key}), Deadline::after(timeout_),
                        "add('" + printable(key) + "')")
      .num;
}

int64_t TcpStore::append(const std::string& key, const Bytes& value) {
  check_size(key, value.size());
  return impl_->request(make(static_cast<uint8_t>(wire::Op::append), 0, {key, as_str(value)}),
                        Deadline::after(timeout_), "append('" + printable(key) + "')")
      .num;
}

Bytes TcpStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  check_size(key, expected.size() + desired.size());
  auto rep = impl_->request(make(static_cast<uint8_t>(wire::Op::compare_set), 0, {key, as_str(expected), as_str(desired)}),
                            Deadline::after(timeout_), "compare_set('" + printable(key) + "')");
  if (rep.parts.size() != 1) GZ_THROW(PeerError, "store compare_set('", printable(key), "'): malformed reply");
  return as_bytes(rep.parts[0]);
}

void TcpStore::wait(const std::vector<std::string>& keys, Deadline deadline) {
  impl_->request(make(static_cast<uint8_t>(wire::Op::wait), wait_ms(deadline), keys), deadline,
                 "wait(" + join_keys(keys) + ")");
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  return impl_->request(make(static_cast<uint8_t>(wire::Op::check), 0, keys), Deadline::after(timeout_),
                        "check(" + join_keys(keys) + ")")
             .num != 0;
}

bool TcpStore::delete_key(const std::string& key) {
  return impl_->request(make(static_cast<uint8_t>(wire::Op::delete_key), 0, {key}), Deadline::after(timeout_),
                        "delete_key('" + printable(key) + "')")
             .num != 0;
}

uint64_t TcpStore::requests_sent() { return g_requests.load(std::memory_order_relaxed); }

int64_t TcpStore::num_keys() {
  return impl_->request(make(static_cast<uint8_t>(wire::Op::num_keys)), Deadline::after(timeout_), "num_keys").num;
}

}  // namespace gz
