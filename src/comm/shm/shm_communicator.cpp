#include "comm/shm/shm_communicator.h"

#include <linux/futex.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define GZ_CPU_RELAX() _mm_pause()
#else
#define GZ_CPU_RELAX() std::this_thread::yield()
#endif

#include "comm/shm/reduce_kernels.h"
#include "gz/core/env.h"
#include "gz/core/error.h"
#include "gz/core/log.h"
#include "gz/store/prefix_store.h"

namespace gz::comm::shm {

// ---------------------------------------------------------------- segment layout

namespace {
constexpr uint64_t kMagic = 0x677a2d73686d3031ull;  // "gz-shm01"
constexpr size_t kLine = 64;
constexpr size_t kDefaultChunk = 512 * 1024;   // per step: half of L2; three slots per rank stay in L3
constexpr size_t kDefaultSmall = 16 * 1024;    // at or below: one step, every rank reduces everything
constexpr size_t kMaxP2P = 64 * 1024;
constexpr int kDefaultSpinUs = 50;
constexpr size_t kScratch = 32 * 1024;  // streamed zero-copy all-reduce: one piece, in L1/L2

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }
}  // namespace

/// Descriptor of one collective, published before its first step (mismatch detection).
struct OpDesc {
  uint64_t coll;
  uint64_t count;
  uint64_t extra;  // allgatherv: hash of the counts
  uint8_t kind, dtype, op, pad;
  int32_t root;
};
static_assert(sizeof(OpDesc) == 32, "OpDesc layout");

struct Header {
  uint64_t magic;
  uint32_t size;
  uint32_t pad;
  uint64_t slot_bytes;
  uint64_t small_bytes;  // latency-path threshold: rank 0's choice, so every rank takes the same path
  alignas(kLine) uint32_t poison;  // 0, or 1 + the rank that aborted
  uint32_t abort_claim;
  alignas(kLine) char reason[512];
};

struct RankCtrl {
  alignas(kLine) uint32_t flag;  // last step published (polled by peers: own line)
  alignas(kLine) OpDesc desc[2];
  alignas(kLine) uint32_t sleepers;  // waiters blocked in futex on `flag`
  int32_t pid;
};
static_assert(sizeof(RankCtrl) == 3 * kLine, "RankCtrl layout");

struct ChannelCtrl {
  alignas(kLine) uint32_t head;  // chunks written by the sender
  alignas(kLine) uint32_t head_sleepers;
  alignas(kLine) uint32_t tail;  // chunks consumed by the receiver
  alignas(kLine) uint32_t tail_sleepers;
  alignas(kLine) uint32_t error;  // set by the receiver on a mismatched message
};

struct ChunkHeader {
  int32_t tag;
  uint8_t dtype;
  uint8_t pad[3];
  uint64_t count;   // elements of the whole message
  uint64_t offset;  // first element of this chunk
};

Layout::Layout(int n, size_t slot) : size(n) {
  slot_bytes = round_up(std::max<size_t>(slot, kLine * size_t(n)), kLine);
  // Point-to-point channels grow with n^2: keep their total near 8 MiB (4 KiB .. 64 KiB each).
  const size_t fair = round_up(std::max<size_t>(4096, (4u << 20) / (size_t(n) * n)), kLine);
  p2p_bytes = std::min({slot_bytes, kMaxP2P, fair});
  ctrl_off = round_up(sizeof(Header), 4096);
  data_off = round_up(ctrl_off + sizeof(RankCtrl) * n, 4096);
  chan_off = round_up(data_off + 3 * slot_bytes * n, 4096);
  const size_t chan_bytes = sizeof(ChannelCtrl) + 2 * (kLine + p2p_bytes);
  total = round_up(chan_off + chan_bytes * size_t(n) * n, 4096);
}

// ---------------------------------------------------------------- atomics and futex

namespace {

inline uint32_t load_acq(const uint32_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
inline bool reached(uint32_t v, uint32_t target) { return static_cast<int32_t>(v - target) >= 0; }

void futex_wait(const uint32_t* word, uint32_t expected, Duration slice) {
  struct timespec ts;
  ts.tv_sec = slice.count() / 1000;
  ts.tv_nsec = (slice.count() % 1000) * 1000000L;
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);  // EAGAIN/ETIMEDOUT/EINTR: recheck
}

void futex_wake(const uint32_t* word) { syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0); }

// Publish a new value; wake sleepers only when there are any (no syscall on the fast path). The
// seq_cst store/load pair against the waiter's seq_cst increment/load rules out lost wake-ups.
inline void publish(uint32_t* word, uint32_t value, uint32_t* sleepers) {
  __atomic_store_n(word, value, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(sleepers, __ATOMIC_SEQ_CST) != 0) futex_wake(word);
}

bool process_alive(int pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  // A killed child that nobody reaped yet is a zombie: dead for our purposes.
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return true;
  auto close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return true;
  char state = line[close + 2];
  return state != 'Z' && state != 'X';
}

std::string describe(const OpDesc& d) {
  std::ostringstream os;
  os << op_kind_name(static_cast<OpKind>(d.kind));
  auto k = static_cast<OpKind>(d.kind);
  if (k == OpKind::barrier) return os.str() + "()";
  os << "(" << dtype_name(static_cast<DType>(d.dtype)) << " x " << d.count;
  if (k == OpKind::allgatherv) os << " total, counts hash " << std::hex << d.extra << std::dec;
  if (k == OpKind::allreduce || k == OpKind::reduce || k == OpKind::reduce_scatter)
    os << ", " << reduce_op_name(static_cast<ReduceOp>(d.op));
  if (k == OpKind::allreduce && d.extra)
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

struct Part {
  size_t off, len;
};
// Partition of a chunk of `len` elements among n owners, cut at cache-line multiples.
inline Part part_of(size_t len, int n, int i, size_t esize) {
  const size_t align = std::max<size_t>(1, kLine / esize);
  const size_t per = round_up((len + n - 1) / n, align);
  const size_t b = std::min(len, per * size_t(i));
  const size_t e = std::min(len, per * size_t(i + 1));
  return {b, e - b};
}

// Copy out of a shared slot into the caller's buffer; big outputs bypass the caches.
inline void to_user(void* dst, const void* src, size_t bytes, bool stream) {
  if (stream) copy_streaming(dst, src, bytes);
  else copy_cached(dst, src, bytes);
}

}  // namespace

struct ShmCommunicator::OpCtx {
  OpKind kind;
  uint64_t seq;
  Deadline deadline;
  Stopwatch sw;
  OpDesc desc;
  uint32_t first_step;
  bool checked = false;
  int peer = -1;  // point-to-point ops
  int tag = 0;
};

// ---------------------------------------------------------------- construction

ShmCommunicator::ShmCommunicator(int rank, int size, std::shared_ptr<Store> store, const ShmOptions& options,
                                 std::shared_ptr<Segment> segment, Layout layout, std::string group_id)
    : Communicator(options.timeout),
      rank_(rank),
      size_(size),
      store_(std::move(store)),
      segment_(std::move(segment)),
      layout_(layout),
      group_id_(std::move(group_id)),
      base_(segment_->data()),
      pid_(static_cast<int>(getpid())) {
  Env env = Env::from_process();
  int spin = options.spin_us >= 0 ? options.spin_us : static_cast<int>(env.get_int("GZ_SHM_SPIN_US", kDefaultSpinUs));
  spin_us_ = std::max(0, spin);
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  oversubscribed_ = static_cast<unsigned>(size) > cores;
  small_bytes_ = reinterpret_cast<const Header*>(base_)->small_bytes;
  stream_bytes_ = static_cast<size_t>(env.get_int("GZ_SHM_STREAM_BYTES", 16ll << 20));
  zero_copy_ = options.zero_copy && env.get_int("GZ_SHM_ZERO_COPY", 1) != 0;
  send_head_.assign(size, 0);
  recv_tail_.assign(size, 0);
  srcs_.assign(size, nullptr);
  scratch_.resize(kScratch);
}

ShmCommunicator::~ShmCommunicator() { shutdown_executor(); }

RankCtrl& ShmCommunicator::ctrl(int r) const {
  return reinterpret_cast<RankCtrl*>(base_ + layout_.ctrl_off)[r];
}

ChannelCtrl& ShmCommunicator::channel(int src, int dst) const {
  const size_t chan_bytes = sizeof(ChannelCtrl) + 2 * (kLine + layout_.p2p_bytes);
  return *reinterpret_cast<ChannelCtrl*>(base_ + layout_.chan_off + chan_bytes * (size_t(src) * size_ + dst));
}

char* ShmCommunicator::channel_slot(int src, int dst, uint32_t i) const {
  char* c = reinterpret_cast<char*>(&channel(src, dst));
  return c + sizeof(ChannelCtrl) + (i % 2) * (kLine + layout_.p2p_bytes);
}

// ---------------------------------------------------------------- waiting and errors

std::string ShmCommunicator::where(const OpCtx& ctx) const {
  std::ostringstream os;
  os << "shm rank " << rank_ << "/" << size_ << ": " << op_kind_name(ctx.kind);
  if (ctx.peer >= 0) os << (ctx.kind == OpKind::send ? " to rank " : " from rank ") << ctx.peer << " (tag " << ctx.tag << ")";
  os << " (seq " << ctx.seq << ")";
  return os.str();
}

void ShmCommunicator::check_interrupts(const OpCtx& ctx, const uint32_t* fail_word) const {
  auto* h = reinterpret_cast<Header*>(base_);
  uint32_t p = load_acq(&h->poison);
  if (p != 0)
    GZ_THROW(Aborted, where(ctx), " aborted after ", format_duration(ctx.sw.elapsed()), ": communicator aborted by rank ",
             p - 1, ": ", std::string(h->reason, strnlen(h->reason, sizeof(h->reason))));
  check_aborted();
  if (fail_word && load_acq(fail_word) != 0)
    GZ_THROW(InvalidArgument, where(ctx), ": the receiver rejected the message (tag, dtype or count differ)");
}

void ShmCommunicator::check_alive(int peer, const OpCtx& ctx) const {
  int pid = __atomic_load_n(&ctrl(peer).pid, __ATOMIC_RELAXED);
  if (pid <= 0 || pid == pid_) return;
  if (!process_alive(pid))
    GZ_THROW(PeerError, where(ctx), ": peer rank ", peer, " (pid ", pid, ") died; detected after ",
             format_duration(ctx.sw.elapsed()));
}

void ShmCommunicator::throw_collective_timeout(const OpCtx& ctx, uint32_t target) const {
  std::ostringstream missing;
  int nmiss = 0;
  for (int q = 0; q < size_; ++q) {
    if (q == rank_ || reached(load_acq(&ctrl(q).flag), target)) continue;
    missing << (nmiss++ ? ", " : "") << q;
  }
  const bool first = target == ctx.first_step;
  GZ_THROW(TimeoutError, where(ctx), " timed out after ", format_duration(ctx.sw.elapsed()), " waiting for rank(s) ",
           missing.str(), first ? " (not arrived: they have not called this collective)"
                                : " (stopped in the middle of this collective)");
}

template <typename OnTimeout>
void ShmCommunicator::wait_for(const uint32_t* word, uint32_t target, uint32_t* sleepers, int peer, OpCtx& ctx,
                               const uint32_t* fail_word, OnTimeout&& on_timeout) {
  if (reached(load_acq(word), target)) return;
  // Spin phase: peers on other cores usually arrive within microseconds.
  const auto spin_end = Clock::now() + std::chrono::microseconds(spin_us_);
  for (;;) {
    for (int k = 0; k < 64; ++k) {
      if (reached(load_acq(word), target)) return;
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
    if (reached(load_acq(word), target)) return;
    check_interrupts(ctx, fail_word);
    if (ctx.deadline.expired()) on_timeout();
    auto now = Clock::now();
    if (peer >= 0 && now - last_alive_check >= std::chrono::milliseconds(100)) {
      check_alive(peer, ctx);
      last_alive_check = now;
    }
  }
}

template <typename Fn>
void ShmCommunicator::guarded(Fn&& fn) {
  if (broken_) std::rethrow_exception(broken_);
  try {
    fn();
  } catch (const TimeoutError&) {
    broken_ = std::current_exception();  // peers' steps are now out of line with ours
    throw;
  } catch (const PeerError&) {
    broken_ = std::current_exception();
    throw;
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
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    RankCtrl& c = ctrl(q);
    wait_for(&c.flag, target, &c.sleepers, q, ctx, nullptr, [&] { throw_collective_timeout(ctx, target); });
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

// ---------------------------------------------------------------- collectives

void ShmCommunicator::reduce_impl(char* data, size_t count, DType dtype, ReduceOp op, int root, OpCtx& ctx) {
  const size_t es = dtype_size(dtype);
  const int n = size_;
  std::vector<const void*>& srcs = srcs_;
  if (count * es <= small_bytes_ && count * es <= layout_.slot_bytes) {
    // Latency path: one step; every rank (or only the root) folds all inputs in rank order.
    const uint32_t s = (phase_ + 1) % 3;
    if (n > 1 && count) std::memcpy(slot(rank_, s), data, count * es);  // data may be null when count is 0
    step(ctx);
    if (root >= 0 && root != rank_) return;
    for (int q = 0; q < n; ++q) srcs[q] = q == rank_ ? data : slot(q, s);
    reduce_n(data, nullptr, srcs.data(), n, count, dtype, op, n);
    return;
  }
  // Bandwidth path, per chunk: copy into my slot only the parts peers reduce; reduce my own part
  // from my user buffer + peers' slots into my buffer and my slot; copy peers' results out.
  // The reduce of chunk k and the copy-in of chunk k+1 share one step.
  const size_t E = layout_.slot_bytes / es;
  const size_t m = (count + E - 1) / E;
  // Messages far beyond the caches: write results to the user buffer with streaming stores.
  const bool stream = count * es >= stream_bytes_;
  size_t prev_base = 0, prev_len = 0;
  uint32_t prev_slot = 0;
  for (size_t it = 0; it <= m; ++it) {
    if (it > 0) {
      const Part pr = part_of(prev_len, n, rank_, es);
      if (pr.len > 0) {
        char* mine = data + (prev_base + pr.off) * es;
        for (int q = 0; q < n; ++q) srcs[q] = q == rank_ ? mine : slot(q, prev_slot) + pr.off * es;
        reduce_n(mine, slot(rank_, prev_slot) + pr.off * es, srcs.data(), n, pr.len, dtype, op, n);
      }
    }
    const size_t base = it * E;
    const size_t len = it < m ? std::min(E, count - base) : 0;
    const uint32_t s = (phase_ + 1) % 3;
    for (int p = 0; p < n && len > 0; ++p) {
      if (p == rank_) continue;
      const Part pp = part_of(len, n, p, es);
      copy_cached(slot(rank_, s) + pp.off * es, data + (base + pp.off) * es, pp.len * es);
    }
    step(ctx);
    if (it > 0 && (root < 0 || root == rank_)) {
      for (int p = 0; p < n; ++p) {
        if (p == rank_) continue;
        const Part pp = part_of(prev_len, n, p, es);
        char* to = data + (prev_base + pp.off) * es;
        const char* from = slot(p, prev_slot) + pp.off * es;
        to_user(to, from, pp.len * es, stream);
      }
    }
    prev_base = base;
    prev_len = len;
    prev_slot = s;
  }
}

void ShmCommunicator::do_allreduce(void* data, size_t count, DType dtype, ReduceOp op) {
  guarded([&] {
    // alloc_buffer memory beyond the latency path: reduce straight between the ranks' blocks. The
    // descriptor carries block and offset, so ranks passing different memory fail with a mismatch.
    const size_t bytes = count * dtype_size(dtype);
    const bool small = bytes <= small_bytes_ && bytes <= layout_.slot_bytes;
    size_t offset = 0;
    std::shared_ptr<Shared> blk;
    if (size_ > 1 && !small && bytes < (size_t(1) << 40)) blk = find_shared(data, bytes, &offset);
    const uint64_t tag = blk ? ((blk->id + 1) << 40) | offset : 0;
    OpCtx ctx = begin_op(OpKind::allreduce, count, tag, dtype, op, -1);
    // One rank: every op (avg divides by 1) leaves the data as it is; skip two passes over it.
    if (size_ == 1) return;
    if (blk)
      allreduce_shared(*blk, offset, count, dtype, op, ctx);
    else
      reduce_impl(static_cast<char*>(data), count, dtype, op, -1, ctx);
  });
}

void ShmCommunicator::allreduce_shared(const Shared& b, size_t offset, size_t count, DType dtype, ReduceOp op,
                                       OpCtx& ctx) {
  const size_t es = dtype_size(dtype);
  const int n = size_;
  step(ctx);  // every rank's block holds its input, and the descriptors agree
  // My part: read it from every rank's block, write the result into every rank's block. Two
  // passes over the data per rank instead of four through the slots. Pieces of a slot's size keep
  // the result in cache for the copies to the third and later ranks. Far beyond the caches the
  // result goes through a small scratch and out with streaming stores, which skip reading the
  // output lines first and leave the caches to the training step.
  const Part mine = part_of(count, n, rank_, es);
  const bool stream = count * es >= stream_bytes_;
  const size_t piece = std::max<size_t>(1, (stream ? scratch_.size() : layout_.slot_bytes) / es);
  for (size_t done = 0; done < mine.len; done += piece) {
    const size_t len = std::min(piece, mine.len - done);
    const size_t at = offset + (mine.off + done) * es;
    for (int q = 0; q < n; ++q) srcs_[q] = b.base[q] + at;
    if (stream) {
      reduce_n(scratch_.data(), nullptr, srcs_.data(), n, len, dtype, op, n);
      for (int q = 0; q < n; ++q) copy_streaming(b.base[q] + at, scratch_.data(), len * es);
      continue;
    }
    char* me = b.base[rank_] + at;
    // Each vector step loads every source before it stores, so both outputs may be sources.
    reduce_n(me, n == 2 ? b.base[1 - rank_] + at : nullptr, srcs_.data(), n, len, dtype, op, n);
    for (int q = 0; n > 2 && q < n; ++q)
      if (q != rank_) copy_cached(b.base[q] + at, me, len * es);
  }
  step(ctx);  // every block holds the whole result
}

std::shared_ptr<ShmCommunicator::Shared> ShmCommunicator::find_shared(const void* p, size_t bytes,
                                                                      size_t* offset) const {
  const char* c = static_cast<const char*>(p);
  std::lock_guard<std::mutex> lock(shared_->mu);
  for (auto& b : shared_->items) {
    const char* start = b->base[rank_];
    if (c >= start && c + bytes <= start + b->bytes) {
      *offset = static_cast<size_t>(c - start);
      return b;
    }
  }
  return nullptr;
}

std::shared_ptr<void> ShmCommunicator::do_alloc_buffer(size_t bytes) {
  if (size_ == 1 || bytes == 0) return Communicator::do_alloc_buffer(bytes);
  const uint64_t id = buffers_++;
  const size_t rounded = round_up(bytes, 4096);
  const Deadline deadline = op_deadline();
  const std::string key = "gz_shm_buf/" + group_id_ + "/" + std::to_string(id) + "/";
  // group_id_ ends with rank 0's pid, as the segment's name does (tests look for leftovers by it).
  auto name_of = [&](int r) {
    return "/gz-shm-b" + std::to_string(id) + "-r" + std::to_string(r) + "-" + group_id_;
  };
  auto b = std::make_shared<Shared>();
  b->id = id;
  b->bytes = rounded;
  b->maps.resize(size_);
  b->base.resize(size_);
  std::string why;
  bool off = false;  // some rank has zero copy switched off: fall back quietly
  // Every rank learns whether every other rank managed, so all fall back together (a small
  // /dev/shm, as in containers, must cost speed, not a failed run).
  auto agree = [&](const std::string& round, const char* mine) {
    store_->set(key + round + std::to_string(rank_), to_bytes(mine));
    bool ok = std::string(mine) == "ok";
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      const std::string v = to_string(store_->get(key + round + std::to_string(q), deadline));
      if (v == "ok") continue;
      if (v == "off")
        off = true;
      else if (why.empty())
        why = "rank " + std::to_string(q) + " failed to share its block";
      ok = false;
    }
    return ok;
  };
  // Whatever happens below (a peer that never answers throws), the name leaves /dev/shm.
  struct Unlink {
    const std::shared_ptr<Segment>& seg;
    ~Unlink() {
      try {
        if (seg) Segment::unlink(seg->name());
      } catch (const std::exception& e) {
        GZ_LOG(warn, e.what());
      }
    }
  } unlink_own{b->maps[rank_]};
  const char* state = "off";
  if (zero_copy_) {
    try {
      b->maps[rank_] = Segment::create(name_of(rank_), rounded);
      state = "ok";
    } catch (const std::exception& e) {
      why = e.what();
      state = "fail";
    }
  } else {
    off = true;
  }
  bool ok = agree("created/", state);
  if (ok) {
    state = "fail";
    try {
      for (int q = 0; q < size_; ++q)
        if (q != rank_) b->maps[q] = Segment::open(name_of(q), rounded);
      state = "ok";
    } catch (const std::exception& e) {
      why = e.what();
    }
    ok = agree("mapped/", state);
  }
  if (!ok) {
    if (!why.empty())
      GZ_LOG(warn, "shm rank ", rank_, ": alloc_buffer(", bytes, ") falls back to ordinary memory (", why,
             "); all-reduces of it stage through the shared slots");
    else if (off)
      GZ_LOG(debug, "shm rank ", rank_, ": alloc_buffer(", bytes, "): zero copy is off on some rank");
    return Communicator::do_alloc_buffer(bytes);
  }
  for (int q = 0; q < size_; ++q) b->base[q] = b->maps[q]->data();
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->items.push_back(b);
  }
  std::weak_ptr<SharedTable> table = shared_;
  char* mine = b->base[rank_];
  return std::shared_ptr<void>(mine, [table, b](void*) mutable {
    if (auto t = table.lock()) {
      std::lock_guard<std::mutex> lock(t->mu);
      t->items.erase(std::remove(t->items.begin(), t->items.end(), b), t->items.end());
    }
    b.reset();  // unmaps this process's view of every rank's block
  });
}

void ShmCommunicator::do_reduce(void* data, size_t count, DType dtype, ReduceOp op, int root) {
  guarded([&] {
    OpCtx ctx = begin_op(OpKind::reduce, count, 0, dtype, op, root);
    if (size_ > 1) reduce_impl(static_cast<char*>(data), count, dtype, op, root, ctx);
  });
}

void ShmCommunicator::do_broadcast(void* data_v, size_t count, DType dtype, int root) {
  guarded([&] {
    OpCtx ctx = begin_op(OpKind::broadcast, count, 0, dtype, ReduceOp::sum, root);
    char* data = static_cast<char*>(data_v);
    const size_t es = dtype_size(dtype);
    const size_t E = layout_.slot_bytes / es;
    const size_t m = std::max<size_t>(1, (count + E - 1) / E);
    const bool stream = count * es >= stream_bytes_;
    for (size_t it = 0; it < m; ++it) {
      const size_t base = it * E;
      const size_t len = std::min(E, count - std::min(count, base));
      const uint32_t s = (phase_ + 1) % 3;
      if (rank_ == root && size_ > 1) copy_cached(slot(rank_, s), data + base * es, len * es);
      step(ctx);
      if (rank_ != root) to_user(data + base * es, slot(root, s), len * es, stream);
    }
  });
}

void ShmCommunicator::do_allgather(const void* send_v, void* recv_v, size_t count, DType dtype) {
  guarded([&] {
    OpCtx ctx = begin_op(OpKind::allgather, count, 0, dtype, ReduceOp::sum, -1);
    const char* send = static_cast<const char*>(send_v);
    char* recv = static_cast<char*>(recv_v);
    const size_t es = dtype_size(dtype);
    const size_t E = layout_.slot_bytes / es;
    const size_t m = std::max<size_t>(1, (count + E - 1) / E);
    const bool stream = count * es * size_ >= stream_bytes_;
    for (size_t it = 0; it < m; ++it) {
      const size_t base = it * E;
      const size_t len = std::min(E, count - std::min(count, base));
      const uint32_t s = (phase_ + 1) % 3;
      if (size_ > 1) copy_cached(slot(rank_, s), send + base * es, len * es);
      step(ctx);
      for (int p = 0; p < size_; ++p)
        if (p != rank_) to_user(recv + (size_t(p) * count + base) * es, slot(p, s), len * es, stream);
    }
    char* own = recv + size_t(rank_) * count * es;
    if (own != send) std::memmove(own, send, count * es);
  });
}

void ShmCommunicator::do_allgatherv(const void* send_v, void* recv_v, const std::vector<size_t>& counts,
                                    DType dtype) {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a over the counts: cheap equality check
  size_t total = 0, maxc = 0;
  std::vector<size_t> offs(size_);
  for (int p = 0; p < size_; ++p) {
    offs[p] = total;
    total += counts[p];
    maxc = std::max(maxc, counts[p]);
    hash = (hash ^ counts[p]) * 1099511628211ull;
  }
  guarded([&] {
    OpCtx ctx = begin_op(OpKind::allgatherv, total, hash, dtype, ReduceOp::sum, -1);
    const char* send = static_cast<const char*>(send_v);
    char* recv = static_cast<char*>(recv_v);
    const size_t es = dtype_size(dtype);
    const size_t E = layout_.slot_bytes / es;
    const size_t m = std::max<size_t>(1, (maxc + E - 1) / E);
    const bool stream = total * es >= stream_bytes_;
    auto len_of = [&](int p, size_t base) { return std::min(E, counts[p] - std::min(counts[p], base)); };
    for (size_t it = 0; it < m; ++it) {
      const size_t base = it * E;
      const uint32_t s = (phase_ + 1) % 3;
      if (size_ > 1) copy_cached(slot(rank_, s), send + base * es, len_of(rank_, base) * es);
      step(ctx);
      for (int p = 0; p < size_; ++p)
        if (p != rank_) to_user(recv + (offs[p] + base) * es, slot(p, s), len_of(p, base) * es, stream);
    }
    char* own = recv + offs[rank_] * es;
    if (own != send) std::memmove(own, send, counts[rank_] * es);
  });
}

void ShmCommunicator::do_reduce_scatter(const void* send_v, void* recv_v, size_t rc, DType dtype, ReduceOp op) {
  guarded([&] {
    OpCtx ctx = begin_op(OpKind::reduce_scatter, rc, 0, dtype, op, -1);
    const char* send = static_cast<const char*>(send_v);
    char* recv = static_cast<char*>(recv_v);
    const int n = size_;
    const size_t es = dtype_size(dtype);
    // Each step moves E elements of every block; block p's piece sits at p * E in the slot.
    const size_t E = std::max<size_t>(1, layout_.slot_bytes / (es * n));
    const size_t m = std::max<size_t>(1, (rc + E - 1) / E);
    std::vector<const void*>& srcs = srcs_;
    for (size_t it = 0; it < m; ++it) {
      const size_t base = it * E;
      const size_t len = std::min(E, rc - std::min(rc, base));
      const uint32_t s = (phase_ + 1) % 3;
      for (int p = 0; p < n; ++p)
        if (p != rank_) copy_cached(slot(rank_, s) + p * E * es, send + (size_t(p) * rc + base) * es, len * es);
      step(ctx);
      for (int q = 0; q < n; ++q)
        srcs[q] = q == rank_ ? send + (size_t(rank_) * rc + base) * es : slot(q, s) + rank_ * E * es;
      reduce_n(recv + base * es, nullptr, srcs.data(), n, len, dtype, op, n);
    }
  });
}

void ShmCommunicator::do_barrier() {
  guarded([&] {
    OpCtx ctx = begin_op(OpKind::barrier, 0, 0, DType::u8, ReduceOp::sum, -1);
    step(ctx);
  });
}

// ---------------------------------------------------------------- point to point

void ShmCommunicator::do_send(const void* data_v, size_t count, DType dtype, int peer, int tag) {
  guarded([&] {
    OpCtx ctx{OpKind::send, current_seq(), op_deadline(), Stopwatch(), OpDesc{}, 0};
    ctx.peer = peer;
    ctx.tag = tag;
    check_interrupts(ctx, nullptr);
    ChannelCtrl& ch = channel(rank_, peer);
    const char* data = static_cast<const char*>(data_v);
    const size_t es = dtype_size(dtype);
    const size_t E = layout_.p2p_bytes / es;
    const size_t m = std::max<size_t>(1, (count + E - 1) / E);
    for (size_t it = 0; it < m; ++it) {
      uint32_t& head = send_head_[peer];
      // Two slots per channel: slot head % 2 is free once the receiver consumed chunk head - 2.
      wait_for(&ch.tail, head - 1, &ch.tail_sleepers, peer, ctx, &ch.error, [&] {
        GZ_THROW(TimeoutError, where(ctx), " timed out after ", format_duration(ctx.sw.elapsed()), ": rank ", peer,
                 " is not receiving");
      });
      char* s = channel_slot(rank_, peer, head);
      const size_t base = it * E;
      const size_t len = std::min(E, count - std::min(count, base));
      ChunkHeader hdr{tag, static_cast<uint8_t>(dtype), {0, 0, 0}, count, base};
      std::memcpy(s, &hdr, sizeof hdr);
      if (len) std::memcpy(s + kLine, data + base * es, len * es);
      ++head;
      publish(&ch.head, head, &ch.head_sleepers);
    }
  });
}

void ShmCommunicator::do_recv(void* data_v, size_t count, DType dtype, int peer, int tag) {
  guarded([&] {
    OpCtx ctx{OpKind::recv, current_seq(), op_deadline(), Stopwatch(), OpDesc{}, 0};
    ctx.peer = peer;
    ctx.tag = tag;
    check_interrupts(ctx, nullptr);
    ChannelCtrl& ch = channel(peer, rank_);
    char* data = static_cast<char*>(data_v);
    const size_t es = dtype_size(dtype);
    const size_t E = layout_.p2p_bytes / es;
    const size_t m = std::max<size_t>(1, (count + E - 1) / E);
    for (size_t it = 0; it < m; ++it) {
      uint32_t& tail = recv_tail_[peer];
      wait_for(&ch.head, tail + 1, &ch.head_sleepers, peer, ctx, nullptr, [&] {
        GZ_THROW(TimeoutError, where(ctx), " timed out after ", format_duration(ctx.sw.elapsed()), ": rank ", peer,
                 " has not sent");
      });
      const char* s = channel_slot(peer, rank_, tail);
      ChunkHeader hdr;
      std::memcpy(&hdr, s, sizeof hdr);
      const size_t base = it * E;
      if (hdr.tag != tag || hdr.dtype != static_cast<uint8_t>(dtype) || hdr.count != count || hdr.offset != base) {
        __atomic_store_n(&ch.error, 1u, __ATOMIC_SEQ_CST);
        futex_wake(&ch.tail);
        GZ_THROW(InvalidArgument, where(ctx), ": message mismatch: expected tag ", tag, " ", dtype_name(dtype), " x ",
                 count, ", rank ", peer, " sent tag ", hdr.tag, " ", dtype_name(static_cast<DType>(hdr.dtype % 8)),
                 " x ", hdr.count, " (sends and receives between two ranks must match in order)");
      }
      const size_t len = std::min(E, count - std::min(count, base));
      if (len) std::memcpy(data + base * es, s + kLine, len * es);
      ++tail;
      publish(&ch.tail, tail, &ch.tail_sleepers);
    }
  });
}

// ---------------------------------------------------------------- abort, sub-groups

void ShmCommunicator::do_abort(const std::string& reason) {
  auto* h = reinterpret_cast<Header*>(base_);
  uint32_t expected = 0;
  if (__atomic_compare_exchange_n(&h->abort_claim, &expected, 1u, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    std::snprintf(h->reason, sizeof h->reason, "%s", reason.c_str());
    __atomic_store_n(&h->poison, static_cast<uint32_t>(rank_ + 1), __ATOMIC_SEQ_CST);
  }
  // Wake every waiter of the group: they see the poison word and throw gz::Aborted.
  for (int q = 0; q < size_; ++q) futex_wake(&ctrl(q).flag);
  for (int a = 0; a < size_; ++a)
    for (int b = 0; b < size_; ++b) {
      futex_wake(&channel(a, b).head);
      futex_wake(&channel(a, b).tail);
    }
}

std::shared_ptr<Communicator> ShmCommunicator::new_group(const std::vector<int>& ranks) {
  GZ_CHECK_ARG(!ranks.empty(), "new_group needs at least one rank");
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= size_)
      GZ_THROW(InvalidArgument, "new_group: rank ", ranks[i], " out of range [0, ", size_, ")");
    if (i > 0 && ranks[i] <= ranks[i - 1])
      GZ_THROW(InvalidArgument, "new_group: ranks must be strictly ascending (got ", ranks[i - 1], " then ", ranks[i], ")");
  }
  const int id = ++subgroups_;  // same on every rank: new_group is collective over the parent
  auto it = std::find(ranks.begin(), ranks.end(), rank_);
  if (it == ranks.end()) return nullptr;
  auto sub_store = std::make_shared<PrefixStore>("gz_shm_sub/" + group_id_ + "/" + std::to_string(id), store_);
  ShmOptions opts;
  opts.timeout = timeout();
  opts.chunk_bytes = layout_.slot_bytes;
  opts.spin_us = spin_us_;
  opts.zero_copy = zero_copy_;
  return create_shm_communicator(static_cast<int>(it - ranks.begin()), static_cast<int>(ranks.size()), sub_store, opts);
}

}  // namespace gz::comm::shm

// ---------------------------------------------------------------- factory

namespace gz::comm {

CommPtr create_shm_communicator(int rank, int size, std::shared_ptr<Store> store, const ShmOptions& options) {
  using namespace shm;
  if (size < 1) GZ_THROW(InvalidArgument, "shm: group size ", size, " must be >= 1");
  if (rank < 0 || rank >= size) GZ_THROW(InvalidArgument, "shm: rank ", rank, " out of range [0, ", size, ")");
  if (!store) GZ_THROW(InvalidArgument, "shm: a store is required");
  Env env = Env::from_process();
  size_t chunk = options.chunk_bytes;
  if (chunk == 0) chunk = static_cast<size_t>(env.get_int("GZ_SHM_CHUNK_BYTES", static_cast<long long>(kDefaultChunk)));
  if (chunk == 0 || chunk > (size_t(1) << 30))
    GZ_THROW(InvalidArgument, "shm: chunk_bytes ", chunk, " out of range (1 .. 1 GiB)");
  const Deadline deadline = Deadline::after(options.timeout);
  std::shared_ptr<Segment> seg;
  std::string id;
  size_t slot_bytes;
  if (rank == 0) {
    std::random_device rd;
    std::ostringstream os;
    os << std::hex << ((uint64_t(rd()) << 32) ^ rd()) << "-" << getpid();
    id = os.str();
    Layout layout(size, chunk);
    slot_bytes = layout.slot_bytes;
    seg = Segment::create("/gz-shm-" + id, layout.total);
    auto* h = reinterpret_cast<Header*>(seg->data());
    h->magic = kMagic;
    h->size = static_cast<uint32_t>(size);
    h->slot_bytes = slot_bytes;
    h->small_bytes = static_cast<uint64_t>(
        std::max<long long>(0, env.get_int("GZ_SHM_SMALL_BYTES", static_cast<long long>(kDefaultSmall))));
    try {
      store->set("gz_shm/segment", to_bytes(id + " " + std::to_string(slot_bytes)));
    } catch (...) {
      Segment::unlink(seg->name());
      throw;
    }
  } else {
    std::istringstream is(to_string(store->get("gz_shm/segment", deadline)));
    is >> id >> slot_bytes;
    if (!is || id.empty()) GZ_THROW(PeerError, "shm rank ", rank, ": malformed segment record from rank 0");
    seg = Segment::open("/gz-shm-" + id, Layout(size, slot_bytes).total);
    auto* h = reinterpret_cast<const Header*>(seg->data());
    if (h->magic != kMagic || h->size != static_cast<uint32_t>(size) || h->slot_bytes != slot_bytes)
      GZ_THROW(InvalidArgument, "shm rank ", rank, ": segment ", seg->name(), " was made for ", h->size,
               " ranks, this rank expects ", size);
  }
  Layout layout(size, slot_bytes);
  auto comm = std::make_shared<ShmCommunicator>(rank, size, store, options, seg, layout, id);
  auto* ctrl = reinterpret_cast<RankCtrl*>(seg->data() + layout.ctrl_off);
  __atomic_store_n(&ctrl[rank].pid, static_cast<int32_t>(getpid()), __ATOMIC_RELEASE);
  try {
    store_barrier(*store, "gz_shm/mapped", size, deadline);
  } catch (...) {
    if (rank == 0) Segment::unlink(seg->name());
    throw;
  }
  // Everyone has it mapped: remove the name now so even a SIGKILLed run leaves /dev/shm clean.
  Segment::unlink(seg->name());
  return comm;
}

}  // namespace gz::comm
