#include <gtest/gtest.h>

#include <atomic>
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
