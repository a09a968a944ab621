// TEST ONLY: fault injection for the straggler tests and benchmarks (GZ_TEST_SLOW_DATA_MS). Never
// meant for real jobs; gz-train installs it only when the variable is set.
#include <chrono>
#include <thread>

#include "gz/core/env.h"
#include "gz/core/error.h"
#include "gz/core/phase.h"
#include "gz/train/straggler.h"
#include "gz/train/trainer.h"

namespace gz::train {
namespace {

// One rank spends `ms` more in the data phase of every step, as a loader that falls behind would
// keep the training thread waiting in loader.next().
class SlowDataInjection : public Callback {
 public:
  SlowDataInjection(int rank, int64_t ms) : rank_(rank), ms_(ms) {}
  bool changes_training_state() const override { return false; }
  void on_step_begin(Trainer& t) override {
    if (t.rank() != rank_) return;
    ScopedPhase data(Phase::data, t.state().step);
    std::this_thread::sleep_for(std::chrono::milliseconds(ms_));
  }

 private:
  int rank_;
  int64_t ms_;
};

}  // namespace

CallbackPtr make_test_fault_injection(const Env& env) {
  const auto ms = env.get_int("GZ_TEST_SLOW_DATA_MS");
  if (!ms) return nullptr;
  if (*ms < 0 || *ms > 600000)
    GZ_THROW(InvalidArgument, "GZ_TEST_SLOW_DATA_MS must be in [0, 600000], got ", *ms);
  const long long rank = env.get_int("GZ_TEST_SLOW_RANK", 0);
  if (rank < 0) GZ_THROW(InvalidArgument, "GZ_TEST_SLOW_RANK must be >= 0, got ", rank);
  return std::make_shared<SlowDataInjection>(static_cast<int>(rank), *ms);
}

}  // namespace gz::train
