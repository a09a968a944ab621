// The process-wide phase mark: a seqlock over three relaxed atomics, so the training thread's
// writes never block and a reader (a dump thread, a signal handler) never sees a torn mark.
#include "gz/core/phase.h"

#include <atomic>
#include <chrono>

namespace gz {
namespace {

std::atomic<uint64_t> g_seq{0};  // odd while a writer is inside
std::atomic<uint8_t> g_phase{0};
std::atomic<int64_t> g_step{-1};
std::atomic<int64_t> g_since{0};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
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
  uint64_t s = g_seq.load(std::memory_order_relaxed);
  for (;;) {
    if ((s & 1) == 0 && g_seq.compare_exchange_weak(s, s + 1, std::memory_order_acquire)) break;
    s = g_seq.load(std::memory_order_relaxed);
  }
  g_phase.store(static_cast<uint8_t>(phase), std::memory_order_relaxed);
  if (step >= 0) g_step.store(step, std::memory_order_relaxed);
  g_since.store(now_ns(), std::memory_order_relaxed);
  g_seq.store(s + 2, std::memory_order_release);
}

PhaseMark current_phase() {
  PhaseMark m;
  // Bounded: a signal handler may interrupt the writer on its own thread; then the last values
  // read are returned rather than spinning forever.
  for (int attempt = 0; attempt < 1000; ++attempt) {
    uint64_t s1 = g_seq.load(std::memory_order_acquire);
    m.phase = static_cast<Phase>(g_phase.load(std::memory_order_relaxed));
    m.step = g_step.load(std::memory_order_relaxed);
    m.since_ns = g_since.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if ((s1 & 1) == 0 && g_seq.load(std::memory_order_relaxed) == s1) break;
  }
  return m;
}

ScopedPhase::ScopedPhase(Phase phase, int64_t step) : previous_(current_phase().phase) {
  set_phase(phase, step);
}

ScopedPhase::~ScopedPhase() { set_phase(previous_); }

}  // namespace gz
