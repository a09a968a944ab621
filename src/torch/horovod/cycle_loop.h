// Horovod mode's background loop for one step (Horovod's RunLoopOnce, run until every tensor of
// the step is reduced), on the group's progress thread: replay the recorded schedule while every
// rank confirms its groups, otherwise negotiate cycle by cycle; the stall inspector watches; the
// fusion reduces whatever was agreed.
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "gz/core/timeline.h"
#include "gz/torch/distributed_optimizer.h"
#include "torch/horovod/fusion.h"
#include "torch/horovod/negotiation.h"
#include "torch/horovod/replay_schedule.h"
#include "torch/horovod/stall_inspector.h"

namespace gz::horovod {

/// @brief What the autograd hooks (training thread) hand the loop (progress thread) during a step.
struct Submissions {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<uint8_t> submitted;  // per tensor, this step
  size_t count = 0;
  bool closing = false;     // synchronize() was called: no more tensors this step
  ReplaySchedule schedule;  // written between steps only
};

/// @brief What one step's loop did.
struct StepOutcome {
  int cycles = 0;                             // exchanges (negotiations and confirmations)
  bool replayed = false;                      // the whole step ran from the schedule
  std::vector<std::vector<size_t>> executed;  // the groups reduced, in order
};

class CycleLoop {
 public:
  CycleLoop(comm::Communicator& group, Submissions& subs, Fusion& fusion,
            const std::vector<std::string>& names, const DistributedOptimizerOptions& options,
            Timeline* timeline);
  /// @brief Collective: cycles until every tensor is reduced; throws gz::TimeoutError on a stall.
  StepOutcome run();

 private:
  void wait_for_cycle(bool confirming);
  void negotiate(const CycleReport& report, StepOutcome& out);
  /// @brief Reduce tensors `idx` (none: false) and mark them done.
  bool reduce(const std::vector<size_t>& idx);

  Submissions& subs_;
  Fusion& fusion_;
  const DistributedOptimizerOptions& options_;
  Timeline* timeline_;
  const size_t n_;
  Negotiator negotiator_;
  StallInspector stall_;
  Replay replay_;
  Duration patience_;
  std::vector<uint8_t> done_, ready_;
  size_t ndone_ = 0;
  Clock::time_point next_cycle_;
};

}  // namespace gz::horovod
