// The step protocol (see ShmCommunicator): publishing and awaiting steps, the per-op descriptors
// that catch mismatched collectives, and how a wait ends early: abort, a rejected message, a dead
// peer, or the op's deadline.
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <sstream>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define GZ_CPU_RELAX() _mm_pause()
#else
#define GZ_CPU_RELAX() std::this_thread::yield()
#endif

#include "comm/shm/protocol.h"
#include "comm/shm/shm_communicator.h"
#include "gz/core/error.h"

namespace gz::comm::shm {

// ---------------------------------------------------------------- futex, descriptors

void futex_wait(const uint32_t* word, uint32_t expected, Duration slice) {
  struct timespec ts;
  ts.tv_sec = slice.count() / 1000;
  ts.tv_nsec = (slice.count() % 1000) * 1000000L;
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);  // EAGAIN/ETIMEDOUT/EINTR: recheck
}

void futex_wake(const uint32_t* word) { syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0); }

std::string describe(const OpDesc& d) {
  std::ostringstream os;
  os << op_kind_name(static_cast<OpKind>(d.kind));
  auto k = static_cast<OpKind>(d.kind);
  if (k == OpKind::barrier) return os.str() + "()";
  os << "(" << dtype_name(static_cast<DType>(d.dtype)) << " x " << d.count;
  if (k == OpKind::allgatherv) os << " total, counts hash " << std::hex << d.extra << std::dec;
  if (k == OpKind::allreduce || k == OpKind::reduce || k == OpKind::reduce_scatter)
    os << ", " << reduce_op_name(static_cast<ReduceOp>(d.op));
  if ((k == OpKind::allreduce || k == OpKind::reduce_scatter || k == OpKind::allgather) && d.extra)
    os << ", alloc_buffer block " << (d.extra >> 40) - 1 << " at byte "
       << (d.extra & ((uint64_t(1) << 40) - 1));
  if (k == OpKind::broadcast || k == OpKind::reduce) os << ", root " << d.root;
  os << ")";
  return os.str();
}

bool same(const OpDesc& a, const OpDesc& b) {
  return a.coll == b.coll && a.count == b.count && a.extra == b.extra && a.kind == b.kind && a.dtype == b.dtype &&
         a.op == b.op && a.root == b.root;
}

// ---------------------------------------------------------------- waiting and errors

// "shm <op> #<seq> on rank r/n[ with peer p] failed after <t>[ (tag t)]": the prefix every backend's
// op errors share (Communicator::op_failure).
std::string ShmCommunicator::where(const OpCtx& ctx) const {
  std::string s = op_failure(op_kind_name(ctx.kind), ctx.peer, ctx.sw.elapsed());
  if (ctx.peer >= 0) s += " (tag " + std::to_string(ctx.tag) + ")";
  return s;
}

void ShmCommunicator::check_interrupts(const OpCtx& ctx, const uint32_t* fail_word) const {
  auto* h = reinterpret_cast<Header*>(base_);
  uint32_t p = load_acq(&h->poison);
  if (p != 0)
    throw Aborted(detail::concat(where(ctx), ": communicator aborted by rank ", p - 1, ": ",
                                 std::string(h->reason, strnlen(h->reason, sizeof(h->reason)))),
                  static_cast<int>(p - 1));
  check_aborted();
  if (fail_word && load_acq(fail_word) != 0)
    GZ_THROW(InvalidArgument, where(ctx), ": the receiver rejected the message (tag, dtype or count differ)");
}

void ShmCommunicator::check_alive(int peer, const OpCtx& ctx) const {
  if (lock_->peer_holds(peer)) return;
  // The pid is the peer's own view (its PID namespace): a hint for the reader, never a test.
  const int pid = __atomic_load_n(&ctrl(peer).pid, __ATOMIC_RELAXED);
  const bool closed = __atomic_load_n(&ctrl(peer).closed, __ATOMIC_SEQ_CST) != 0;
  const char* what = closed ? "closed its communicator" : "died";
  throw PeerError(detail::concat(where(ctx), ": peer rank ", peer, " (pid ", pid, ") ", what), peer);
}

void ShmCommunicator::throw_collective_timeout(const OpCtx& ctx, uint32_t target) const {
  std::ostringstream missing;
  int nmiss = 0, last_missing = -1;
  for (int q = 0; q < size_; ++q) {
    if (q == rank_ || reached(load_acq(&ctrl(q).flag), target)) continue;
    missing << (nmiss++ ? ", " : "") << q;
    last_missing = q;
  }
  const bool first = target == ctx.first_step;
  throw TimeoutError(detail::concat(where(ctx), ": deadline passed waiting for rank(s) ", missing.str(),
                                    first ? " (not arrived: they have not called this collective)"
                                          : " (stopped in the middle of this collective)"),
                     nmiss == 1 ? last_missing : -1);
}

bool ShmCommunicator::wait_for(const uint32_t* word, uint32_t target, uint32_t* sleepers, int peer, OpCtx& ctx,
                               const uint32_t* fail_word) {
  if (reached(load_acq(word), target)) return true;
  // Spin phase: peers on other cores usually arrive within microseconds.
  const auto spin_end = Clock::now() + std::chrono::microseconds(spin_us_);
  for (;;) {
    for (int k = 0; k < 64; ++k) {
      if (reached(load_acq(word), target)) return true;
      GZ_CPU_RELAX();
    }
    check_interrupts(ctx, fail_word);
    if (oversubscribed_) sched_yield();  // more ranks than cores: let the peer run
    if (Clock::now() >= spin_end) break;
  }
  // Blocking phase: futex on the peer's word in short slices, checking deadline, abort, liveness.
  auto last_alive_check = Clock::now();
  for (;;) {
    __atomic_add_fetch(sleepers, 1, __ATOMIC_SEQ_CST);
    uint32_t v = __atomic_load_n(word, __ATOMIC_SEQ_CST);
    if (!reached(v, target)) {
      Duration slice = std::min<Duration>(ctx.deadline.remaining(), Duration(20));
      if (slice.count() > 0) futex_wait(word, v, slice);
    }
    __atomic_sub_fetch(sleepers, 1, __ATOMIC_SEQ_CST);
    if (reached(load_acq(word), target)) return true;
    check_interrupts(ctx, fail_word);
    if (ctx.deadline.expired()) return false;
    auto now = Clock::now();
    if (peer >= 0 && now - last_alive_check >= std::chrono::milliseconds(100)) {
      check_alive(peer, ctx);
      last_alive_check = now;
    }
  }
}

ShmCommunicator::OpCtx ShmCommunicator::begin_op(OpKind kind, size_t count, uint64_t extra, DType dtype, ReduceOp op,
                                                 int root) {
  OpCtx ctx{kind, current_seq(), op_deadline(), Stopwatch(), OpDesc{}, phase_ + 1};
  ctx.desc = OpDesc{coll_, count, extra, static_cast<uint8_t>(kind), static_cast<uint8_t>(dtype),
                    static_cast<uint8_t>(op), 0, root};
  ctrl(rank_).desc[coll_ % 2] = ctx.desc;  // published by the first step's flag store
  ++coll_;
  check_interrupts(ctx, nullptr);
  return ctx;
}

void ShmCommunicator::step(OpCtx& ctx) {
  const uint32_t target = ++phase_;
  RankCtrl& me = ctrl(rank_);
  publish(&me.flag, target, &me.sleepers);
  // Flight recorder: when each peer arrived at this op (its first step). A peer already there
  // costs one store; a clock is read only after an actual wait (peers found after it were there
  // by then: an upper bound).
  FlightRecorder* fr = target == ctx.first_step ? flight_recorder() : nullptr;
  uint64_t seen = 0;
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    RankCtrl& c = ctrl(q);
    if (fr && reached(load_acq(&c.flag), target)) {
      fr->peer_arrived(q, seen);
      continue;
    }
    if (fr) fr->waiting_for(q);
    if (!wait_for(&c.flag, target, &c.sleepers, q, ctx, nullptr)) throw_collective_timeout(ctx, target);
    if (fr) {
      seen = flight_ticks();
      fr->peer_arrived(q, seen);
      fr->waiting_for(-1);
    }
  }
  if (!ctx.checked) {
    ctx.checked = true;
    check_descriptors(ctx);
  }
}

void ShmCommunicator::check_descriptors(OpCtx& ctx) {
  // Every rank compares everyone against rank 0, so all ranks report the same first difference.
  const size_t slot = ctx.desc.coll % 2;
  const OpDesc d0 = ctrl(0).desc[slot];
  for (int q = 1; q < size_; ++q) {
    const OpDesc dq = ctrl(q).desc[slot];
    if (!same(d0, dq))
      GZ_THROW(InvalidArgument, "collective mismatch at seq ", ctx.seq, ": rank 0 ", describe(d0), " vs rank ", q, " ",
               describe(dq), " (seen by rank ", rank_, ")");
  }
}

void ShmCommunicator::do_barrier() {
  guarded([&] {
    OpCtx ctx = begin_op(OpKind::barrier, 0, 0, DType::u8, ReduceOp::sum, -1);
    step(ctx);
  });
}

}  // namespace gz::comm::shm
