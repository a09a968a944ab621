// The Gloo backend's second full mesh, in synchronous mode: small all-reduces as one exchange
// done by the calling thread itself (no event-loop thread in between).
#pragma once

#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/buffer.h>
#include <gloo/transport/device.h>

#include <sys/socket.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/reduce/reduce.h"
#include "gz/core/deadline.h"

namespace gloo::transport::tcp {
class Pair;
}

namespace gz::comm::gloo_impl {

using reduce::ReduceFn;

/// @brief A Gloo context whose tcp pairs are switched to synchronous mode (Pair::setSync): sends
/// write on the caller's thread, and Buffer::waitRecv reads the socket on the caller's thread.
///
/// Each rank registers one inbox per peer once (a Gloo bound buffer of max_bytes). An all-reduce
/// of n bytes (n <= max_bytes) writes the caller's data into every peer's inbox, reads every
/// peer's data into its own inboxes and reduces the contributions in rank order, so every rank
/// computes the same result bit for bit. One inbox per peer suffices: in synchronous mode data
/// lands in an inbox only while its owner reads, and a peer's next message waits in the kernel.
/// The writes never block for long: a message is at most max_bytes (capped so that one message
/// per peer fits the kernel's socket buffers) and every peer reads before it writes again.
///
/// Deadlines: the socket timeouts (SO_RCVTIMEO/SO_SNDTIMEO) are set to what is left of the op's
/// deadline before each op, so a blocked read ends as Gloo's "Read timeout". abort() shuts the
/// sockets down (shutdown(2)): a thread blocked in a synchronous read is not woken by Gloo's
/// signalException (which would wait for the pair's lock the reader holds), but returns from
/// recv() at once when its socket is shut down; then every pair is put into its error state.
class SyncMesh {
 public:
  /// @brief Collective over the group: connects the mesh through `store` (its own namespace),
  /// switches every pair to synchronous mode and registers the inboxes.
  SyncMesh(int rank, int size, size_t max_bytes, const std::shared_ptr<::gloo::transport::Device>& device,
           ::gloo::rendezvous::Store& store, Duration timeout);
  ~SyncMesh();
  SyncMesh(const SyncMesh&) = delete;
  SyncMesh& operator=(const SyncMesh&) = delete;

  size_t max_bytes() const { return max_bytes_; }

  /// @brief In place: data (count elements of elem_size bytes, count * elem_size <= max_bytes)
  /// becomes the reduction over every rank. Throws Gloo's exceptions; *peer is then the rank
  /// whose socket failed (or -1).
  void allreduce(void* data, size_t count, size_t elem_size, const ReduceFn& reduce, Deadline deadline, int* peer);

  /// @brief Any thread: wake a blocked op (shutdown of every socket) and fail every later one.
  void abort(const std::string& reason) noexcept;

 private:
  struct Peer {
    ::gloo::transport::tcp::Pair* pair = nullptr;
    int fd = -1;  // the pair's socket, found by its address pair (Gloo keeps it private)
    sockaddr_storage self{}, peer{};
    uint8_t* data = nullptr;  // the inbox's memory
    std::unique_ptr<::gloo::transport::Buffer> inbox;
    long long timeout_ms = -1;  // socket timeouts currently set
  };
  void set_socket_timeouts(Peer& p, Deadline deadline);
  bool still_ours(const Peer& p) const;

  int rank_;
  int size_;
  size_t max_bytes_;
  std::shared_ptr<::gloo::rendezvous::Context> context_;
  std::vector<uint8_t> inboxes_;  // (size - 1) * max_bytes
  std::vector<uint8_t> scratch_;  // accumulator for 3+ ranks
  std::vector<Peer> peers_;       // by rank; peers_[rank_] unused
  std::mutex abort_mu_;
  std::atomic<bool> aborted_{false};
};

}  // namespace gz::comm::gloo_impl
