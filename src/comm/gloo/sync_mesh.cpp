// The Gloo backend's synchronous mesh: connection, socket ownership, deadlines (the watchdog),
// poison and abort (see sync_mesh.h). The algorithms over it are in sync_exchange.cpp and sync_ring.cpp.
#include "comm/gloo/sync_mesh.h"

#include <fcntl.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/pair.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <map>
#include <sstream>
#include <thread>

#include "comm/gloo/store_adapter.h"
#include "gz/core/error.h"

namespace gz::comm::gloo_impl {
namespace {

// tcp::Pair keeps these protected; a derived class may name them, and the member pointers then
// apply to any tcp::Pair. fd_ is the connection's descriptor (read under m_, the pair's lock);
// sendBufferSize_ is what Gloo last set SO_SNDBUF to (it only ever raises it, per message size).
struct PairAccess : ::gloo::transport::tcp::Pair {
  static constexpr auto fd = &PairAccess::fd_;
  static constexpr auto mutex = &PairAccess::m_;
  static constexpr auto send_buffer_size = &PairAccess::sendBufferSize_;
  static constexpr auto signal_error = &PairAccess::signalExceptionExternal;
};

// Usable bytes of a socket send buffer of `request` bytes here: the kernel doubles the request
// (bookkeeping overhead), capped at twice net.core.wmem_max; count only half of what it grants.
size_t probe_send_capacity(size_t request) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw SystemError("gloo sync mesh: socket()", errno);
  int want = static_cast<int>(std::min<size_t>(request, 1u << 30));
  int got = 0;
  socklen_t len = sizeof(got);
  const bool ok = setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &want, sizeof(want)) == 0 &&
                  getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &got, &len) == 0;
  const int err = errno;
  close(fd);
  if (!ok) throw SystemError("gloo sync mesh: SO_SNDBUF", err);
  return static_cast<size_t>(got) / 2;
}

size_t send_buffer_request(size_t exchange_max, size_t segment) {
  return std::max(exchange_max, kMaxWindow * (segment + kMessageHeader)) + kMessageHeader;
}

}  // namespace

std::string sync_limits_record(size_t want_exchange, size_t want_segment) {
  const size_t capacity = probe_send_capacity(send_buffer_request(want_exchange, want_segment));
  std::ostringstream out;
  out << want_exchange << " " << want_segment << " " << capacity;
  return out.str();
}

SyncLimits agree_sync_limits(const std::vector<std::string>& records) {
  SyncLimits l;
  l.exchange_max = l.segment = ~size_t{0};
  for (size_t r = 0; r < records.size(); ++r) {
    std::istringstream in(records[r]);
    size_t ex = 0, seg = 0, cap = 0;
    if (!(in >> ex >> seg >> cap))
      GZ_THROW(Error, "gloo sync mesh: bad limits record '", records[r], "' of rank ", r);
    const size_t fits = cap > kMessageHeader ? cap - kMessageHeader : 0;
    // Ring segments small enough that two fit (a window of at least 2), unless that is tiny.
    const size_t two_fit = cap / 2 > kMessageHeader + 16384 ? cap / 2 - kMessageHeader : fits;
    l.exchange_max = std::min({l.exchange_max, ex, fits});
    l.segment = std::min({l.segment, seg, two_fit});
  }
  if (records.empty()) l.exchange_max = l.segment = 0;
  l.segment &= ~size_t{63};             // whole elements of every dtype
  if (l.segment < 4096) l.segment = 0;  // too small to pay off: Gloo's own ring instead
  l.send_buffer = send_buffer_request(l.exchange_max, l.segment);
  return l;
}

SyncMesh::SyncMesh(int rank, int size, const SyncLimits& limits,
                   const std::shared_ptr<::gloo::transport::Device>& device, std::shared_ptr<Store> store,
                   Duration timeout)
    : rank_(rank), size_(size), limits_(limits), links_(size) {
  context_ = std::make_shared<::gloo::rendezvous::Context>(rank_, size_);
  context_->setTimeout(timeout);
  StoreAdapter adapter(std::move(store), timeout, rank_, size_);
  auto dev = device;  // connectFullMesh takes a non-const reference
  context_->connectFullMesh(adapter, dev);
  try {
    adopt_pairs();
  } catch (...) {
    for (Link& l : links_) {
      l.exchange_inbox.reset();
      l.ring_inbox.reset();
      if (l.fd >= 0) close(l.fd);
    }
    throw;
  }
}

void SyncMesh::adopt_pairs() {
  const int left = (rank_ - 1 + size_) % size_;
  for (int j = 0; j < size_; ++j) {
    if (j == rank_) continue;
    Link& l = links_[j];
    l.pair = dynamic_cast<::gloo::transport::tcp::Pair*>(context_->getPair(j).get());
    if (l.pair == nullptr) GZ_THROW(Error, "gloo sync mesh: pair ", j, " is not a tcp pair");
    l.pair->setSync(true, false);
    adopt_socket(j);
    if (limits_.exchange_max > 0) {
      l.exchange_mem.resize(limits_.exchange_max);
      l.exchange_inbox =
          l.pair->createRecvBuffer(slot(kExchange, j, rank_), l.exchange_mem.data(), limits_.exchange_max);
    }
    if (limits_.segment > 0 && j == left) {
      l.ring_mem.resize(limits_.segment);
      l.ring_inbox =
          l.pair->createRecvBuffer(slot(kRingReduce, j, rank_), l.ring_mem.data(), limits_.segment);
    }
  }
}

void SyncMesh::adopt_socket(int peer) {
  Link& l = links_[peer];
  std::lock_guard<std::mutex> lock(l.pair->*PairAccess::mutex);
  const int fd = l.pair->*PairAccess::fd;
  if (fd < 0)
    GZ_THROW(PeerError, "gloo sync mesh: rank ", rank_, ": the pair to rank ", peer, " has no socket");
  l.fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (l.fd < 0) throw SystemError("gloo sync mesh: dup of the socket to rank " + std::to_string(peer), errno);
  int want = static_cast<int>(limits_.send_buffer), got = 0;
  socklen_t len = sizeof(got);
  if (setsockopt(l.fd, SOL_SOCKET, SO_SNDBUF, &want, sizeof(want)) != 0 ||
      getsockopt(l.fd, SOL_SOCKET, SO_SNDBUF, &got, &len) != 0)
    throw SystemError("gloo sync mesh: SO_SNDBUF on the socket to rank " + std::to_string(peer), errno);
  // Gloo raises SO_SNDBUF whenever a message is larger than this; ours never are.
  l.pair->*PairAccess::send_buffer_size = static_cast<size_t>(got);
  const size_t usable = static_cast<size_t>(got) / 2;
  const size_t largest = std::max(limits_.exchange_max, limits_.segment) + kMessageHeader;
  if (usable < largest)
    GZ_THROW(Error, "gloo sync mesh: the socket to rank ", peer, " queues ", usable,
             " bytes, less than a message (", largest, "); was net.core.wmem_max lowered?");
  if (limits_.segment > 0)
    l.window = std::clamp<size_t>(usable / (limits_.segment + kMessageHeader), 1, kMaxWindow);
}

SyncMesh::~SyncMesh() {
  for (Link& l : links_) {  // bound buffers unregister from their pairs first
    l.exchange_inbox.reset();
    l.ring_inbox.reset();
  }
  try {
    context_->closeConnections();
  } catch (...) {
  }
  for (Link& l : links_) {
    if (l.fd < 0) continue;
    // closeConnections() asked for a reset on close (SO_LINGER 0); the last descriptor is ours:
    // close gracefully instead, so data a peer has yet to read is not thrown away.
    linger off{};
    setsockopt(l.fd, SOL_SOCKET, SO_LINGER, &off, sizeof(off));
    close(l.fd);
  }
}

::gloo::transport::Buffer& SyncMesh::inbox(int peer, Kind kind) {
  auto& b = kind == kExchange ? links_[peer].exchange_inbox : links_[peer].ring_inbox;
  if (!b) GZ_THROW(Error, "gloo sync mesh: no inbox of kind ", static_cast<int>(kind), " from rank ", peer);
  return *b;
}

uint8_t* SyncMesh::inbox_data(int peer, Kind kind) {
  return kind == kExchange ? links_[peer].exchange_mem.data() : links_[peer].ring_mem.data();
}

// One thread for every mesh of the process: sleeps until the earliest deadline of a running op and
// shuts that op's mesh down if it is still registered then. Leaked on purpose (never joined): it
// may be needed until the very end of the process.
class Watchdog {
 public:
  static Watchdog& instance() {
    static Watchdog* w = new Watchdog();
    return *w;
  }
  uint64_t arm(SyncMesh* mesh, Clock::time_point at) {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t ticket = ++next_;
    timers_.emplace(ticket, Timer{mesh, at});
    cv_.notify_one();
    return ticket;
  }
  // After this returns the watchdog no longer touches the ticket's mesh (expire() runs under mu_).
  // False when the timer had fired already.
  bool disarm(uint64_t ticket) {
    std::lock_guard<std::mutex> lock(mu_);
    return timers_.erase(ticket) > 0;
  }

 private:
  struct Timer {
    SyncMesh* mesh;
    Clock::time_point at;
  };
  Watchdog() {
    std::thread([this] { run(); }).detach();
  }
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      auto first = timers_.end();
      for (auto it = timers_.begin(); it != timers_.end(); ++it)
        if (first == timers_.end() || it->second.at < first->second.at) first = it;
      if (first == timers_.end()) {
        cv_.wait(lock);
      } else if (Clock::now() >= first->second.at) {
        first->second.mesh->expire();
        timers_.erase(first);
      } else {
        // A copy: wait_until reads its argument after re-locking, when disarm() may have erased
        // the timer (a use after free ASan found).
        const Clock::time_point at = first->second.at;
        cv_.wait_until(lock, at);
      }
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Timer> timers_;
  uint64_t next_ = 0;
};

SyncMesh::Op::~Op() {
  if (!ticket_ || Watchdog::instance().disarm(ticket_)) return;
  // Expired. An op that fails says why itself (run_sync poisons with its message); one that got
  // through its last call first leaves a mesh whose sockets are shut down: say so.
  if (std::uncaught_exceptions() == 0)
    mesh_->poison(
        "an op's deadline passed just as it completed, and the deadline watchdog shut the mesh down");
}

void SyncMesh::check_usable() {
  if (aborted_.load()) GZ_THROW(Aborted, "gloo sync mesh aborted");
  if (poisoned_.load()) {
    std::lock_guard<std::mutex> lock(abort_mu_);
    GZ_THROW(PeerError, "gloo sync mesh: rank ", rank_, ": unusable since an earlier op failed on it (",
             poison_reason_, "); every rank's mesh is shut down: abort and recreate the communicator");
  }
}

SyncMesh::Op SyncMesh::begin(Deadline deadline) {
  check_usable();
  return Op(this, Watchdog::instance().arm(this, deadline.at()));
}

void SyncMesh::expire() noexcept {
  expired_ = true;
  shut_down_sockets();
}

void SyncMesh::shut_down_sockets() noexcept {
  for (Link& l : links_)
    if (l.fd >= 0) shutdown(l.fd, SHUT_RDWR);
}

void SyncMesh::arm(int peer, Deadline deadline) {
  check_usable();
  if (recorder_) recorder_->waiting_for(peer);
  Link& l = links_[peer];
  // At least 1 ms (0 would mean "no timeout"); re-set only when it moves by more than 1 ms.
  const long long ms = std::max<long long>(1, deadline.remaining().count());
  if (l.timeout_ms >= 0 && std::llabs(l.timeout_ms - ms) <= 1) return;
  timeval tv{};
  tv.tv_sec = ms / 1000;
  tv.tv_usec = (ms % 1000) * 1000;
  // Our own descriptor of the pair's socket: valid until the mesh is destroyed.
  setsockopt(l.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(l.fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  l.timeout_ms = ms;
}

void SyncMesh::poison(const std::string& reason) noexcept {
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (poisoned_.exchange(true)) return;
    try {
      poison_reason_ = reason;
    } catch (...) {
    }
  }
  shut_down_sockets();
}

void SyncMesh::abort(const std::string& reason) noexcept {
  std::lock_guard<std::mutex> lock(abort_mu_);
  if (aborted_.exchange(true)) return;
  // A reader blocked in recv() holds its pair's lock: shut every socket down first (blocked
  // reads and writes return at once), then Gloo's error state (which takes that lock) fails every
  // later op on the pair.
  shut_down_sockets();
  for (Link& l : links_) {
    if (!l.pair) continue;
    try {
      (l.pair->*PairAccess::signal_error)("gz: communicator aborted: " + reason);
    } catch (...) {
    }
  }
}

}  // namespace gz::comm::gloo_impl
