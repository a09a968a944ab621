// The flight recorder's ring (see flight_recorder.h): the slow paths (failures, queued ops), the
// readers (snapshots, lateness totals) and the registry of every recorder of the process.
#include <algorithm>
#include <typeinfo>

#include "comm/flight/registry.h"
#include "gz/comm/flight_dump.h"
#include "gz/comm/flight_recorder.h"
#include "gz/core/env.h"
#include "gz/core/error.h"

namespace gz::comm {

namespace {

constexpr size_t kMaxFailures = 16;
constexpr size_t kArrivalWindow = 64;
constexpr size_t kArrivalEntries = size_t{1} << 18;  // per recorder: 2 MiB at most

std::atomic<uint64_t> g_next_id{1};

OpInfo unpack(uint64_t desc, uint64_t count, uint64_t tag_root, OpState* st, Phase* ph) {
  OpInfo i;
  i.kind = static_cast<OpKind>(desc & 0xff);
  i.dtype = static_cast<DType>((desc >> 8) & 0xff);
  i.reduce = static_cast<ReduceOp>((desc >> 16) & 0xff);
  *st = static_cast<OpState>((desc >> 24) & 0xff);
  *ph = static_cast<Phase>((desc >> 32) & 0xff);
  i.task = ((desc >> 40) & 1) != 0;  // bits 41-63: the collective number's low bits
  i.count = count;
  i.tag = static_cast<int32_t>(tag_root >> 32);
  i.root = static_cast<int32_t>(tag_root & 0xffffffffu);
  return i;
}

int64_t to_ns(uint64_t ticks) { return ticks ? flight_ticks_to_steady_ns(ticks) : 0; }

void classify(std::exception_ptr e, std::string* text, std::string* kind, int* peer) {
  try {
    std::rethrow_exception(e);
  } catch (const TimeoutError& x) {
    *text = x.what(), *kind = "timeout", *peer = x.peer();
  } catch (const PeerError& x) {
    *text = x.what(), *kind = "peer", *peer = x.peer();
  } catch (const Aborted& x) {
    *text = x.what(), *kind = "aborted", *peer = x.peer();
  } catch (const InvalidArgument& x) {
    *text = x.what(), *kind = "invalid", *peer = x.peer();
  } catch (const Error& x) {
    *text = x.what(), *kind = "error", *peer = x.peer();
  } catch (const std::exception& x) {
    *text = x.what(), *kind = "error";
  } catch (...) {
    *text = "unknown exception", *kind = "error";
  }
}

}  // namespace

const char* op_state_name(OpState s) {
  switch (s) {
    case OpState::queued:
      return "queued";
    case OpState::running:
      return "running";
    case OpState::done:
      return "done";
    case OpState::failed:
      return "failed";
  }
  return "unknown";
}

size_t FlightRecorder::capacity_from_env() {
  const long long n = Env::from_process().get_int("GZ_FLIGHT_RECORDER", 2000);
  return n <= 0 ? 0 : static_cast<size_t>(n);
}

FlightRecorder::FlightRecorder(size_t capacity, int rank, int size)
    : id_(g_next_id++),
      capacity_(std::max<size_t>(capacity, 16)),
      rank_(rank),
      size_(std::max(size, 1)),
      window_(size > 1 ? std::min({kArrivalWindow, capacity_, std::max<size_t>(1, kArrivalEntries / size)})
                       : 0),
      ring_(new Slot[capacity_]),
      arrivals_(new std::atomic<uint64_t>[window_ * size_ + 1]()),
      late_ticks_(new std::atomic<uint64_t>[size_]()),
      times_last_(new std::atomic<uint64_t>[size_]()) {
  identity_.rank = rank;
  identity_.size = size_;
  flight_registry().add(this);
  start_flight_dump_service();
}

FlightRecorder::~FlightRecorder() {
  // Its history outlives it for a while: a dump after the communicator was destroyed (the
  // program tears down after a failure) still shows it. A copy of the ring, on the destroying
  // thread.
  flight_registry().retire(this);
}

void FlightRecorder::note_end() noexcept {
  arrival_ops_.fetch_add(1, std::memory_order_relaxed);
  if (cur_last_peer_ < 0) return;
  late_ticks_[cur_last_peer_].fetch_add(cur_last_late_, std::memory_order_relaxed);
  times_last_[cur_last_peer_].fetch_add(1, std::memory_order_relaxed);
}

void FlightRecorder::fail(uint64_t h, std::exception_ptr error) noexcept {
  Slot& s = ring_[h % capacity_];
  s.end.store(flight_ticks(), std::memory_order_relaxed);
  s.desc.store(with_state(s.desc.load(std::memory_order_relaxed), OpState::failed),
               std::memory_order_release);
  if (cur_noted_) note_end();
  Failure f{s.seq.load(std::memory_order_relaxed), {}, {}, -1};
  try {
    classify(error, &f.text, &f.kind, &f.peer);
    std::lock_guard<std::mutex> lock(mu_);
    failures_.push_back(std::move(f));
    if (failures_.size() > kMaxFailures) failures_.erase(failures_.begin());
  } catch (...) {  // out of memory: the state still says failed
  }
  request_flight_dump(DumpReason::failure);
}

void FlightRecorder::enqueued(const OpInfo& info, uint64_t ticks) {
  std::lock_guard<std::mutex> lock(mu_);
  queued_.push_back(Queued{info, ticks});
}

void FlightRecorder::dequeued() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!queued_.empty()) queued_.erase(queued_.begin());
}

FlightIdentity FlightRecorder::identity() const {
  std::lock_guard<std::mutex> lock(mu_);
  return identity_;
}

void FlightRecorder::set_identity(FlightIdentity identity) {
  std::lock_guard<std::mutex> lock(mu_);
  identity.rank = rank_;
  identity.size = size_;
  identity_ = std::move(identity);
}

bool FlightRecorder::read_slot(uint64_t h, OpRecord* out) const {
  const Slot& s = ring_[h % capacity_];
  const uint64_t seq = s.seq.load(std::memory_order_acquire);
  if (seq == kBusy) return false;
  const uint64_t desc = s.desc.load(std::memory_order_acquire);
  const uint64_t count = s.count.load(std::memory_order_relaxed);
  const uint64_t tr = s.tag_root.load(std::memory_order_relaxed);
  const uint64_t issue = s.issue.load(std::memory_order_relaxed);
  const uint64_t start = s.start.load(std::memory_order_relaxed);
  const uint64_t end = s.end.load(std::memory_order_relaxed);
  const int64_t step = s.step.load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (s.seq.load(std::memory_order_relaxed) != seq) return false;  // rewritten while we read
  out->seq = seq;
  out->info = unpack(desc, count, tr, &out->state, &out->phase);
  // The full collective number from the low bits kept and the counter now (at most 2^23 apart).
  const uint64_t now_coll = coll_.load(std::memory_order_relaxed);
  out->coll = now_coll - ((now_coll - (desc >> 41)) & kCollMask);
  out->issue_ns = to_ns(issue);
  out->start_ns = to_ns(start);
  out->end_ns = to_ns(end);
  // Each conversion from ticks rounds on its own: keep the order the ticks had (end was 1 ns
  // before start in test_flight_recorder, about 1 run in 2).
  if (out->start_ns && out->start_ns < out->issue_ns) out->start_ns = out->issue_ns;
  if (out->end_ns && out->end_ns < out->start_ns) out->end_ns = out->start_ns;
  out->step = step;
  const uint64_t head = head_.load(std::memory_order_acquire);
  if (out->state == OpState::running && h + 1 == head)
    out->waiting_for = waiting_.load(std::memory_order_relaxed);
  if (window_ > 0 && h + window_ >= head && has_arrivals_.load(std::memory_order_relaxed)) {
    out->arrival_ns.assign(size_, -1);
    const double per_ns = flight_ticks_per_ns();
    for (int p = 0; p < size_; ++p) {
      const uint64_t a = arrivals_[(h % window_) * size_ + p].load(std::memory_order_relaxed);
      if (a == 0 || (a >> 48) != (h & 0xffff)) continue;
      out->arrival_ns[p] = static_cast<int64_t>(static_cast<double>((a & kLateMask) - 1) / per_ns);
    }
    if (rank_ < size_) out->arrival_ns[rank_] = 0;
  }
  return true;
}

FlightSnapshot FlightRecorder::snapshot(size_t max_records) const {
  FlightSnapshot snap;
  snap.id = id_;
  snap.capacity = capacity_;
  const uint64_t head = head_.load(std::memory_order_acquire);
  const uint64_t kept = std::min<uint64_t>(head, capacity_);
  const uint64_t n = max_records ? std::min<uint64_t>(kept, max_records) : kept;
  snap.records.reserve(n);
  for (uint64_t h = head - n; h < head; ++h) {
    OpRecord r;
    if (read_slot(h, &r)) snap.records.push_back(std::move(r));
  }
  std::lock_guard<std::mutex> lock(mu_);
  snap.identity = identity_;
  snap.next_seq = snap.records.empty() ? 0 : snap.records.back().seq + 1;
  for (OpRecord& r : snap.records) {
    if (r.state != OpState::failed) continue;
    for (const Failure& f : failures_)
      if (f.seq == r.seq) r.error = f.text, r.error_kind = f.kind, r.error_peer = f.peer;
  }
  for (const Queued& q : queued_) {
    OpRecord r;
    r.seq = ~uint64_t{0};
    r.info = q.info;
    r.state = OpState::queued;
    r.issue_ns = to_ns(q.ticks);
    snap.records.push_back(std::move(r));
  }
  return snap;
}

PeerLateness FlightRecorder::own_lateness() const {
  PeerLateness l;
  l.ranks.resize(size_);
  l.late_ns.resize(size_);
  l.times_last.resize(size_);
  const double per_ns = flight_ticks_per_ns();
  for (int p = 0; p < size_; ++p) {
    l.ranks[p] = p;
    l.late_ns[p] =
        static_cast<uint64_t>(static_cast<double>(late_ticks_[p].load(std::memory_order_relaxed)) / per_ns);
    l.times_last[p] = times_last_[p].load(std::memory_order_relaxed);
  }
  l.ops = arrival_ops_.load(std::memory_order_relaxed);
  return l;
}

PeerLateness FlightRecorder::lateness() const { return flight_registry().lateness_of(*this); }

}  // namespace gz::comm
