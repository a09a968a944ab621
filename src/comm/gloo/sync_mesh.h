// The Gloo backend's second full mesh, in synchronous mode: collectives whose socket I/O is done
// by the calling thread itself (no event-loop thread in between). The algorithms over it live in
// sync_exchange.cpp (small all-reduces) and sync_ring.cpp (pipelined ring).
#pragma once

#include <gloo/rendezvous/store.h>
#include <gloo/transport/buffer.h>
#include <gloo/transport/device.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/reduce/reduce.h"
#include "gz/comm/flight_recorder.h"
#include "gz/core/deadline.h"
#include "gz/store/store.h"

namespace gloo::rendezvous {
class Context;
}
namespace gloo::transport::tcp {
class Pair;
}

namespace gz::comm::gloo_impl {

using reduce::ReduceFn;

/// @brief Upper bound of Gloo's per-message header (its preamble is six 64-bit words).
constexpr size_t kMessageHeader = 64;
/// @brief At most this many ring segments written to a peer beyond what this rank has read.
constexpr size_t kMaxWindow = 4;

/// @brief What every rank of a group agreed on before connecting the synchronous mesh.
struct SyncLimits {
  size_t exchange_max = 0;  ///< all-reduces up to this many bytes: one exchange (0: none)
  size_t segment = 0;       ///< ring segment in bytes (0: no ring on this mesh)
  size_t send_buffer = 0;   ///< SO_SNDBUF to request on every socket of the mesh
  bool any() const { return exchange_max > 0 || segment > 0; }
};

/// @brief This rank's part of the agreement on SyncLimits: its wishes and what its kernel grants a
/// socket's send buffer (probed on a throwaway socket), as one line for the group's gather.
///
/// Why the send buffer matters: a synchronous write returns only when the kernel holds all of it,
/// and a rank reads only when its schedule says so. Each message must therefore fit into what the
/// sender's socket may queue without the receiver reading: the exchange writes one message to
/// every peer before reading; the ring keeps up to `window` segments unread per link.
std::string sync_limits_record(size_t want_exchange, size_t want_segment);

/// @brief The limits, from every rank's record (in rank order): the minimum of all, so every rank
/// picks the same algorithm for an op and cuts messages at the same places.
SyncLimits agree_sync_limits(const std::vector<std::string>& records);

/// @brief A Gloo context whose tcp pairs are switched to synchronous mode (Pair::setSync): sends
/// write on the caller's thread, and Buffer::waitRecv reads the socket on the caller's thread.
///
/// Each pair's socket is duplicated once, under the pair's own lock right after it is switched to
/// synchronous mode (Gloo keeps the descriptor in a protected member; no descriptor table scan).
/// The duplicate is this mesh's: it cannot be closed or reused by anyone else while the mesh
/// lives, so setsockopt() and shutdown() on it always reach the pair's connection, also after
/// Gloo closed its own descriptor on an error (the connection then stays open until the mesh is
/// destroyed or fail() shuts it down: every failed op calls fail() on the peer it failed on, so
/// that peer sees the connection close as it would have without the duplicate).
///
/// Deadlines are absolute for the whole op: begin() registers the op's deadline with a process-wide
/// watchdog thread, which shuts every socket of the mesh down when the deadline passes with the op
/// still running (a blocked read or write returns at once). Socket timeouts alone (arm() still sets
/// SO_RCVTIMEO/SO_SNDTIMEO to what is left) bound each system call, not the op: a peer trickling
/// a byte per call could stretch an op without end.
///
/// Failures poison the whole mesh: after a failed op (its own error, its deadline, a peer's
/// failure) poison() shuts every socket down, so every peer's op that still needs this rank fails
/// at once instead of at its own deadline, and every later op here fails at once with the reason.
/// A peer whose op had already received everything may still complete it (there is no commit
/// round); its next op fails. abort() shuts every socket down too (a thread blocked in a
/// synchronous read is not woken by Gloo's error state, which waits for the pair's lock the
/// reader holds), then puts every pair into its error state.
///
/// Slots: a message carries the slot of the bound buffer it lands in. Each (kind, direction) has
/// its own slot, so a send buffer (which Gloo unregisters by slot when it is destroyed) never
/// shares a slot with a receive buffer registered on the same pair.
class SyncMesh {
 public:
  /// @brief Kinds of messages (see slot()).
  enum Kind { kExchange = 0, kRingReduce = 1, kRingGather = 2 };

  /// @brief Collective over the group: connects the mesh through `store` (its own namespace, O(1)
  /// store round trips per rank), switches every pair to synchronous mode, sizes the send buffers
  /// and registers the inboxes: one of limits.exchange_max bytes per peer, one ring inbox of
  /// limits.segment bytes from the ring's left neighbour.
  SyncMesh(int rank, int size, const SyncLimits& limits,
           const std::shared_ptr<::gloo::transport::Device>& device, std::shared_ptr<Store> store,
           Duration timeout);
  ~SyncMesh();
  SyncMesh(const SyncMesh&) = delete;
  SyncMesh& operator=(const SyncMesh&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const SyncLimits& limits() const { return limits_; }

  /// @brief The pair to `peer` (never this rank).
  ::gloo::transport::tcp::Pair& pair(int peer) { return *links_[peer].pair; }
  /// @brief The inbox of `kind` registered on the pair from `peer` (kExchange: any peer;
  /// kRingReduce: the left neighbour), and its memory.
  ::gloo::transport::Buffer& inbox(int peer, Kind kind);
  uint8_t* inbox_data(int peer, Kind kind);
  /// @brief Slot of messages of `kind` from rank `from` to rank `to`.
  static int slot(Kind kind, int from, int to) { return 2 * static_cast<int>(kind) + (from < to ? 0 : 1); }
  /// @brief Ring segments this rank may have written to `peer` beyond what it has read (>= 1).
  size_t window(int peer) const { return links_[peer].window; }

  /// @brief The watchdog's registration of one op (begin()); unregisters when it goes away.
  /// When the deadline passed after the op's last call but before it ended (it succeeded, yet the
  /// watchdog shut the mesh down), ending it poisons the mesh saying so: the next op then fails
  /// with that reason, instead of reporting a timeout of its own that blames a peer.
  class Op {
   public:
    Op(Op&& o) noexcept : mesh_(o.mesh_), ticket_(o.ticket_) { o.ticket_ = 0; }
    ~Op();
    Op(const Op&) = delete;
    Op& operator=(const Op&) = delete;

   private:
    friend class SyncMesh;
    Op(SyncMesh* mesh, uint64_t ticket) : mesh_(mesh), ticket_(ticket) {}
    SyncMesh* mesh_;
    uint64_t ticket_;
  };
  /// @brief Start an op that must end by `deadline`: past it, the watchdog shuts the mesh down
  /// (expired() then tells). Throws Aborted after abort(), PeerError once poisoned.
  [[nodiscard]] Op begin(Deadline deadline);
  /// @brief Before a blocking call on the pair to `peer`: its socket timeouts become what is left
  /// of `deadline` (at least 1 ms). Throws Aborted after abort(), PeerError once poisoned.
  void arm(int peer, Deadline deadline);
  /// @brief After an op failed: shut every connection down (each peer fails now, not at its own
  /// deadline) and fail every later op here with `reason`. The first reason is kept.
  void poison(const std::string& reason) noexcept;
  /// @brief Whether an op's deadline passed while it ran (the watchdog shut the mesh down).
  bool expired() const { return expired_.load(); }
  /// @brief The flight recorder of the communicator this mesh belongs to (null: none). arm()
  /// tells it which peer the op blocks on; note_arrival() when a peer's first message came.
  void set_recorder(FlightRecorder* recorder) { recorder_ = recorder; }
  void note_arrival(int peer) {
    if (recorder_) recorder_->peer_arrived(peer, flight_ticks());
  }
  /// @brief Any thread: wake a blocked op (shutdown of every socket) and fail every later one.
  void abort(const std::string& reason) noexcept;
  bool aborted() const { return aborted_.load(); }
  /// @brief The mesh's own descriptor of the pair's socket to `peer` (for fault injection in tests).
  int socket(int peer) const { return links_[peer].fd; }

 private:
  struct Link {
    ::gloo::transport::tcp::Pair* pair = nullptr;
    int fd = -1;  // our duplicate of the pair's socket
    size_t window = 1;
    long long timeout_ms = -1;  // socket timeouts currently set
    std::unique_ptr<::gloo::transport::Buffer> exchange_inbox, ring_inbox;
    std::vector<uint8_t> exchange_mem, ring_mem;
  };
  void adopt_pairs();
  void adopt_socket(int peer);
  void check_usable();
  void shut_down_sockets() noexcept;
  friend class Watchdog;
  /// @brief The watchdog, at the deadline of a running op.
  void expire() noexcept;

  int rank_;
  int size_;
  SyncLimits limits_;
  std::shared_ptr<::gloo::rendezvous::Context> context_;
  std::vector<Link> links_;  // by rank; links_[rank_] unused
  std::mutex abort_mu_;      // also guards poison_reason_
  std::atomic<bool> aborted_{false}, poisoned_{false}, expired_{false};
  std::string poison_reason_;
  FlightRecorder* recorder_ = nullptr;
};

/// @brief In place: data (count elements of elem_size bytes, at most limits().exchange_max bytes)
/// becomes the reduction over every rank, in one exchange: written to every peer's inbox, every
/// peer's read from ours, contributions reduced in rank order (the same bits on every rank).
/// Throws Gloo's exceptions; *peer is then the rank whose socket failed (or -1).
void sync_exchange_allreduce(SyncMesh& mesh, void* data, size_t count, size_t elem_size,
                             const ReduceFn& reduce, Deadline deadline, int* peer);

/// @brief A pipelined ring over the synchronous mesh. `data` holds size() blocks (block b:
/// elements [offset[b], offset[b] + count[b])). With `reduce` set, a reduce-scatter leaves the
/// reduction of block rank() in place; with `gather`, an all-gather then spreads block b of rank b
/// to everyone (both: an all-reduce). Each block is cut into the same number of segments of at
/// most limits().segment bytes; a rank writes segment after segment to its right neighbour while
/// reading (and reducing) its left neighbour's, up to window() segments ahead. Segments of the
/// all-gather land in `data` directly (a bound buffer over it, registered for the op).
/// Throws Gloo's exceptions; *peer is then the rank whose socket failed (or -1).
void sync_ring(SyncMesh& mesh, void* data, size_t elem_size, const std::vector<size_t>& offset,
               const std::vector<size_t>& count, const ReduceFn* reduce, bool gather, Deadline deadline,
               int* peer);

}  // namespace gz::comm::gloo_impl
