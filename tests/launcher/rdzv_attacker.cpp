// rdzv_attacker: attacks a TCP rendezvous store for the attack test (multihost_attack.sh; a test
// tool, never installed). Keeps --conns connections open (from the --bind addresses in turn),
// each slot with one behaviour, and reconnects a slot as soon as the server drops it:
//   idle        connects and says nothing (waits for the auth deadline or an eviction)
//   garbage     256 random bytes
//   oversized   a header announcing 64 MiB, then 16 KiB of it
//   guess       hello and a made-up proof without waiting for the challenge, pipelined with
//               set/get/add of the job's keys
//   wrong       the whole handshake with a wrong token (reads the challenge, answers it with a
//               wrong proof): the all-wrong-token pattern
//   no-hello    set/get/append/add/wait/num_keys without any handshake
//   slowloris   a hello dribbled one byte every 200 ms
// --kinds K,K,... keeps only those behaviours (default: all). With --guess-bind ADDR, 4 more
// slots run the whole handshake with wrong tokens patiently from that address of their own.
// Every reply is decoded: a single `ok` (a guessed token or an executed request) is a breach.
// Traffic is bounded: --max-connects, --max-mbytes, --seconds, and a connect rate (--rate/s,
// bursts of up to --conns). Stops at the bound or on SIGTERM/SIGINT and prints one report line:
//   attacker: seconds=.. connects=.. connected=.. connect_failed=.. closed_by_server=..
//             refused=.. other_replies=.. ok_replies=.. guesses=.. mbytes_sent=..
// Exit status: 0, or 3 when any `ok` came back (the store let the attacker in), 2 on bad usage.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "store/handshake.h"
#include "store/wire.h"

namespace {

using Clock = std::chrono::steady_clock;
using gz::wire::Message;
using gz::wire::Op;

volatile sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

enum Kind { idle, garbage, oversized, guess, no_hello, slowloris, wrong, kinds };
const char* const kKindNames[] = {"idle", "garbage", "oversized", "guess", "no-hello", "slowloris", "wrong"};

struct Options {
  std::string host;
  int port = 0;
  std::vector<std::string> binds;
  std::string guess_bind;
  std::vector<Kind> kinds;  // empty = all
  int conns = 1000;
  double seconds = 30;
  long max_connects = 50000;
  double max_mbytes = 64;
  double rate = 2000;
};

struct Slot {
  int fd = -1;
  Kind kind = idle;
  bool connecting = false;
  std::string out;
  size_t off = 0;
  std::string in;
  std::string nonce;            // of this connection's hello
  bool answered = false;        // `wrong`: the challenge was answered
  Clock::time_point next_at{};  // reconnect time (fd < 0) or next dribble (slowloris)
};

struct Report {
  long connects = 0, connected = 0, connect_failed = 0, closed_by_server = 0, refused = 0, other = 0, ok = 0,
       guesses = 0, challenges = 0;
  double bytes = 0;
  std::string first_ok;
};

std::string frame(Op op, std::vector<std::string> parts, int64_t num = 0) {
  Message m;
  m.code = static_cast<uint8_t>(op);
  m.num = num;
  m.parts = std::move(parts);
  return gz::wire::encode(m);
}

class Attacker {
 public:
  explicit Attacker(const Options& o)
      : o_(o),
        slots_(static_cast<size_t>(o.conns) + (o.guess_bind.empty() ? 0 : kPatient)),
        rng_(std::random_device{}()) {
    std::vector<Kind> mix = o.kinds;
    if (mix.empty())
      for (int k = 0; k < kinds; ++k) mix.push_back(static_cast<Kind>(k));
    for (size_t i = 0; i < slots_.size(); ++i)
      slots_[i].kind = i < static_cast<size_t>(o.conns) ? mix[i % mix.size()] : wrong;
    ep_ = epoll_create1(EPOLL_CLOEXEC);
    inet_pton(AF_INET, o.host.c_str(), &target_.sin_addr);
    target_.sin_family = AF_INET;
    target_.sin_port = htons(static_cast<uint16_t>(o.port));
  }

  int run() {
    const auto start = Clock::now(), end = start + std::chrono::duration_cast<Clock::duration>(
                                                       std::chrono::duration<double>(o_.seconds));
    double tokens = o_.conns;  // connect budget: a burst of --conns, then --rate per second
    auto last = start;
    std::vector<epoll_event> evs(256);
    while (!g_stop && Clock::now() < end) {
      auto now = Clock::now();
      tokens =
          std::min<double>(o_.conns, tokens + std::chrono::duration<double>(now - last).count() * o_.rate);
      last = now;
      for (size_t i = 0; i < slots_.size(); ++i) {
        Slot& s = slots_[i];
        if (s.fd < 0 && now >= s.next_at && tokens >= 1 && within_budget()) {
          tokens -= 1;
          open_slot(i, s);
        } else if (s.fd >= 0 && !s.connecting && s.kind == slowloris && s.off < s.out.size() &&
                   now >= s.next_at) {
          send_some(s, 1);
          s.next_at = now + std::chrono::milliseconds(200);
        }
      }
      int n = epoll_wait(ep_, evs.data(), static_cast<int>(evs.size()), 10);
      for (int k = 0; k < n; ++k) {
        Slot& s = slots_[evs[static_cast<size_t>(k)].data.u64];
        if (s.fd < 0) continue;
        uint32_t e = evs[static_cast<size_t>(k)].events;
        if (s.connecting && (e & (EPOLLOUT | EPOLLERR | EPOLLHUP))) finish_connect(s);
        if (s.fd >= 0 && !s.connecting && (e & EPOLLOUT) && s.kind != slowloris) send_some(s, s.out.size());
        if (s.fd >= 0 && !s.connecting && (e & (EPOLLIN | EPOLLHUP | EPOLLERR))) read_some(s);
      }
    }
    for (auto& s : slots_)
      if (s.fd >= 0) ::close(s.fd);
    std::printf(
        "attacker: seconds=%.1f connects=%ld connected=%ld connect_failed=%ld closed_by_server=%ld "
        "refused=%ld challenges=%ld other_replies=%ld ok_replies=%ld guesses=%ld mbytes_sent=%.1f%s%s\n",
        std::chrono::duration<double>(Clock::now() - start).count(), r_.connects, r_.connected,
        r_.connect_failed, r_.closed_by_server, r_.refused, r_.challenges, r_.other, r_.ok, r_.guesses,
        r_.bytes / 1e6, r_.first_ok.empty() ? "" : " first_ok=", r_.first_ok.c_str());
    std::fflush(stdout);
    return r_.ok > 0 ? 3 : 0;
  }

 private:
  bool within_budget() const { return r_.connects < o_.max_connects && r_.bytes < o_.max_mbytes * 1e6; }

  std::string hello(Slot& s) {
    s.nonce = gz::wire::random_bytes(gz::wire::kNonceBytes);
    return frame(Op::hello, {s.nonce}, gz::wire::kProtocolVersion);
  }

  std::string made_up_proof() {
    std::string p(gz::wire::kProofBytes, '\0');
    for (auto& c : p) c = static_cast<char>(rng_());
    return p;
  }

  std::string payload(Slot& s) {
    s.answered = false;
    switch (s.kind) {
      case idle:
        return {};
      case garbage: {
        std::string g(256, '\0');
        for (auto& c : g) c = static_cast<char>(rng_());
        return g;
      }
      case oversized:
        return std::string("\x00\x00\x00\x04", 4) + std::string(16384, 'A');
      case guess:
        ++r_.guesses;
        return hello(s) + frame(Op::auth, {made_up_proof()}) + frame(Op::set, {"attack/owned", "1"}) +
               frame(Op::get, {"gzrun/attempt0/run_id"}, 100) +
               frame(Op::add, {"gzrun/attempt0/nodes/arrived"}, 7);
      case wrong:
        return hello(s);  // the auth answers the challenge (decode_replies)
      case no_hello:
        return frame(Op::set, {"attack/owned", "1"}) + frame(Op::get, {"gzrun/attempt0/run_id"}, 100) +
               frame(Op::append, {"attack/appended", "x"}) + frame(Op::add, {"attack/counter"}, 1) +
               frame(Op::wait, {"gzrun/attempt0/run_id"}, 100) + frame(Op::num_keys, {});
      case slowloris:
        ++r_.guesses;
        return hello(s) + frame(Op::auth, {made_up_proof()}) + frame(Op::set, {"attack/owned", "1"});
      default:
        return {};
    }
  }

  void open_slot(size_t index, Slot& s) {
    ++r_.connects;
    s.fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s.fd < 0) {
      s.next_at = Clock::now() + std::chrono::milliseconds(100);
      ++r_.connect_failed;
      return;
    }
    const bool patient = index >= static_cast<size_t>(o_.conns);
    if (patient || !o_.binds.empty()) {
      sockaddr_in b{};
      b.sin_family = AF_INET;
      const std::string& a =
          patient ? o_.guess_bind : o_.binds[static_cast<size_t>(r_.connects) % o_.binds.size()];
      inet_pton(AF_INET, a.c_str(), &b.sin_addr);
      bind(s.fd, reinterpret_cast<sockaddr*>(&b), sizeof b);
    }
    s.in.clear();
    s.out = payload(s);
    s.off = 0;
    s.connecting = true;
    int rc = ::connect(s.fd, reinterpret_cast<sockaddr*>(&target_), sizeof target_);
    if (rc != 0 && errno != EINPROGRESS) {
      drop(s, true);
      return;
    }
    epoll_event ev{};
    ev.events = EPOLLOUT | EPOLLIN;
    ev.data.u64 = index;
    epoll_ctl(ep_, EPOLL_CTL_ADD, s.fd, &ev);
  }

  void finish_connect(Slot& s) {
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      drop(s, true);
      return;
    }
    s.connecting = false;
    ++r_.connected;
    if (s.kind == slowloris) {
      s.next_at = Clock::now();
    } else {
      send_some(s, s.out.size());
    }
  }

  void send_some(Slot& s, size_t most) {
    if (s.off >= s.out.size()) return;
    ssize_t n = ::send(s.fd, s.out.data() + s.off, std::min(most, s.out.size() - s.off), MSG_NOSIGNAL);
    if (n > 0) {
      s.off += static_cast<size_t>(n);
      r_.bytes += static_cast<double>(n);
    } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      drop(s, false);
    }
  }

  void read_some(Slot& s) {
    char buf[16384];
    for (;;) {
      ssize_t n = ::recv(s.fd, buf, sizeof buf, 0);
      if (n > 0) {
        s.in.append(buf, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n < 0 && errno == EINTR) continue;
      decode_replies(s);
      drop(s, false);
      return;
    }
    decode_replies(s);
  }

  void decode_replies(Slot& s) {
    gz::wire::Limits l;
    for (;;) {
      Message m;
      auto r = gz::wire::decode(reinterpret_cast<const uint8_t*>(s.in.data()), s.in.size(),
                                gz::wire::Direction::reply, l, m);
      if (r.status != gz::wire::DecodeStatus::ok) break;
      s.in.erase(0, r.consumed);
      if (m.code == static_cast<uint8_t>(gz::wire::Reply::challenge)) {
        ++r_.challenges;
        if (s.kind == wrong && !s.answered && m.parts.size() == 4) answer(s, m);
      } else if (m.code == static_cast<uint8_t>(gz::wire::Reply::ok)) {
        ++r_.ok;
        if (r_.first_ok.empty()) r_.first_ok = "slot_kind_" + std::to_string(s.kind);
      } else if (m.code == static_cast<uint8_t>(gz::wire::Reply::refused)) {
        ++r_.refused;
      } else {
        ++r_.other;
      }
    }
  }

  // Answer the challenge with a wrong proof. (A dictionary token's proof would need the PBKDF2 key
  // per guess, which slows only the attacker: to the server every wrong proof is the same.)
  void answer(Slot& s, const Message&) {
    ++r_.guesses;
    s.answered = true;
    s.out += frame(Op::auth, {made_up_proof()});
    send_some(s, s.out.size());
  }

  void drop(Slot& s, bool connect_failed) {
    if (connect_failed) {
      ++r_.connect_failed;
    } else {
      ++r_.closed_by_server;
    }
    epoll_ctl(ep_, EPOLL_CTL_DEL, s.fd, nullptr);
    ::close(s.fd);
    s.fd = -1;
    s.connecting = false;
    // Refused connects (nothing listening yet) back off a little; dropped ones come straight back.
    s.next_at = Clock::now() + std::chrono::milliseconds(connect_failed ? 50 : 5);
  }

  static constexpr size_t kPatient = 4;
  Options o_;
  std::vector<Slot> slots_;
  std::mt19937_64 rng_;
  int ep_ = -1;
  sockaddr_in target_{};
  Report r_;
};

[[noreturn]] void usage() {
  std::fprintf(
      stderr,
      "usage: rdzv_attacker --target IPV4:PORT [--bind A,B,...] [--guess-bind A] [--conns N] [--seconds S]\n"
      "                     [--max-connects N] [--max-mbytes M] [--rate PER_S] [--kinds K,K,...]\n"
      "       kinds: idle garbage oversized guess no-hello slowloris wrong\n");
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) usage();
    std::string v = argv[++i];
    if (a == "--target") {
      auto colon = v.rfind(':');
      if (colon == std::string::npos) usage();
      o.host = v.substr(0, colon);
      o.port = std::atoi(v.c_str() + colon + 1);
    } else if (a == "--bind") {
      for (size_t p = 0; p <= v.size();) {
        size_t q = v.find(',', p);
        if (q == std::string::npos) q = v.size();
        if (q > p) o.binds.push_back(v.substr(p, q - p));
        p = q + 1;
      }
    } else if (a == "--guess-bind") {
      o.guess_bind = v;
    } else if (a == "--conns") {
      o.conns = std::atoi(v.c_str());
    } else if (a == "--seconds") {
      o.seconds = std::atof(v.c_str());
    } else if (a == "--max-connects") {
      o.max_connects = std::atol(v.c_str());
    } else if (a == "--max-mbytes") {
      o.max_mbytes = std::atof(v.c_str());
    } else if (a == "--rate") {
      o.rate = std::atof(v.c_str());
    } else if (a == "--kinds") {
      for (size_t p = 0; p <= v.size();) {
        size_t q = v.find(',', p);
        if (q == std::string::npos) q = v.size();
        const std::string name = v.substr(p, q - p);
        p = q + 1;
        if (name.empty()) continue;
        auto it = std::find(std::begin(kKindNames), std::end(kKindNames), name);
        if (it == std::end(kKindNames)) usage();
        o.kinds.push_back(static_cast<Kind>(it - std::begin(kKindNames)));
      }
    } else {
      usage();
    }
  }
  in_addr probe{};
  if (o.host.empty() || inet_pton(AF_INET, o.host.c_str(), &probe) != 1 || o.port <= 0 || o.port > 65535 ||
      o.conns < 1 || o.conns > 20000)
    usage();
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < static_cast<rlim_t>(o.conns) + 64) {
    r.rlim_cur = std::min<rlim_t>(r.rlim_max, static_cast<rlim_t>(o.conns) + 64);
    setrlimit(RLIMIT_NOFILE, &r);
  }
  signal(SIGTERM, on_signal);
  signal(SIGINT, on_signal);
  signal(SIGPIPE, SIG_IGN);
  return Attacker(o).run();
}
