// The environment every worker starts with (torchrun variable names plus GZ_* extras).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "gz/core/env.h"
#include "options.h"

namespace gz::launcher {

/// @brief Per-attempt facts that go into the workers' environment.
struct AttemptInfo {
  int attempt = 0;     ///< 0 for the first launch, k after k restarts
  std::string run_id;  ///< unique per launch attempt
  std::string master_addr;
  int master_port = 0;  ///< the program's MASTER_PORT (free for its rank 0 to bind)
  int store_port = 0;   ///< gzrun's store's actual port (GZ_STORE_PORT)
  int cores = 1;       ///< usable cores on this node
  /// @brief This node's rank and the node count of the round; -1 = from the options (fixed-size
  /// jobs). Elastic jobs take both from the rendezvous.
  int node_rank = -1;
  int nnodes = -1;
};

/// @brief Full environment for the worker with `local_rank` on this node: `base` (gzrun's own
/// environment) with the launcher variables set on top. OMP_NUM_THREADS is only set when `base`
/// lacks it. `replacement`: how often this local rank was replaced in place in this round
/// (GZ_REPLACEMENT); a replacement is in the same round, so the restart count and run id stay.
std::map<std::string, std::string> worker_env(const Env& base, const LaunchOptions& o, const AttemptInfo& a,
                                              int local_rank, int replacement = 0);

/// @brief "KEY=VALUE" strings for execve().
std::vector<std::string> to_envp(const std::map<std::string, std::string>& env);

}  // namespace gz::launcher
