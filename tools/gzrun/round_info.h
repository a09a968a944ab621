// One round of a job as one node's gzrun sees it: which node it is, how many there are, and how
// much of the job's restart budget is spent.
#pragma once

#include <string>

namespace gz::launcher {

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
