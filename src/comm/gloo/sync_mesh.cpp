// The Gloo backend's synchronous mesh: see sync_mesh.h.
#include "comm/gloo/sync_mesh.h"

#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/pair.h>

#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "gz/core/error.h"

namespace gz::comm::gloo_impl {
namespace {

// Same family, port and address (Gloo's Address keeps a sockaddr_storage).
bool same_endpoint(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    const auto& x = reinterpret_cast<const sockaddr_in&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in&>(b);
    return x.sin_port == y.sin_port && x.sin_addr.s_addr == y.sin_addr.s_addr;
  }
  if (a.ss_family == AF_INET6) {
    const auto& x = reinterpret_cast<const sockaddr_in6&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in6&>(b);
    return x.sin6_port == y.sin6_port && std::memcmp(&x.sin6_addr, &y.sin6_addr, sizeof(x.sin6_addr)) == 0;
  }
  return false;
}

bool fd_connects(int fd, const sockaddr_storage& self, const sockaddr_storage& peer) {
  sockaddr_storage s{}, p{};
  socklen_t sl = sizeof(s), pl = sizeof(p);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&s), &sl) != 0) return false;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&p), &pl) != 0) return false;
  return same_endpoint(s, self) && same_endpoint(p, peer);
}

// The descriptor of this process's connected socket whose local end is `self`, or -1 (also when
// two match); *peer gets its remote end. Gloo's Pair::peer() may hold the peer's listening address
// rather than the connection's remote end, so only the local end (unique per connection:
// accepted sockets of other pairs listen on other ports) identifies it.
int find_socket(const sockaddr_storage& self, sockaddr_storage* peer) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int found = -1, matches = 0;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(d)) continue;
    struct stat st {};
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage s{}, p{};
    socklen_t sl = sizeof(s), pl = sizeof(p);
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&s), &sl) != 0 || !same_endpoint(s, self))
      continue;
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&p), &pl) != 0) continue;  // listening
    found = static_cast<int>(fd);
    *peer = p;
    ++matches;
  }
  closedir(d);
  return matches == 1 ? found : -1;
}

// Slot of messages from rank `from` to rank `to`: one per direction, so that a send buffer (which
// Gloo unregisters by slot when it is destroyed) never shares a slot with this side's inbox.
int slot_of(int from, int to) { return from < to ? 0 : 1; }

// tcp::Pair keeps signalExceptionExternal() protected; a derived class may name it, and the member
// pointer then applies to any tcp::Pair.
struct PairAccess : ::gloo::transport::tcp::Pair {
  static constexpr auto signal_error = &PairAccess::signalExceptionExternal;
};

}  // namespace

SyncMesh::SyncMesh(int rank, int size, size_t max_bytes, const std::shared_ptr<::gloo::transport::Device>& device,
                   ::gloo::rendezvous::Store& store, Duration timeout)
    : rank_(rank), size_(size), max_bytes_(max_bytes), peers_(size) {
  context_ = std::make_shared<::gloo::rendezvous::Context>(rank_, size_);
  context_->setTimeout(timeout);
  auto dev = device;  // connectFullMesh takes a non-const reference
  context_->connectFullMesh(store, dev);
  inboxes_.resize(static_cast<size_t>(size_ - 1) * max_bytes_);
  if (size_ > 2) scratch_.resize(max_bytes_);
  size_t k = 0;
  for (int j = 0; j < size_; ++j) {
    if (j == rank_) continue;
    auto* pair = dynamic_cast<::gloo::transport::tcp::Pair*>(context_->getPair(j).get());
    if (pair == nullptr) GZ_THROW(Error, "gloo sync mesh: pair ", j, " is not a tcp pair");
    pair->setSync(true, false);
    Peer& p = peers_[j];
    p.pair = pair;
    p.self = pair->address().getSockaddr();
    p.fd = find_socket(p.self, &p.peer);
    if (p.fd < 0)
      GZ_THROW(Error, "gloo sync mesh: rank ", rank_, " cannot find its socket to rank ", j, " (",
               pair->address().str(), ")");
    p.data = inboxes_.data() + k * max_bytes_;
    p.inbox = pair->createRecvBuffer(slot_of(j, rank_), p.data, max_bytes_);
    ++k;
  }
}

SyncMesh::~SyncMesh() {
  for (Peer& p : peers_) p.inbox.reset();  // bound buffers unregister from their pairs first
  try {
    context_->closeConnections();
  } catch (...) {
  }
}

bool SyncMesh::still_ours(const Peer& p) const {
  return p.fd >= 0 && fd_connects(p.fd, p.self, p.peer);
}

void SyncMesh::set_socket_timeouts(Peer& p, Deadline deadline) {
  // At least 1 ms (0 would mean "no timeout"); re-set only when it moves by more than 1 ms.
  const long long ms = std::max<long long>(1, deadline.remaining().count());
  if (p.timeout_ms >= 0 && std::llabs(p.timeout_ms - ms) <= 1) return;
  timeval tv{};
  tv.tv_sec = ms / 1000;
  tv.tv_usec = (ms % 1000) * 1000;
  // The descriptor stays the pair's while the pair is open; after an error every op fails in Gloo
  // before it reaches the socket, so a failed setsockopt changes nothing.
  setsockopt(p.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(p.fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  p.timeout_ms = ms;
}

void SyncMesh::allreduce(void* data, size_t count, size_t elem_size, const ReduceFn& reduce, Deadline deadline,
                         int* peer) {
  const size_t bytes = count * elem_size;
  if (bytes > max_bytes_) GZ_THROW(InvalidArgument, "gloo sync mesh: ", bytes, " bytes > ", max_bytes_);
  *peer = -1;
  if (aborted_.load()) GZ_THROW(Aborted, "gloo sync mesh aborted");
  for (int j = 0; j < size_; ++j)
    if (j != rank_) set_socket_timeouts(peers_[j], deadline);
  // Write to every peer first (each write fits the socket buffers), then read every peer.
  for (int s = 1; s < size_; ++s) {
    const int j = (rank_ + s) % size_;
    *peer = j;
    auto out = peers_[j].pair->createSendBuffer(slot_of(rank_, j), data, bytes);
    out->send(0, bytes, 0);
    out->waitSend();
  }
  for (int s = 1; s < size_; ++s) {
    const int j = (rank_ - s + size_) % size_;
    *peer = j;
    peers_[j].inbox->waitRecv();
  }
  *peer = -1;
  // Contributions in rank order, the same on every rank.
  auto contribution = [&](int r) -> const void* { return r == rank_ ? data : peers_[r].data; };
  if (size_ == 2) {
    reduce(data, contribution(0), contribution(1), count);
    return;
  }
  reduce(scratch_.data(), contribution(0), contribution(1), count);
  for (int r = 2; r < size_; ++r) reduce(scratch_.data(), scratch_.data(), contribution(r), count);
  std::memcpy(data, scratch_.data(), bytes);
}

void SyncMesh::abort(const std::string& reason) noexcept {
  std::lock_guard<std::mutex> lock(abort_mu_);
  if (aborted_.exchange(true)) return;
  for (Peer& p : peers_) {
    if (!p.pair) continue;
    // A reader blocked in recv() holds the pair's lock: shut its socket down first (it returns at
    // once), then Gloo's error state (which takes that lock) fails every later op on the pair.
    if (still_ours(p)) shutdown(p.fd, SHUT_RDWR);
    try {
      (p.pair->*PairAccess::signal_error)(
          "gz: communicator aborted: " + reason);
    } catch (...) {
    }
  }
}

}  // namespace gz::comm::gloo_impl
