// The flight recorder: every communicator keeps its last ops (what, when, how it ended, which peers
// it waited for) in a preallocated ring, cheap enough to stay on in production. Dumps
// (flight_dump.h) and the straggler report read it; the Communicator base class feeds it, so every
// backend is covered. LibTorch-free.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gz/comm/types.h"
#include "gz/core/dtype.h"
#include "gz/core/phase.h"

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

namespace gz::comm {

namespace flight_detail {
extern bool g_use_tsc;  ///< set once at start-up: the TSC is invariant (constant rate, never stops)
uint64_t steady_ticks() noexcept;
inline std::atomic<bool> g_paused{false};  ///< set_flight_recorders_paused()
}  // namespace flight_detail

/// @brief Pause every flight recorder of the process (Communicator::flight_recorder() answers
/// nullptr, so ops record nothing) or resume them. For measuring the recorder's own cost A/B within
/// one run (gz-train's GZ_OBS_AB_WINDOW): call it between steps, with no op in flight, or an op's
/// end goes unrecorded. A backend that took its recorder at construction (Gloo's arrival exchange)
/// keeps recording arrivals.
inline void set_flight_recorders_paused(bool paused) noexcept {
  flight_detail::g_paused.store(paused, std::memory_order_relaxed);
}

/// @brief The recorder's clock: the TSC where it is invariant (about 10 ns a read, against about
/// 25 ns for steady_clock on this VM), else steady_clock nanoseconds. One read per event. Never 0.
inline uint64_t flight_ticks() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  if (flight_detail::g_use_tsc) return __rdtsc();
#endif
  return flight_detail::steady_ticks();
}

/// @brief Ticks of flight_ticks() as steady_clock nanoseconds (the clock of gz::current_phase()).
/// Calibrated against steady_clock over the process's lifetime; exact when the TSC is not used.
int64_t flight_ticks_to_steady_ns(uint64_t ticks);
/// @brief "tsc" or "steady", and ticks per nanosecond (for the dump's clock info).
const char* flight_clock_source();
double flight_ticks_per_ns();

/// @brief Where an op is. `queued`: an async op waiting for the progress thread.
enum class OpState : uint8_t { queued = 0, running, done, failed };
const char* op_state_name(OpState s);

/// @brief What an op record says besides its times (also the description of a queued op).
struct OpInfo {
  OpKind kind = OpKind::barrier;
  DType dtype = DType::u8;
  ReduceOp reduce = ReduceOp::sum;
  bool task = false;  ///< an opaque submit()ted function (kind etc. unknown)
  int root = -1;
  int tag = 0;
  uint64_t count = 0;
};

/// @brief A consistent copy of one record, times in steady_clock nanoseconds (0 = not yet).
struct OpRecord {
  uint64_t seq = 0;
  /// @brief The op's number among this group's collectives (send/recv: that of the next one).
  /// What ranks agree on when point-to-point ops shift their sequence numbers.
  uint64_t coll = 0;
  OpInfo info;
  OpState state = OpState::done;
  int64_t issue_ns = 0, start_ns = 0, end_ns = 0;
  Phase phase = Phase::idle;  ///< the process's phase mark when the op was issued
  int64_t step = -1;
  int waiting_for = -1;  ///< running op: the peer this rank is blocked on now (-1: unknown)
  /// @brief Per peer (group rank): nanoseconds after this rank's start that the peer was seen at
  /// this op (0 = it was there first), -1 = not seen (still awaited, or the backend cannot tell).
  /// Empty when the record is older than the arrival window or the backend records no arrivals.
  std::vector<int64_t> arrival_ns;
  std::string error;       ///< failed: the error's text
  std::string error_kind;  ///< "timeout", "peer", "aborted", "invalid", "error"
  int error_peer = -1;     ///< failed: the peer the error names (group rank), -1 none
};

/// @brief Who a recorder belongs to, for dumps: a name every member of the group derives alike
/// ("comm1", "comm1/node0", "comm1/rail1", "comm1/g2"), and its members.
struct FlightIdentity {
  std::string name;
  std::string backend;
  int rank = 0;
  int size = 1;
  /// @brief Members in the numbering of `parent` (or global ranks when there is no parent);
  /// empty = unknown.
  std::vector<int> ranks;
  uint64_t parent = 0;  ///< id() of the recorder of the communicator this one belongs to, 0 = none
};

/// @brief Per-peer totals of how late peers came to this group's ops, since the recorder started
/// (global ranks where they are known, else group ranks). Differences of two reads give a window.
struct PeerLateness {
  std::vector<int> ranks;            ///< the rank each entry stands for
  std::vector<uint64_t> late_ns;     ///< time this rank spent waiting for that peer to arrive
  std::vector<uint64_t> times_last;  ///< ops at which that peer was the last to arrive (and late)
  uint64_t ops = 0;                  ///< ops recorded with arrivals
};

/// @brief A snapshot of one recorder (what a dump writes).
struct FlightSnapshot {
  uint64_t id = 0;
  FlightIdentity identity;
  size_t capacity = 0;
  uint64_t next_seq = 0;          ///< ops recorded so far
  bool retired = false;           ///< its communicator was destroyed (copied at destruction)
  std::vector<OpRecord> records;  ///< oldest first (queued async ops last)
};

/// @brief The ring of one communicator.
///
/// One writer at a time (the thread running the communicator's ops: the caller, or the progress
/// thread; the Communicator orders them), any number of readers: every field is a relaxed atomic,
/// each record is guarded by its sequence word (seqlock), so a reader copies a record whole or
/// skips it, and the writer never waits. The fast path of an op is one clock read at its start,
/// one at its end, a phase read and a handful of stores into memory allocated up front.
class FlightRecorder {
 public:
  /// @brief `capacity` records (at least 16), group of `size` ranks.
  FlightRecorder(size_t capacity, int rank, int size);
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  /// @brief Default capacity (GZ_FLIGHT_RECORDER=N; 0 = recorder off; default 2000).
  static size_t capacity_from_env();

  // ---- writer (the op's thread) ----
  /// @brief Record op `seq` starting now; issued at `issue_ticks` (0 = now). Returns its handle.
  uint64_t begin(uint64_t seq, const OpInfo& info, uint64_t issue_ticks = 0) noexcept {
    const uint64_t h = head_.load(std::memory_order_relaxed);
    Slot& s = ring_[h % capacity_];
    const uint64_t now = flight_ticks();
    const PhaseMark pm = current_phase();
    // Collectives get their own number too: point-to-point ops between some ranks shift the
    // sequence numbers of one rank against another's, the collective numbers stay aligned.
    const uint64_t coll = coll_.load(std::memory_order_relaxed);
    if (info.kind != OpKind::send && info.kind != OpKind::recv)
      coll_.store(coll + 1, std::memory_order_relaxed);
    s.seq.store(kBusy, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    s.desc.store(pack(info, OpState::running, pm.phase) | (coll & kCollMask) << 41,
                 std::memory_order_relaxed);
    s.count.store(info.count, std::memory_order_relaxed);
    s.tag_root.store(pack_tag_root(info), std::memory_order_relaxed);
    s.issue.store(issue_ticks ? issue_ticks : now, std::memory_order_relaxed);
    s.start.store(now, std::memory_order_relaxed);
    s.end.store(0, std::memory_order_relaxed);
    s.step.store(pm.step, std::memory_order_relaxed);
    s.seq.store(seq, std::memory_order_release);
    head_.store(h + 1, std::memory_order_release);
    cur_start_ = now;
    cur_last_peer_ = -1;
    cur_last_late_ = 0;
    cur_noted_ = false;
    waiting_.store(-1, std::memory_order_relaxed);
    return h;
  }
  /// @brief The op of handle `h` completed.
  void finish(uint64_t h) noexcept {
    Slot& s = ring_[h % capacity_];
    s.end.store(flight_ticks(), std::memory_order_relaxed);
    s.desc.store(with_state(s.desc.load(std::memory_order_relaxed), OpState::done),
                 std::memory_order_release);
    if (cur_noted_) note_end();
    __builtin_prefetch(&ring_[(h + 1) % capacity_], 1);  // the next op's slot, while the caller computes
  }
  /// @brief The op of handle `h` failed with `error` (slow path: keeps the text, asks for a dump).
  void fail(uint64_t h, std::exception_ptr error) noexcept;

  /// @brief Backends, for the running op: `peer` (group rank) was seen at it at `ticks`
  /// (flight_ticks(); 0 = it was there before this rank looked, no clock read needed).
  void peer_arrived(int peer, uint64_t ticks) noexcept {
    if (window_ == 0) return;
    const uint64_t h = head_.load(std::memory_order_relaxed) - 1;
    uint64_t late = ticks > cur_start_ ? ticks - cur_start_ : 0;
    if (late > kLateMask - 1) late = kLateMask - 1;
    arrivals_[(h % window_) * size_ + peer].store(((h & 0xffff) << 48) | (late + 1),
                                                  std::memory_order_relaxed);
    cur_noted_ = true;
    if (!has_arrivals_) has_arrivals_ = true;  // this backend tells arrivals: dumps show them
    if (late > cur_last_late_) {
      cur_last_late_ = late;
      cur_last_peer_ = peer;
    }
  }
  /// @brief Backends, for the running op: this rank is blocked on `peer` now (-1: on nobody).
  void waiting_for(int peer) noexcept { waiting_.store(peer, std::memory_order_relaxed); }

  /// @brief Async ops: `info` was queued at `ticks` / the oldest queued op started. Any thread.
  void enqueued(const OpInfo& info, uint64_t ticks);
  void dequeued();

  // ---- readers (any thread) ----
  /// @brief The last `max_records` records (0 = all kept), then the queued ops.
  FlightSnapshot snapshot(size_t max_records = 0) const;
  /// @brief Lateness of peers at this group's ops, folded in with that of the recorders whose
  /// parent is this one (a hierarchical communicator's parts), in global ranks where known.
  PeerLateness lateness() const;
  /// @brief This group's own per-peer totals, in group ranks.
  PeerLateness own_lateness() const;

  /// @brief Process-unique id (never 0), as FlightIdentity::parent refers to it.
  uint64_t id() const { return id_; }
  FlightIdentity identity() const;
  void set_identity(FlightIdentity identity);
  size_t capacity() const { return capacity_; }
  int size() const { return size_; }

 private:
  static constexpr uint64_t kBusy = ~uint64_t{0};
  static constexpr uint64_t kLateMask = (uint64_t{1} << 48) - 1;
  static constexpr uint64_t kCollMask = (uint64_t{1} << 23) - 1;  ///< low bits kept per record
  struct alignas(64) Slot {
    std::atomic<uint64_t> seq{kBusy};
    std::atomic<uint64_t> desc{0};
    std::atomic<uint64_t> count{0};
    std::atomic<uint64_t> tag_root{0};
    std::atomic<uint64_t> issue{0}, start{0}, end{0};
    std::atomic<int64_t> step{-1};
  };
  static uint64_t pack(const OpInfo& i, OpState st, Phase ph) noexcept {
    return uint64_t(uint8_t(i.kind)) | uint64_t(uint8_t(i.dtype)) << 8 | uint64_t(uint8_t(i.reduce)) << 16 |
           uint64_t(uint8_t(st)) << 24 | uint64_t(uint8_t(ph)) << 32 | uint64_t(i.task) << 40;
  }
  static uint64_t with_state(uint64_t desc, OpState st) noexcept {
    return (desc & ~(uint64_t{0xff} << 24)) | uint64_t(uint8_t(st)) << 24;
  }
  static uint64_t pack_tag_root(const OpInfo& i) noexcept {
    return uint64_t(uint32_t(i.tag)) << 32 | uint32_t(i.root);
  }
  bool read_slot(uint64_t h, OpRecord* out) const;
  void note_end() noexcept;

  const uint64_t id_;
  const size_t capacity_;
  const int rank_, size_;
  const size_t window_;  ///< records that keep per-peer arrivals (the last ones)
  std::unique_ptr<Slot[]> ring_;
  std::unique_ptr<std::atomic<uint64_t>[]> arrivals_;  ///< window_ x size_: (head & 0xffff) << 48 | late + 1
  std::atomic<uint64_t> head_{0};
  std::atomic<uint64_t> coll_{0};  ///< collectives recorded (the next one's number)
  std::atomic<int> waiting_{-1};
  // Writer-only state of the running op.
  uint64_t cur_start_ = 0;
  int cur_last_peer_ = -1;
  uint64_t cur_last_late_ = 0;
  bool cur_noted_ = false;
  std::atomic<bool> has_arrivals_{false};
  // Per-peer totals (writer adds, readers read).
  std::unique_ptr<std::atomic<uint64_t>[]> late_ticks_, times_last_;
  std::atomic<uint64_t> arrival_ops_{0};

  mutable std::mutex mu_;  ///< identity, errors, queued ops (never taken on the fast path)
  FlightIdentity identity_;
  struct Failure {
    uint64_t seq;
    std::string text, kind;
    int peer;
  };
  std::vector<Failure> failures_;  ///< the last few failures, by seq
  struct Queued {
    OpInfo info;
    uint64_t ticks;
  };
  std::vector<Queued> queued_;
};

}  // namespace gz::comm
