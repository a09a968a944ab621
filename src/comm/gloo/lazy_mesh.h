// A Gloo context whose pairs are connected on first use, one pair at a time: the Gloo backend's
// point-to-point-only communicators (the hierarchical backend's one over all ranks) connect only
// the peers they exchange messages with, and nothing at all when they are never used.
#pragma once

#include <gloo/context.h>
#include <gloo/transport/device.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gz/core/deadline.h"
#include "gz/store/store.h"

namespace gz::comm::gloo_impl {

/// @brief Pairs of a Gloo context connected on demand through the store.
///
/// Connecting the pair to `peer` takes both ranks: each creates its end (Gloo listens on it),
/// publishes its address under "p2p_addr/<from>/<to>" and connects to the peer's. Both ranks of a
/// point-to-point message reach this in the op itself (a send completes only once its receive is
/// posted: Gloo's unbound buffers rendezvous), so connecting on first use adds no wait that the
/// message would not have had: no deadlock that eager connecting would have avoided. A collective
/// on this context connects every missing pair first (every rank calls it, so all of them meet).
///
/// Deadlines: the store is polled in short slices (so abort() is seen within ~100 ms) and the
/// pair's connect wait is a fifth of what is left (Gloo waits five times a pair's timeout).
/// abort() puts every pair that exists into Gloo's error state, waking a rank blocked in connect.
class LazyMesh {
 public:
  LazyMesh(int rank, int size, std::shared_ptr<::gloo::transport::Device> device,
           std::shared_ptr<Store> store, Duration timeout);
  ~LazyMesh();
  LazyMesh(const LazyMesh&) = delete;
  LazyMesh& operator=(const LazyMesh&) = delete;

  /// @brief The Gloo context (its pairs: those connected so far).
  std::shared_ptr<::gloo::Context> context() const { return context_; }
  /// @brief Connect the pair to `peer` unless it is; throws gz::TimeoutError at the deadline and
  /// gz::Aborted after abort().
  void ensure(int peer, Deadline deadline);
  /// @brief Connect every pair not connected yet (collective over the group).
  void ensure_all(Deadline deadline);
  /// @brief Pairs connected so far (for tests and logs).
  int connected() const;
  /// @brief Any thread: fail what waits for a connection and every later connect.
  void abort(const std::string& reason) noexcept;

 private:
  ::gloo::transport::Pair* create(int peer, Deadline deadline);
  Bytes wait_key(const std::string& key, Deadline deadline);

  int rank_, size_;
  std::shared_ptr<Store> store_;
  Duration timeout_;
  std::shared_ptr<::gloo::Context> context_;
  std::shared_ptr<::gloo::transport::Context> transport_;
  mutable std::mutex mu_;        // pair creation vs abort()
  std::vector<char> connected_;  // by peer
  std::vector<char> published_;  // this end's address is in the store
  bool aborted_ = false;         // under mu_
};

}  // namespace gz::comm::gloo_impl
