// The process-wide phase mark: a seqlock over a few relaxed atomics, so the training thread's
// writes never block and a reader (a dump thread, a signal handler) never sees a torn mark. The
// same section keeps the time spent in each phase (phase_totals()).
#include "gz/core/phase.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <thread>

namespace gz {

static_assert(static_cast<int>(Phase::recovery) + 1 == kPhaseCount, "kPhaseCount must count every Phase");

namespace {

std::atomic<uint64_t> g_seq{0};  // odd while a writer is inside
std::atomic<uint8_t> g_phase{0};
std::atomic<int64_t> g_step{-1};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::atomic<int64_t> g_since{now_ns()};  // the process starts idle
// Time spent in each phase, charged when a mark leaves it. Written only inside the seqlock.
std::array<std::atomic<int64_t>, kPhaseCount> g_total{};
// Set while this thread is in set_phase (from before it takes the lock): a reader on the same
// thread is a signal handler that interrupted it and must not wait for a writer that cannot go
// on. initial-exec: no lazy allocation on first access, so a handler may read it.
__attribute__((tls_model("initial-exec"))) thread_local bool t_writing = false;

// Run `read` until it saw one consistent state. A reader that keeps losing to a busy writer yields
// now and then (a bounded retry count returned torn reads under load); one that interrupted the
// writer on its own thread takes what it read.
template <typename F>
void read_consistent(F read) {
  for (unsigned attempt = 1;; ++attempt) {
    const uint64_t s1 = g_seq.load(std::memory_order_acquire);
    read();
    std::atomic_thread_fence(std::memory_order_acquire);
    if ((s1 & 1) == 0 && g_seq.load(std::memory_order_relaxed) == s1) return;
    if (t_writing) return;
    if (attempt % 64 == 0) std::this_thread::yield();
  }
}

}  // namespace

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::idle:
      return "idle";
    case Phase::data:
      return "data";
    case Phase::forward:
      return "forward";
    case Phase::backward:
      return "backward";
    case Phase::optimizer:
      return "optimizer";
    case Phase::comm:
      return "comm";
    case Phase::checkpoint:
      return "checkpoint";
    case Phase::eval:
      return "eval";
    case Phase::recovery:
      return "recovery";
  }
  return "unknown";
}

void set_phase(Phase phase, int64_t step) {
  // Writers are rare and short; several threads may mark (autograd hooks, the training thread), so
  // the odd sequence number doubles as the writers' lock.
  t_writing = true;
  std::atomic_signal_fence(std::memory_order_seq_cst);  // set before the lock, as a handler sees it
  uint64_t s = g_seq.load(std::memory_order_relaxed);
  for (;;) {
    if ((s & 1) == 0 && g_seq.compare_exchange_weak(s, s + 1, std::memory_order_acquire)) break;
    s = g_seq.load(std::memory_order_relaxed);
  }
  const int64_t now = now_ns();
  auto& left = g_total[g_phase.load(std::memory_order_relaxed) % kPhaseCount];
  left.store(left.load(std::memory_order_relaxed) + (now - g_since.load(std::memory_order_relaxed)),
             std::memory_order_relaxed);
  g_phase.store(static_cast<uint8_t>(phase), std::memory_order_relaxed);
  if (step >= 0) g_step.store(step, std::memory_order_relaxed);
  g_since.store(now, std::memory_order_relaxed);
  g_seq.store(s + 2, std::memory_order_release);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_writing = false;
}

PhaseMark current_phase() {
  PhaseMark m;
  read_consistent([&] {
    m.phase = static_cast<Phase>(g_phase.load(std::memory_order_relaxed));
    m.step = g_step.load(std::memory_order_relaxed);
    m.since_ns = g_since.load(std::memory_order_relaxed);
  });
  return m;
}

PhaseTotals phase_totals() {
  PhaseTotals t;
  uint8_t phase = 0;
  int64_t since = 0;
  read_consistent([&] {
    for (size_t p = 0; p < t.ns.size(); ++p) t.ns[p] = g_total[p].load(std::memory_order_relaxed);
    phase = g_phase.load(std::memory_order_relaxed);
    since = g_since.load(std::memory_order_relaxed);
    // The clock is read inside the section: a mark that lands after it charges from a later
    // time, so no phase's total ever appears to shrink between two reads.
    t.at_ns = now_ns();
  });
  t.ns[phase % kPhaseCount] += std::max<int64_t>(0, t.at_ns - since);
  return t;
}

ScopedPhase::ScopedPhase(Phase phase, int64_t step) : previous_(current_phase().phase) {
  set_phase(phase, step);
}

ScopedPhase::~ScopedPhase() { set_phase(previous_); }

}  // namespace gz
