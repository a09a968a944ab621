#include <gtest/gtest.h>
#include <signal.h>
#include <sys/time.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "gz/core/phase.h"

using namespace gz;

TEST(Phase, MarksAndScopesRestoreThePreviousPhase) {
  set_phase(Phase::data, 7);
  EXPECT_EQ(current_phase().phase, Phase::data);
  EXPECT_EQ(current_phase().step, 7);
  {
    ScopedPhase p(Phase::backward);
    EXPECT_EQ(current_phase().phase, Phase::backward);
    EXPECT_EQ(current_phase().step, 7);  // step kept
  }
  EXPECT_EQ(current_phase().phase, Phase::data);
  EXPECT_STREQ(phase_name(Phase::optimizer), "optimizer");
  set_phase(Phase::idle);
}

// Mutation check: without the seqlock (plain stores, no sequence test in the reader) the reader
// sees step/phase pairs from different marks within a few thousand iterations.
TEST(Phase, ReadersNeverSeeATornMark) {
  constexpr int64_t first = 1000000;  // steps below it are earlier tests' marks
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (int64_t i = first; !stop.load(); ++i) set_phase(i % 2 ? Phase::forward : Phase::eval, i);
  });
  while (current_phase().step < first) std::this_thread::yield();
  int64_t torn = 0;
  for (int i = 0; i < 200000; ++i) {
    PhaseMark m = current_phase();
    Phase want = m.step % 2 ? Phase::forward : Phase::eval;
    if (m.phase != want) ++torn;
  }
  stop = true;
  writer.join();
  EXPECT_EQ(torn, 0);
  set_phase(Phase::idle);
}

// Every nanosecond between two reads is charged to exactly one phase, the one marked then; a phase
// nobody entered gets nothing. Mutation check: a set_phase that does not charge the phase it
// leaves makes the sums fall short (and data/backward read 0).
TEST(Phase, TotalsChargeEachIntervalToTheMarkedPhase) {
  set_phase(Phase::idle);
  const PhaseTotals a = phase_totals();
  set_phase(Phase::data, 3);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  {
    ScopedPhase nested(Phase::backward);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  set_phase(Phase::idle);
  const PhaseTotals b = phase_totals();
  int64_t sum = 0;
  for (int p = 0; p < kPhaseCount; ++p) sum += b.ns[p] - a.ns[p];
  EXPECT_EQ(sum, b.at_ns - a.at_ns);  // conservation: the whole interval, nothing twice
  const auto ms = [&](Phase p) { return (b.of(p) - a.of(p)) / 1e6; };
  EXPECT_GE(ms(Phase::data), 35);  // before and after the nested mark, not during it
  EXPECT_LT(ms(Phase::data), ms(Phase::data) + ms(Phase::backward) - 15);
  EXPECT_GE(ms(Phase::backward), 20);
  EXPECT_EQ(b.of(Phase::recovery) - a.of(Phase::recovery), 0);
  // The phase now marked counts up to the read.
  set_phase(Phase::eval);
  const PhaseTotals c = phase_totals();
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const PhaseTotals d = phase_totals();
  EXPECT_GE(d.of(Phase::eval) - c.of(Phase::eval), 10'000'000);
  set_phase(Phase::idle);
}

// Readers racing a writer still see totals that add up to the time between their reads, and no
// phase's total ever shrinks. The reader keeps going until the writer has made many marks, so the
// two really overlap on a loaded machine. Mutation checks: a reader that gives up after 1000
// attempts (the first version) returned torn totals under load; a set_phase that does not
// charge the phase it leaves makes totals shrink.
TEST(Phase, TotalsStayConsistentUnderConcurrentMarks) {
  std::atomic<bool> stop{false};
  std::atomic<int64_t> marks{0};
  std::thread writer([&] {
    for (int64_t i = 0; !stop.load(); ++i) {
      set_phase(i % 2 ? Phase::forward : Phase::optimizer, i);
      marks.store(i + 1, std::memory_order_relaxed);
    }
  });
  PhaseTotals prev = phase_totals();
  int64_t shrank = 0, unbalanced = 0;
  for (int i = 0; i < 100000 || marks.load(std::memory_order_relaxed) < 100000; ++i) {
    PhaseTotals t = phase_totals();
    int64_t sum = 0;
    for (int p = 0; p < kPhaseCount; ++p) {
      if (t.ns[p] < prev.ns[p]) ++shrank;  // never decreases
      sum += t.ns[p] - prev.ns[p];
    }
    if (sum != t.at_ns - prev.at_ns) ++unbalanced;
    prev = t;
  }
  stop = true;
  writer.join();
  EXPECT_EQ(shrank, 0);
  EXPECT_EQ(unbalanced, 0);
  set_phase(Phase::idle);
}

// A signal handler that reads the mark may interrupt set_phase on its own thread: it must get an
// answer, not wait for a writer that cannot go on. A 20 us timer interrupts a marking loop tens of
// thousands of times. Mutation check: without the own-thread test the reader spins forever once a
// signal lands inside the write section, and this test hangs (ctest's timeout fails it).
std::atomic<int64_t> g_handled{0};
void read_in_handler(int) {
  PhaseMark m = current_phase();
  PhaseTotals t = phase_totals();
  if (m.step >= -1 && t.at_ns > 0) g_handled.fetch_add(1, std::memory_order_relaxed);
}

TEST(Phase, ReadersInASignalHandlerNeverWaitForTheirOwnThread) {
  struct sigaction sa {};
  sa.sa_handler = read_in_handler;
  sigemptyset(&sa.sa_mask);
  struct sigaction old {};
  ASSERT_EQ(sigaction(SIGALRM, &sa, &old), 0);
  itimerval timer{{0, 20}, {0, 20}};
  ASSERT_EQ(setitimer(ITIMER_REAL, &timer, nullptr), 0);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  for (int64_t i = 0; std::chrono::steady_clock::now() < until; ++i)
    set_phase(i % 2 ? Phase::data : Phase::comm, i);
  itimerval off{};
  setitimer(ITIMER_REAL, &off, nullptr);
  sigaction(SIGALRM, &old, nullptr);
  EXPECT_GT(g_handled.load(), 100);
  set_phase(Phase::idle);
}
