#include "worker_env.h"

#include <algorithm>

namespace gz::launcher {

std::map<std::string, std::string> worker_env(const Env& base, const LaunchOptions& o,
                                              const AttemptInfo& a, int local_rank) {
  std::map<std::string, std::string> env = base.vars();
  auto s = [](long long v) { return std::to_string(v); };
  const int rank = o.node_rank * o.nproc_per_node + local_rank;
  env["RANK"] = s(rank);
  env["LOCAL_RANK"] = s(local_rank);
  env["WORLD_SIZE"] = s(o.world_size());
  env["LOCAL_WORLD_SIZE"] = s(o.nproc_per_node);
  env["GROUP_RANK"] = s(o.node_rank);
  env["NODE_RANK"] = s(o.node_rank);
  env["ROLE_RANK"] = s(rank);  // one role ("default") covering all workers, as in torchrun
  env["ROLE_WORLD_SIZE"] = s(o.world_size());
  env["MASTER_ADDR"] = a.master_addr;
  // MASTER_ADDR/MASTER_PORT belong to the program (torch's TCPStore binds MASTER_PORT on rank 0);
  // our workers find gzrun's store through GZ_STORE_ADDR/GZ_STORE_PORT.
  env["MASTER_PORT"] = s(a.master_port);
  env["GZ_LAUNCHER"] = "gzrun";
  env["GZ_STORE_HOSTED"] = "1";
  env["GZ_STORE_ADDR"] = a.master_addr;
  env["GZ_STORE_PORT"] = s(a.store_port);
  env["GZ_NNODES"] = s(o.nnodes);
  env["GZ_RUN_ID"] = a.run_id;
  env["GZ_RESTART_COUNT"] = s(a.attempt);
  env["TORCHELASTIC_RESTART_COUNT"] = s(a.attempt);
  env["TORCHELASTIC_MAX_RESTARTS"] = s(o.max_restarts);
  env["TORCHELASTIC_RUN_ID"] = a.run_id;
  env["GZ_RDZV_TIMEOUT_S"] = s(static_cast<long long>(o.rdzv_timeout_s + 0.999));
  if (!base.has("OMP_NUM_THREADS"))
    env["OMP_NUM_THREADS"] = s(std::max(1, a.cores / std::max(1, o.nproc_per_node)));
  return env;
}

std::vector<std::string> to_envp(const std::map<std::string, std::string>& env) {
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

}  // namespace gz::launcher
