// TCP store server: one thread, epoll over the listening socket, a wake-up pipe and every
// connection (a wake-up costs what is ready, not what is open). A connection is unauthenticated until its
// handshake (handshake.h: hello, challenge, auth) succeeds: until then it holds one of a bounded number of
// slots (admission.h), may buffer one small handshake message and nothing else, and is closed when its
// auth_timeout passes. Authenticated connections are never closed to make room, and the work done per loop
// iteration for unauthenticated ones is bounded, so a flood of them cannot starve the ranks' requests.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "gz/core/error.h"
#include "gz/core/log.h"
#include "gz/store/rdzv_auth.h"
#include "gz/store/tcp_store.h"
#include "store/admission.h"
#include "store/handshake.h"
#include "store/peer_identity.h"
#include "store/store_state.h"
#include "store/tcp_common.h"
#include "store/wire.h"

namespace gz {

namespace {

// Room for keys and framing on top of the largest value.
constexpr size_t kFrameSlack = 1u << 20;
// Longest server-side wait a request may ask for (a day): keeps time arithmetic sane.
constexpr int64_t kMaxWaitMs = 24LL * 3600 * 1000;
// How long a closing connection is drained before it is closed for good.
constexpr Duration kLinger{1000};
// Connections accepted per loop iteration: a connect flood is taken in batches, with the
// authenticated clients' requests served in between.
constexpr int kAcceptBatch = 64;
// epoll ids of the two fixed descriptors; connection ids start above them.
constexpr uint64_t kWakeId = 0, kListenId = 1, kFirstConnId = 2;

using wire::AbuseLog;
using wire::HandshakeVerdict;

}  // namespace

struct TcpStoreServer::Impl {
  struct Conn {
    int fd = -1;
    uint64_t id = 0;
    std::string peer;    // "addr:port" for messages
    std::string source;  // admission key (local user, else address or IPv6 /64)
    long long uid = -1;  // the local user owning the peer's socket; -1: remote or unknown
    std::string in;
    std::string out;
    size_t out_off = 0;
    bool authed = false;
    bool challenged = false;  // the hello was answered; the auth is due
    // The client proof this connection must present, computed once when the hello is answered
    // (empty without a token): a connection that waits is never judged again at HMAC's cost.
    std::string expected_proof;
    bool fresh = false;    // unauthenticated: bytes arrived since its handshake was last judged
    bool tracked = false;  // holds an unauthenticated slot in `admission`
    Clock::time_point auth_deadline{};
    bool closing = false;  // close once `out` is flushed
    bool blocked = false;  // a get/wait is parked until keys appear or `deadline`
    wire::Message pending;
    Clock::time_point deadline{};
    bool fd_dead = false;  // to be closed and removed at the end of this round
    // Closing with unread input makes the kernel send a reset, which can destroy our error reply
    // before the client reads it: shut down our side, drain input briefly, then close.
    bool lingering = false;
    Clock::time_point linger_until{};
    uint32_t registered = 0;  // epoll events currently asked for
  };

  struct Counters {
    std::atomic<uint64_t> accepted{0}, authenticated{0}, wrong_token{0}, bad_hello{0}, oversized{0},
        auth_timeouts{0}, evicted{0}, handshake_passes{0};
    std::atomic<size_t> clients{0}, pending{0}, peak_pending{0}, peak_pending_bytes{0};
  };

  TcpStoreServerOptions opts;
  std::string salt;  // of the key derived from the token (handshake_key)
  std::string key;   // empty without a token
  wire::Limits limits;
  wire::StoreState state;
  wire::Admission admission;
  wire::PeerIdentity identity;  // local peers' users (their admission key)
  bool told_identity = false;   // that peers' users cannot be told apart here (logged once)
  // Without a token (and without allow_insecure) only this user's processes are admitted.
  bool owner_only = false;
  long long owner_uid = static_cast<long long>(::geteuid());
  AbuseLog abuse;
  Counters st;
  int listen_fd = -1;
  int wake[2] = {-1, -1};
  int ep = -1;
  int bound_port = 0;
  std::atomic<bool> stopping{false};
  std::vector<Conn> conns;
  size_t buffered = 0;  // bytes in every connection's input buffer
  size_t authed_count = 0;
  uint64_t next_id = kFirstConnId;
  std::unordered_map<uint64_t, size_t> index;  // connection id -> position in conns
  std::unordered_set<uint64_t> evict;          // ids to close at the next pass
  std::thread thread;
  std::mutex stop_mu;
  Clock::time_point last_accept_warning{};

  static wire::AdmissionLimits admission_limits(const TcpStoreServerOptions& o) {
    wire::AdmissionLimits l;
    l.max_pending = o.max_pending_auth;
    l.max_pending_per_source = o.max_pending_per_source;
    return l;
  }

  explicit Impl(const TcpStoreServerOptions& o)
      : opts(o), state(o.max_total_bytes), admission(admission_limits(o)) {
    limits.max_body_bytes = o.max_value_bytes + kFrameSlack;
  }

  void validate() const {
    GZ_CHECK_ARG(opts.port >= 0 && opts.port <= 65535, "TcpStoreServer port ", opts.port);
    check_rdzv_token(opts.token, "store server");
    if (opts.token.empty() && !opts.allow_insecure && !is_loopback_host(opts.bind_addr))
      GZ_THROW(InvalidArgument, "store server: listening on '", opts.bind_addr.empty() ? "*" : opts.bind_addr,
               "' reaches beyond loopback, so it needs a rendezvous token (GZ_RDZV_TOKEN); allow_insecure "
               "(GZ_RDZV_INSECURE=1, gzrun --rdzv-insecure) opts out on a network you trust completely");
    GZ_CHECK_ARG(opts.auth_timeout.count() > 0, "TcpStoreServer auth_timeout must be positive");
    GZ_CHECK_ARG(opts.max_clients > 0, "TcpStoreServer max_clients must be positive");
    GZ_CHECK_ARG(opts.name.size() <= wire::kMaxServerNameBytes, "TcpStoreServer name of ", opts.name.size(),
                 " bytes (at most ", wire::kMaxServerNameBytes, ")");
  }

  void open() {
    validate();
    salt = wire::random_bytes(wire::kSaltBytes);
    if (!opts.token.empty()) key = wire::handshake_key(opts.token, salt);
    owner_only = key.empty() && !opts.allow_insecure;
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* res = nullptr;
    std::string port = std::to_string(opts.port);
    int rc =
        getaddrinfo(opts.bind_addr.empty() ? nullptr : opts.bind_addr.c_str(), port.c_str(), &hints, &res);
    if (rc != 0)
      GZ_THROW(InvalidArgument, "store server: cannot resolve bind address '", opts.bind_addr,
               "': ", gai_strerror(rc));
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
    wire::set_nonblocking(listen_fd);
    if (pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
      int e = errno;
      ::close(listen_fd);
      throw SystemError("store server: pipe", e);
    }
    ep = epoll_create1(EPOLL_CLOEXEC);
    epoll_event w{}, l{};
    w.events = l.events = EPOLLIN;
    w.data.u64 = kWakeId;
    l.data.u64 = kListenId;
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, wake[0], &w) != 0 ||
        epoll_ctl(ep, EPOLL_CTL_ADD, listen_fd, &l) != 0) {
      int e = errno;
      if (ep >= 0) ::close(ep);
      ::close(listen_fd);
      ::close(wake[0]);
      ::close(wake[1]);
      throw SystemError("store server: epoll", e);
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
    std::string line = abuse.summary(Clock::now(), true);
    if (!line.empty()) GZ_LOG(warn, line);
    for (auto& c2 : conns) ::close(c2.fd);
    conns.clear();
    ::close(listen_fd);
    ::close(wake[0]);
    ::close(wake[1]);
    ::close(ep);
    listen_fd = wake[0] = wake[1] = ep = -1;
  }

  static void bump_max(std::atomic<size_t>& a, size_t v) {
    size_t cur = a.load(std::memory_order_relaxed);
    while (v > cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
    }
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

  void drop_input(Conn& c) {
    buffered -= c.in.size();
    c.in.clear();
    c.in.shrink_to_fit();
  }

  void log_abuse(AbuseLog::Kind kind, const Conn& c, const std::string& detail, Clock::time_point now) {
    std::string line = abuse.note(kind, c.source, detail, now);
    if (!line.empty()) GZ_LOG(warn, line);
  }

  // Refuse an unauthenticated client with a reason it can print, then close. Its slot becomes the
  // first to be given up: it only lingers to deliver the reason.
  void refuse(Conn& c, const std::string& text) {
    queue(c, wire::closing_reply(wire::Reply::refused, text));
    c.closing = true;
    drop_input(c);
    if (c.tracked) admission.refused(c.id, c.source);
  }

  void consume(Conn& c, size_t n) {
    buffered -= n;
    c.in.erase(0, n);
  }

  // Answer a hello: our nonce, the salt, our proof of the token (none without one) and our name;
  // and the proof we expect back, once.
  void challenge(Conn& c, const std::string& client_nonce) {
    const std::string server_nonce = wire::random_bytes(wire::kNonceBytes);
    std::string proof;
    if (!key.empty()) {
      proof = wire::handshake_proof(key, wire::Prover::server, opts.name, client_nonce, server_nonce);
      c.expected_proof =
          wire::handshake_proof(key, wire::Prover::client, opts.name, client_nonce, server_nonce);
    }
    queue(c, wire::make(static_cast<uint8_t>(wire::Reply::challenge), 0,
                        {server_nonce, salt, proof, opts.name}));
    c.challenged = true;
  }

  void admit_client(Conn& c, size_t consumed) {
    if (authed_count >= opts.max_clients) {
      GZ_LOG(warn, "store server: refusing ", c.peer, ": ", authed_count, " clients connected (max_clients)");
      ++st.bad_hello;
      refuse(c, "too many clients");
      return;
    }
    consume(c, consumed);
    c.authed = true;
    ++authed_count;
    if (c.tracked) admission.release(c.id, c.source);
    c.tracked = false;
    ++st.authenticated;
    queue(c, wire::make_reply(wire::Reply::ok));
  }

  void refuse_handshake(Conn& c, const wire::HandshakeResult& h, Clock::time_point now) {
    switch (h.verdict) {
      case HandshakeVerdict::wrong_token:
        ++st.wrong_token;
        log_abuse(AbuseLog::Kind::wrong_token, c, h.detail, now);
        refuse(c, "rendezvous token refused");
        return;
      case HandshakeVerdict::oversized:
        ++st.oversized;
        log_abuse(AbuseLog::Kind::oversized, c, h.detail, now);
        refuse(c, h.detail);
        return;
      case HandshakeVerdict::unexpected:
        ++st.bad_hello;
        log_abuse(AbuseLog::Kind::bad_hello, c, h.detail, now);
        refuse(c, "expected the handshake (hello, then auth) before any request");
        return;
      default:
        ++st.bad_hello;
        log_abuse(AbuseLog::Kind::bad_hello, c, h.detail, now);
        refuse(c, h.detail);
        return;
    }
  }

  // The handshake of an unauthenticated connection: its hello, then its auth, each judged as soon
  // as it is complete (nobody waits behind anybody else's refusals), and only when bytes arrived
  // since the last look (a connection that sent part of a message and stalls costs nothing more).
  void handshake(Conn& c, Clock::time_point now) {
    if (c.closing || c.in.empty() || !c.fresh) return;
    c.fresh = false;
    ++st.handshake_passes;
    if (!c.challenged) {
      auto h = wire::judge_hello(reinterpret_cast<const uint8_t*>(c.in.data()), c.in.size());
      if (h.verdict == HandshakeVerdict::need_more) return;
      if (h.verdict != HandshakeVerdict::accept) return refuse_handshake(c, h, now);
      if (foreign_user(c)) return;
      consume(c, h.consumed);
      challenge(c, h.nonce);
      if (c.in.empty()) return;
    }
    auto a = wire::judge_auth(reinterpret_cast<const uint8_t*>(c.in.data()), c.in.size(), c.expected_proof);
    if (a.verdict == HandshakeVerdict::need_more) return;
    if (a.verdict == HandshakeVerdict::accept) return admit_client(c, a.consumed);
    refuse_handshake(c, a, now);
  }

  // Parse and run requests while the connection is free to answer.
  void process(Conn& c, Clock::time_point now) {
    if (!c.authed) {
      handshake(c, now);
      if (!c.authed) return;
    }
    while (!c.closing && !c.blocked && c.out.empty() && !c.in.empty()) {
      wire::Message req;
      auto r = wire::decode(reinterpret_cast<const uint8_t*>(c.in.data()), c.in.size(),
                            wire::Direction::request, limits, req);
      if (r.status == wire::DecodeStatus::need_more) return;
      if (r.status != wire::DecodeStatus::ok) {
        GZ_LOG(warn, "store server: closing connection from ", c.peer, ": ", r.error);
        queue(c, wire::closing_reply(wire::Reply::invalid, "malformed request: " + r.error));
        c.closing = true;
        drop_input(c);
        return;
      }
      buffered -= r.consumed;
      c.in.erase(0, r.consumed);
      handle(c, req);
    }
  }

  void handle(Conn& c, const wire::Message& req) {
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
        queue(c, wire::make(static_cast<uint8_t>(wire::Reply::timeout), 0, state.missing(c.pending)));
      }
    }
  }

  // The admission key: the local user owning the peer's socket when it is on this host (every
  // local process connects from 127.0.0.1 or from the host's own address, shared by all its users),
  // else the peer's address.
  void identify(Conn& c, int fd, const sockaddr_storage& peer) {
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len);
    c.uid = identity.uid(peer, local);
    c.source = wire::PeerIdentity::source_of(peer, c.uid);
    if (identity.unavailable() && !told_identity) {
      told_identity = true;
      GZ_LOG(warn, "store server: cannot tell local users apart (no sock_diag for TCP here): ",
             owner_only ? "this store has no token, so every local user can reach it; set GZ_RDZV_TOKEN"
                        : "unauthenticated local clients share their address's slots");
    }
  }

  // A tokenless store is its owner's: another local user's process is refused at its hello,
  // with a reason its client prints.
  bool foreign_user(Conn& c) {
    if (!owner_only || c.uid < 0 || c.uid == owner_uid) return false;
    ++st.bad_hello;
    refuse(c, "this store has no rendezvous token, so it admits only processes of local user " +
                  std::to_string(owner_uid) + " (this one is user " + std::to_string(c.uid) +
                  "); give every rank the same GZ_RDZV_TOKEN to share it");
    return true;
  }

  void accept_batch(Clock::time_point now) {
    for (int i = 0; i < kAcceptBatch; ++i) {
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      int fd = accept4(listen_fd, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        // Out of descriptors (or similar): the listening socket stays readable, so back off
        // instead of spinning, and do not flood the log.
        if (now - last_accept_warning > std::chrono::seconds(5)) {
          GZ_LOG(warn, "store server: accept: ", std::strerror(errno), " (", conns.size(),
                 " connections open)");
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
      c.id = next_id++;
      c.peer = std::string(host) + ":" + std::to_string(port);
      identify(c, fd, ss);
      c.auth_deadline = now + opts.auth_timeout;
      c.tracked = true;
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = c.id;
      if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
        ::close(fd);
        continue;
      }
      c.registered = EPOLLIN;
      for (uint64_t id : admission.admit(c.id, c.source)) evict.insert(id);
      index[c.id] = conns.size();
      conns.push_back(std::move(c));
      ++st.accepted;
      bump_max(st.peak_pending, admission.pending());
    }
  }

  // Close the connections admission gave up, without a word (they are floods or stragglers;
  // a real client retries its connect).
  void apply_evictions(Clock::time_point now) {
    if (evict.empty()) return;
    for (auto& c : conns) {
      if (!evict.count(c.id)) continue;
      c.tracked = false;
      c.fd_dead = true;
      ++st.evicted;
      log_abuse(AbuseLog::Kind::evicted, c, "", now);
    }
    evict.clear();
  }

  // Read what is there; false when the connection must go away now.
  bool read_some(Conn& c) {
    char buf[65536];
    // Bound the work per wake-up so one fast sender cannot starve the others; unauthenticated
    // connections get one small read.
    const int rounds = c.authed ? 16 : 1;
    for (int round = 0; round < rounds; ++round) {
      size_t want = sizeof buf;
      if (!c.authed && !c.closing) {
        const size_t budget = wire::handshake_budget(c.challenged);
        want = std::min(want, budget - std::min(c.in.size(), budget));
        if (want == 0) return true;  // a full message's worth: judged before anything more is read
      }
      ssize_t n = ::recv(c.fd, buf, want, 0);
      if (n == 0) return false;
      if (n < 0) {
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK;
      }
      if (c.closing) continue;  // discard: we are only flushing an error reply
      c.in.append(buf, static_cast<size_t>(n));
      buffered += static_cast<size_t>(n);
      if (!c.authed) {
        c.fresh = true;
        bump_max(st.peak_pending_bytes, c.in.size());
      }
      // A well-behaved client has at most one request in flight; anything beyond one maximal
      // frame, or beyond the server-wide budget, is abuse.
      if (c.in.size() > limits.max_body_bytes + 2 * wire::kHeaderBytes + 65536 ||
          buffered > opts.max_total_bytes) {
        GZ_LOG(warn, "store server: closing ", c.peer, ": input buffer limit exceeded");
        drop_input(c);
        return false;
      }
      if (static_cast<size_t>(n) < want) break;
    }
    return true;
  }

  // Whether to watch for input: not while an unauthenticated connection's handshake message is
  // complete (or its budget full) and waiting to be judged.
  static bool wants_input(const Conn& c) {
    if (c.authed || c.closing) return true;
    return c.in.size() < wire::handshake_budget(c.challenged);
  }

  int poll_timeout(Clock::time_point now) const {
    long long best = -1;
    auto consider = [&](Clock::time_point t) {
      long long ms = std::max<long long>(0, std::chrono::duration_cast<Duration>(t - now).count() + 1);
      if (best < 0 || ms < best) best = ms;
    };
    for (auto& c : conns) {
      if (c.blocked) consider(c.deadline);
      if (c.lingering) consider(c.linger_until);
      if (c.tracked && !c.closing) consider(c.auth_deadline);
      if (c.authed && !c.blocked && !c.closing && c.out.empty() && !c.in.empty()) best = 0;
    }
    return static_cast<int>(std::min<long long>(best, 1 << 30));
  }

  // Unauthenticated connections past their deadline go; so do lingering ones past theirs.
  void expire(Clock::time_point now) {
    for (auto& c : conns) {
      if (c.fd_dead) continue;
      if (!c.authed && !c.closing && now >= c.auth_deadline) {
        c.fd_dead = true;
        ++st.auth_timeouts;
        log_abuse(AbuseLog::Kind::timed_out, c, "", now);
      } else if (c.lingering && now >= c.linger_until) {
        c.fd_dead = true;
      }
    }
  }

  void remove_dead() {
    for (size_t i = 0; i < conns.size();) {
      Conn& c = conns[i];
      if (!c.fd_dead) {
        ++i;
        continue;
      }
      ::close(c.fd);  // also leaves the epoll set
      buffered -= c.in.size();
      if (c.tracked) admission.release(c.id, c.source);
      if (c.authed) --authed_count;
      index.erase(c.id);
      if (i + 1 != conns.size()) {
        conns[i] = std::move(conns.back());
        index[conns[i].id] = i;
      }
      conns.pop_back();
    }
    st.clients = authed_count;
    st.pending = admission.pending();
  }

  // Ask epoll for what each connection needs now (a syscall only where that changed).
  void sync_interest() {
    for (auto& c : conns) {
      uint32_t want =
          (wants_input(c) ? EPOLLIN : 0u) | (c.out.empty() ? 0u : static_cast<uint32_t>(EPOLLOUT));
      if (want == c.registered || c.fd_dead) continue;
      epoll_event ev{};
      ev.events = want;
      ev.data.u64 = c.id;
      if (epoll_ctl(ep, EPOLL_CTL_MOD, c.fd, &ev) == 0) c.registered = want;
    }
  }

  // Read and flush what epoll reported; true when the listening socket has connections waiting.
  bool serve_events(const std::vector<epoll_event>& events, int n) {
    bool accept_ready = false;
    for (int k = 0; k < n; ++k) {
      const uint64_t id = events[static_cast<size_t>(k)].data.u64;
      const uint32_t re = events[static_cast<size_t>(k)].events;
      if (id == kWakeId) continue;  // stop() sets `stopping` first
      if (id == kListenId) {
        accept_ready = true;
        continue;
      }
      auto it = index.find(id);
      if (it == index.end()) continue;
      Conn& c = conns[it->second];
      if (c.fd_dead) continue;
      if (re & EPOLLIN) {
        if (!read_some(c)) {
          c.fd_dead = true;
          continue;
        }
      } else if (re & (EPOLLHUP | EPOLLERR)) {
        // Hung up while we were not reading (a hello waiting to be judged), or an error.
        if (!(c.registered & EPOLLIN) || !read_some(c)) {
          c.fd_dead = true;
          continue;
        }
      }
      if (re & EPOLLOUT) flush(c);
    }
    return accept_ready;
  }

  // Run requests, answer parked waiters, flush replies; a flushed reply frees its connection for
  // its next buffered request, and a change can unblock waiters: repeat until quiet (bounded, so
  // one busy client cannot starve the loop).
  void run_requests(Clock::time_point now) {
    for (int iter = 0; iter < 64; ++iter) {
      const uint64_t version = state.version();
      bool progress = false;
      for (auto& c : conns) {
        if (c.fd_dead) continue;
        size_t had = c.in.size();
        bool was_authed = c.authed;
        process(c, now);
        progress |= c.in.size() != had || c.authed != was_authed;
      }
      retry_blocked(Clock::now());
      for (auto& c : conns) {
        if (c.fd_dead) continue;
        if (!c.out.empty()) flush(c);
        if (c.closing && c.out.empty() && !c.lingering && !c.fd_dead) {
          ::shutdown(c.fd, SHUT_WR);
          c.lingering = true;
          c.linger_until = Clock::now() + kLinger;
        }
      }
      if (!progress && state.version() == version) break;
    }
  }

  void loop() {
    std::vector<epoll_event> events(512);
    Clock::time_point last_forget = Clock::now();
    while (!stopping) {
      Clock::time_point now = Clock::now();
      const int timeout = poll_timeout(now);
      sync_interest();
      int n = ::epoll_wait(ep, events.data(), static_cast<int>(events.size()), timeout);
      if (n < 0) {
        if (errno == EINTR) continue;
        GZ_LOG(error, "store server: epoll_wait: ", std::strerror(errno));
        std::this_thread::sleep_for(Duration(10));
        continue;
      }
      if (stopping) break;
      const bool accept_ready = serve_events(events, n);
      run_requests(Clock::now());
      // New connections after the handshakes already buffered were judged: a complete, correct
      // proof is never evicted to make room for a newcomer.
      now = Clock::now();
      if (accept_ready) accept_batch(now);
      apply_evictions(now);
      expire(now);
      remove_dead();
      if (now - last_forget > std::chrono::seconds(1)) {
        admission.forget_idle();
        last_forget = now;
      }
      std::string line = abuse.summary(now);
      if (!line.empty()) GZ_LOG(warn, line);
    }
  }
};

TcpStoreServer::TcpStoreServer(const TcpStoreServerOptions& options)
    : impl_(std::make_unique<Impl>(options)) {
  impl_->open();
}

TcpStoreServer::~TcpStoreServer() { stop(); }

int TcpStoreServer::port() const { return impl_->bound_port; }

void TcpStoreServer::stop() { impl_->stop(); }

TcpStoreServerStats TcpStoreServer::stats() const {
  const auto& s = impl_->st;
  TcpStoreServerStats out;
  out.accepted = s.accepted.load();
  out.authenticated = s.authenticated.load();
  out.wrong_token = s.wrong_token.load();
  out.bad_hello = s.bad_hello.load();
  out.oversized = s.oversized.load();
  out.auth_timeouts = s.auth_timeouts.load();
  out.evicted = s.evicted.load();
  out.handshake_passes = s.handshake_passes.load();
  out.clients = s.clients.load();
  out.pending = s.pending.load();
  out.peak_pending = s.peak_pending.load();
  out.peak_pending_bytes = s.peak_pending_bytes.load();
  return out;
}

}  // namespace gz
