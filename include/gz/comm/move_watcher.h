// A thread that aborts a group when the launcher moved the job to a new round (gzrun --recovery
// in-place of an elastic job) while its ranks were not failing: the next op fails at once and
// the owner's recovery follows the move (comm::Generations with follow_moves()).
#pragma once

#include <functional>
#include <memory>

#include "gz/comm/communicator.h"
#include "gz/core/deadline.h"
#include "gz/store/round_move.h"

namespace gz::comm {

/// @brief Polls `follower` for a move every `period` and aborts the group `current_group`
/// returns (nullptr: none now). Stopping never waits for a store request in flight longer than
/// its bound: the thread then finishes alone, on state it owns, and touches nothing else.
class MoveWatcher {
 public:
  MoveWatcher(std::shared_ptr<RoundFollower> follower, std::function<CommPtr()> current_group,
              Duration period = Duration(500));
  /// @brief stop(Duration(2000)).
  ~MoveWatcher();
  MoveWatcher(const MoveWatcher&) = delete;
  MoveWatcher& operator=(const MoveWatcher&) = delete;
  /// @brief Ends the polling: waits at most `bound` for a poll in flight (a store that does not
  /// answer), then leaves the thread to end alone. True when the thread ended within the bound.
  /// A later stop() returns at once (what the first one found).
  bool stop(Duration bound);

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace gz::comm
