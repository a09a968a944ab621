// Private: the process-wide default group shared by process_group.cpp and init.cpp.
#pragma once

#include <memory>
#include <mutex>

#include "gz/comm/communicator.h"
#include "gz/core/deadline.h"

namespace gz::comm {
class Generations;
}
namespace gz {
class RoundFollower;
}

namespace gz::detail {

struct ProcessGroupState {
  std::mutex mu;
  comm::CommPtr group;
  std::shared_ptr<void> keep_alive;  // the Rendezvous (store + server) behind the group
  std::shared_ptr<comm::Generations> generations;  // set when regroup() may replace the group
  std::shared_ptr<RoundFollower> follower;  // gzrun's moves of an elastic in-place job (init.cpp)
  std::shared_ptr<void> watcher;            // polls the follower's moves (init.cpp); reads `group`
  Duration move_timeout = default_timeout();  // a withdrawal from moves waits this long at most
  int local_rank = 0;
  int local_size = 1;
};

ProcessGroupState& pg_state();

}  // namespace gz::detail
