// Gloo pairs connected on first use (see lazy_mesh.h).
#include "comm/gloo/lazy_mesh.h"

#include <gloo/transport/context.h>
#include <gloo/transport/tcp/pair.h>

#include <algorithm>

#include "gz/core/error.h"

namespace gz::comm::gloo_impl {
namespace {

using namespace std::chrono_literals;

// gloo::Context keeps its device and transport context protected (connectFullMesh of the
// rendezvous context sets them); a derived class may set them to a transport context of its own.
struct OwnContext : ::gloo::Context {
  OwnContext(int rank, int size, std::shared_ptr<::gloo::transport::Device> device,
             std::shared_ptr<::gloo::transport::Context> transport)
      : ::gloo::Context(rank, size) {
    device_ = std::move(device);
    transportContext_ = std::move(transport);
  }
};

struct PairAccess : ::gloo::transport::tcp::Pair {
  static constexpr auto signal_error = &PairAccess::signalExceptionExternal;
};

std::string key(int from, int to) { return "p2p_addr/" + std::to_string(from) + "/" + std::to_string(to); }

}  // namespace

LazyMesh::LazyMesh(int rank, int size, std::shared_ptr<::gloo::transport::Device> device,
                   std::shared_ptr<Store> store, Duration timeout)
    : rank_(rank),
      size_(size),
      store_(std::move(store)),
      timeout_(timeout),
      connected_(size, 0),
      published_(size, 0) {
  transport_ = device->createContext(rank_, size_);
  transport_->setTimeout(timeout_);
  context_ = std::make_shared<OwnContext>(rank_, size_, std::move(device), transport_);
  context_->setTimeout(timeout_);
}

LazyMesh::~LazyMesh() {
  try {
    context_->closeConnections();
  } catch (...) {
  }
}

int LazyMesh::connected() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(std::count(connected_.begin(), connected_.end(), 1));
}

::gloo::transport::Pair* LazyMesh::create(int peer, Deadline deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) GZ_THROW(Aborted, "gloo: rank ", rank_, " aborted while connecting to rank ", peer);
  auto& pair = transport_->getPair(peer);
  if (!pair) {
    // Gloo waits up to five times a pair's timeout for its connection.
    transport_->setTimeout(std::max<Duration>(deadline.remaining() / 5, Duration(1)));
    transport_->createPair(peer);
  }
  return pair.get();
}

Bytes LazyMesh::wait_key(const std::string& k, Deadline deadline) {
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted_) GZ_THROW(Aborted, "gloo: rank ", rank_, " aborted while waiting for ", k);
    }
    const Duration left = deadline.remaining();
    if (left.count() <= 0)
      GZ_THROW(TimeoutError, "gloo: rank ", rank_, " waited in vain for the peer's address ", k);
    try {
      return store_->get(k, Deadline::after(std::min<Duration>(left, 100ms)));
    } catch (const TimeoutError&) {
      // another slice: abort() and the op's deadline are checked between them
    }
  }
}

void LazyMesh::ensure(int peer, Deadline deadline) {
  if (connected_[peer]) return;
  auto* pair = create(peer, deadline);
  if (!published_[peer]) {
    const auto a = pair->address().bytes();
    store_->set(key(rank_, peer), Bytes(a.begin(), a.end()));
    published_[peer] = 1;
  }
  const Bytes theirs = wait_key(key(peer, rank_), deadline);
  pair->connect(std::vector<char>(theirs.begin(), theirs.end()));
  std::lock_guard<std::mutex> lock(mu_);
  connected_[peer] = 1;
}

void LazyMesh::ensure_all(Deadline deadline) {
  // Every missing end first, so that no rank waits for another's address while that one waits
  // for a third: all addresses are published before anyone connects.
  for (int j = 0; j < size_; ++j) {
    if (j == rank_ || connected_[j] || published_[j]) continue;
    const auto a = create(j, deadline)->address().bytes();
    store_->set(key(rank_, j), Bytes(a.begin(), a.end()));
    published_[j] = 1;
  }
  for (int j = 0; j < size_; ++j)
    if (j != rank_) ensure(j, deadline);
}

void LazyMesh::abort(const std::string& reason) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_ = true;
  for (int j = 0; j < size_; ++j) {
    if (j == rank_) continue;
    try {
      if (auto* pair = dynamic_cast<::gloo::transport::tcp::Pair*>(transport_->getPair(j).get()))
        (pair->*PairAccess::signal_error)("gz: communicator aborted: " + reason);
    } catch (...) {
    }
  }
}

}  // namespace gz::comm::gloo_impl
