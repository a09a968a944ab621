// TCP store client: one connection, one request at a time (a mutex serialises threads sharing
// it). The server lives in tcp_store_server.cpp.
#include "gz/store/tcp_store.h"

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
#include "gz/store/rdzv_auth.h"
#include "store/handshake.h"
#include "store/tcp_common.h"
#include "store/wire.h"

namespace gz {

namespace {

using wire::make;
using wire::printable;

std::atomic<uint64_t> g_requests{0};  // see TcpStore::requests_sent()

// Clients accept replies up to this size (the server enforces its own, smaller, limits).
constexpr size_t kClientMaxBody = 2048u << 20;
// After its deadline a client waits this much longer for the server's own "timeout" reply.
constexpr Duration kReplyGrace{500};
// One handshake attempt waits at most this long for the server (which closes an unauthenticated
// connection itself after its auth_timeout, 5 s by default).
constexpr Duration kHandshakeTry{10000};
// Largest reply to a handshake message: a challenge, or a refusal with its reason.
constexpr size_t kMaxHandshakeReply = wire::kMaxChallengeBodyBytes + 1024;

std::string join_keys(const std::vector<std::string>& keys) {
  std::string out;
  for (size_t i = 0; i < keys.size() && i < 16; ++i) out += (i ? ", " : "") + printable(keys[i]);
  if (keys.size() > 16) out += ", ... (" + std::to_string(keys.size()) + " keys)";
  return out;
}

}  // namespace

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

  // Read exactly n bytes into buf; `*got_any` (optional) is set once a byte came.
  void recv_exact(char* buf, size_t n, Deadline deadline, const std::string& what, const Stopwatch& sw,
                  bool* got_any = nullptr) {
    size_t off = 0;
    while (off < n) {
      ssize_t r = ::recv(fd, buf + off, n - off, 0);
      if (r > 0) {
        off += static_cast<size_t>(r);
        if (got_any) *got_any = true;
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
          GZ_THROW(TimeoutError, "store ", what, " at ", where, ": no reply after ",
                   format_duration(sw.elapsed()));
        }
        continue;
      }
      int e = errno;
      close_fd();
      GZ_THROW(PeerError, "store ", what, " at ", where, ": connection lost after ",
               format_duration(sw.elapsed()), " (", std::strerror(e), ")");
    }
  }

  // `*answered` (optional) tells whether any byte of a reply came before a failure: a server that
  // closes without a word sheds load; one that answers garbage is not a store of ours.
  // `max_body` (optional) bounds the reply below the client's limit (handshake replies are small).
  wire::Message exchange(const wire::Message& req, Deadline deadline, const std::string& what,
                         const Stopwatch& sw, bool* answered = nullptr, size_t max_body = 0) {
    if (answered) *answered = false;
    send_all(wire::encode(req), deadline, what, sw);
    char hdr[wire::kHeaderBytes];
    recv_exact(hdr, sizeof hdr, deadline, what, sw, answered);
    uint32_t body = wire::read_u32(reinterpret_cast<const uint8_t*>(hdr));
    if (body > (max_body ? max_body : limits.max_body_bytes)) {
      close_fd();
      GZ_THROW(PeerError, "store ", what, " at ", where, ": reply of ", body,
               " bytes exceeds the client limit");
    }
    std::string frame(hdr, sizeof hdr);
    frame.resize(sizeof hdr + body);
    recv_exact(&frame[sizeof hdr], body, deadline, what, sw);
    wire::Message rep;
    auto r = wire::decode(reinterpret_cast<const uint8_t*>(frame.data()), frame.size(),
                          wire::Direction::reply, limits, rep);
    if (r.status != wire::DecodeStatus::ok) {
      close_fd();
      GZ_THROW(PeerError, "store ", what, " at ", where, ": malformed reply: ", r.error);
    }
    return rep;
  }

  [[noreturn]] void refused(const wire::Message& rep, const std::string& step) {
    close_fd();
    std::string why = rep.parts.empty() ? "refused" : printable(rep.parts[0]);
    if (rep.code == static_cast<uint8_t>(wire::Reply::refused))
      GZ_THROW(Error, "store client: the store server at ", where, " refused the connection: ", why,
               why.find("token") != std::string::npos ? " (check GZ_RDZV_TOKEN / the token option)" : "");
    GZ_THROW(PeerError, "store client: unexpected ", wire::code_name(rep.code), " reply to ", step, " from ",
             where, ": ", why);
  }

  // Check the server's challenge; returns the proof to answer it with (empty without a token).
  // Nothing derived from the token leaves this process unless the server proved it knows it.
  std::string answer_challenge(const wire::Message& ch, const std::string& client_nonce) {
    if (ch.code != static_cast<uint8_t>(wire::Reply::challenge)) refused(ch, "hello");
    const bool well_formed = ch.parts.size() == 4 && ch.parts[0].size() == wire::kNonceBytes &&
                             ch.parts[1].size() == wire::kSaltBytes &&
                             (ch.parts[2].empty() || ch.parts[2].size() == wire::kProofBytes) &&
                             ch.parts[3].size() <= wire::kMaxServerNameBytes;
    if (!well_formed) {
      close_fd();
      GZ_THROW(Error, "store client: the server at ", where,
               " answered hello with a malformed challenge: it is not a gz store of this version");
    }
    const std::string &server_nonce = ch.parts[0], &salt = ch.parts[1], &proof = ch.parts[2],
                      &name = ch.parts[3];
    std::string key;
    if (opts.token.empty() && !proof.empty()) {
      // Answering would only earn "token refused", which misleads when the port is simply taken.
      close_fd();
      GZ_THROW(Error, "store client: the store server at ", where,
               " has a rendezvous token and this client has none: either this job's ranks need the same "
               "GZ_RDZV_TOKEN (or token option), or the port is taken by another job's store (pick a free "
               "MASTER_PORT); nothing was sent");
    }
    if (!opts.token.empty()) {
      if (proof.empty()) {
        close_fd();
        GZ_THROW(Error, "store client: the store server at ", where,
                 " runs without a rendezvous token, so it cannot prove it is the store this client's token "
                 "belongs to; refusing it (nothing derived from the token was sent)");
      }
      key = wire::handshake_key(opts.token, salt);
      if (!wire::proofs_equal(
              proof, wire::handshake_proof(key, wire::Prover::server, name, client_nonce, server_nonce))) {
        close_fd();
        GZ_THROW(Error, "store client: the server at ", where,
                 " did not prove that it knows the rendezvous token: it has another token, or it is not "
                 "this job's store (another job or program listens on that port); refusing it (nothing "
                 "derived from the token was sent)");
      }
    }
    if (!opts.server_name.empty() && name != opts.server_name) {
      close_fd();
      GZ_THROW(Error, "store client: the store server at ", where, " is ",
               name.empty() ? std::string("unnamed") : "'" + printable(name) + "'", ", not '",
               printable(opts.server_name), "' (another job's store with the same token?); refusing it");
    }
    return key.empty() ? std::string()
                       : wire::handshake_proof(key, wire::Prover::client, name, client_nonce, server_nonce);
  }

  // One handshake on the open connection (see store/handshake.h). Returns true when authenticated,
  // false when the server closed without a word or did not answer within `per_try` (load
  // shedding: the caller retries); throws when the server refused or is not to be trusted.
  bool handshake(Deadline deadline, const Stopwatch& sw) {
    const std::string nonce = wire::random_bytes(wire::kNonceBytes);
    wire::Message ch, rep;
    bool answered = false;
    try {
      ch = exchange(make(static_cast<uint8_t>(wire::Op::hello), wire::kProtocolVersion, {nonce}), deadline,
                    "hello", sw, &answered, kMaxHandshakeReply);
    } catch (const PeerError& e) {
      close_fd();
      if (!answered) return false;
      GZ_THROW(Error, "store client: the server at ", where,
               " answered hello with something that is not the gz store protocol (another program listens on "
               "that port?): ",
               e.what());
    }
    const std::string proof = answer_challenge(ch, nonce);
    try {
      rep = exchange(make(static_cast<uint8_t>(wire::Op::auth), 0, {proof}), deadline, "auth", sw, &answered,
                     kMaxHandshakeReply);
    } catch (const PeerError&) {
      close_fd();
      if (!answered) return false;
      throw;
    }
    if (rep.code == static_cast<uint8_t>(wire::Reply::ok)) return true;
    refused(rep, "auth");
  }

  // Open a connection and authenticate. A server under load closes unauthenticated connections
  // without a word (slots full) and a busy one may be slow to answer: both are retried like a
  // refused connect, until the deadline. Everything else handshake() throws is final.
  void connect(Deadline deadline) {
    Stopwatch sw;
    Duration backoff(10);
    int err = 0, silent_closes = 0, unanswered = 0;
    std::string resolve_error;
    for (;;) {
      fd = try_connect(deadline, err, resolve_error);
      if (fd >= 0) {
        // Bounded per try: a server answers hello at once or closes the connection itself
        // within its auth_timeout (5 s by default).
        const Deadline attempt(std::min(deadline.at(), Clock::now() + kHandshakeTry));
        try {
          if (handshake(attempt, sw)) return;
          ++silent_closes;
        } catch (const TimeoutError&) {
          close_fd();
          ++unanswered;
        }
      }
      if (deadline.expired()) {
        if (silent_closes + unanswered > 0)
          GZ_THROW(TimeoutError, "store client: the store server at ", where, " closed the connection (",
                   silent_closes, " time(s)) or did not answer (", unanswered,
                   " time(s)) before authenticating within ", format_duration(sw.elapsed()),
                   " (overloaded, flooded with unauthenticated connections, or not a gz store?)");
        GZ_THROW(TimeoutError, "store client: could not connect to the store server at ", where, " within ",
                 format_duration(sw.elapsed()), " (last error: ",
                 resolve_error.empty() ? std::strerror(err ? err : ETIMEDOUT) : resolve_error, ")");
      }
      std::this_thread::sleep_for(std::min(backoff, deadline.remaining()));
      backoff = std::min(backoff * 2, Duration(500));
    }
  }

  // Send one request and return an ok reply; maps every other reply to an exception.
  wire::Message request(const wire::Message& req, Deadline deadline, const std::string& what) {
    g_requests.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(mu);
    Stopwatch sw;
    if (fd < 0) connect(deadline);
    // Blocking requests tell the server the deadline; we wait a little longer for its answer.
    bool blocking =
        req.code == static_cast<uint8_t>(wire::Op::get) || req.code == static_cast<uint8_t>(wire::Op::wait);
    Deadline io_deadline = blocking ? Deadline(deadline.at() + kReplyGrace) : deadline;
    wire::Message rep = exchange(req, io_deadline, what, sw);
    if (rep.code != static_cast<uint8_t>(wire::Reply::ok) && rep.num == 1) close_fd();  // server hangs up
    switch (static_cast<wire::Reply>(rep.code)) {
      case wire::Reply::ok:
        return rep;
      case wire::Reply::timeout:
        GZ_THROW(TimeoutError, "store ", what, " at ", where, " timed out after ",
                 format_duration(sw.elapsed()), "; missing keys: ", join_keys(rep.parts));
      case wire::Reply::invalid:
        GZ_THROW(InvalidArgument, "store ", what, " at ", where, ": ", rep.parts.empty() ? "" : rep.parts[0]);
      case wire::Reply::error:
      case wire::Reply::refused:
        GZ_THROW(Error, "store ", what, " at ", where, ": ", rep.parts.empty() ? "" : rep.parts[0]);
      case wire::Reply::challenge:
        break;  // only ever the answer to hello
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
  check_rdzv_token(options.token, "store client");
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
  impl_->request(make(static_cast<uint8_t>(wire::Op::set), 0, {key, as_str(value)}),
                 Deadline::after(timeout_), "set('" + printable(key) + "')");
}

Bytes TcpStore::get(const std::string& key, Deadline deadline) {
  auto rep = impl_->request(make(static_cast<uint8_t>(wire::Op::get), wait_ms(deadline), {key}), deadline,
                            "get('" + printable(key) + "')");
  if (rep.parts.size() != 1) GZ_THROW(PeerError, "store get('", printable(key), "'): malformed reply");
  return as_bytes(rep.parts[0]);
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  return impl_
      ->request(make(static_cast<uint8_t>(wire::Op::add), delta, {key}), Deadline::after(timeout_),
                "add('" + printable(key) + "')")
      .num;
}

int64_t TcpStore::append(const std::string& key, const Bytes& value) {
  check_size(key, value.size());
  return impl_
      ->request(make(static_cast<uint8_t>(wire::Op::append), 0, {key, as_str(value)}),
                Deadline::after(timeout_), "append('" + printable(key) + "')")
      .num;
}

Bytes TcpStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  check_size(key, expected.size() + desired.size());
  auto rep = impl_->request(
      make(static_cast<uint8_t>(wire::Op::compare_set), 0, {key, as_str(expected), as_str(desired)}),
      Deadline::after(timeout_), "compare_set('" + printable(key) + "')");
  if (rep.parts.size() != 1)
    GZ_THROW(PeerError, "store compare_set('", printable(key), "'): malformed reply");
  return as_bytes(rep.parts[0]);
}

void TcpStore::wait(const std::vector<std::string>& keys, Deadline deadline) {
  impl_->request(make(static_cast<uint8_t>(wire::Op::wait), wait_ms(deadline), keys), deadline,
                 "wait(" + join_keys(keys) + ")");
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  return impl_
             ->request(make(static_cast<uint8_t>(wire::Op::check), 0, keys), Deadline::after(timeout_),
                       "check(" + join_keys(keys) + ")")
             .num != 0;
}

bool TcpStore::delete_key(const std::string& key) {
  return impl_
             ->request(make(static_cast<uint8_t>(wire::Op::delete_key), 0, {key}), Deadline::after(timeout_),
                       "delete_key('" + printable(key) + "')")
             .num != 0;
}

uint64_t TcpStore::requests_sent() { return g_requests.load(std::memory_order_relaxed); }

int64_t TcpStore::num_keys() {
  return impl_->request(make(static_cast<uint8_t>(wire::Op::num_keys)), Deadline::after(timeout_), "num_keys")
      .num;
}

}  // namespace gz
