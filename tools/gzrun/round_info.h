// One round of a job as one node's gzrun sees it: which node it is, how many there are, and how
// much of the job's restart budget is spent.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <random>
#include <string>

namespace gz::launcher {

/// @brief This gzrun's name for a job it starts: "<pid>.<8 random hex digits>", the same for the
/// life of the process. The job's run ids (GZ_RUN_ID) are "<that of round 0's node 0>-<round>".
/// The random part because a pid alone comes back: containers start gzrun under the same small
/// pid every time, and a new job must not take an old one's snapshots for its own.
inline const std::string& launch_id() {
  static const std::string id = [] {
    std::random_device rd;
    char text[40];
    std::snprintf(text, sizeof text, "%ld.%08x", static_cast<long>(::getpid()), static_cast<unsigned>(rd()));
    return std::string(text);
  }();
  return id;
}

/// @brief This node's place in one round of the job (a round = one launch of every node's
/// workers; GZ_RESTART_COUNT). Fixed-size jobs: node_rank and nnodes come from the command line
/// and every round after the first is a restart. Elastic jobs: both come from the rendezvous, and
/// a round that only admitted a waiting node costs no restart.
struct RoundInfo {
  int round = 0;
  int node_rank = 0;
  int nnodes = 1;
  int restarts = 0;    ///< failure restarts the job used before this round (job-wide)
  std::string run_id;  ///< the same on every node of the round (workers' store prefix)
  /// @brief The workers' MASTER_ADDR for this round when it is not --master-addr (elastic jobs on
  /// etcd: the host of the round's node 0, where the program's rank 0 runs); "" = --master-addr.
  std::string master_addr;
  /// @brief Elastic only: the job finished before this node was admitted (nothing to run).
  bool job_done = false;
};

}  // namespace gz::launcher
