#include "worker_env.h"

#include <algorithm>

#include "dump_collector.h"
#include "etcd_backend.h"

namespace gz::launcher {

std::map<std::string, std::string> worker_env(const Env& base, const LaunchOptions& o, const AttemptInfo& a,
                                              int local_rank, int replacement) {
  std::map<std::string, std::string> env = base.vars();
  // Variables gzrun decides for this job: values inherited from its own environment (the user's
  // shell, a gzrun above it) never reach the workers, whichever backend and mode set them.
  for (const char* v : {"GZ_STORE_BACKEND", "GZ_STORE_ENDPOINTS", "GZ_STORE_PREFIX", "GZ_STORE_USER",
                        "GZ_STORE_CACERT", "GZ_STORE_CERT", "GZ_STORE_KEY", "GZ_STORE_ADDR", "GZ_STORE_PORT",
                        "GZ_MIN_NODES", "GZ_MAX_NODES", "GZ_RECOVERY", "GZ_REPLACEMENT"})
    env.erase(v);
  auto s = [](long long v) { return std::to_string(v); };
  const int node = a.node_rank >= 0 ? a.node_rank : o.node_rank;
  const int nnodes = a.nnodes > 0 ? a.nnodes : o.nnodes;
  const long long world = static_cast<long long>(nnodes) * o.nproc_per_node;
  const int rank = node * o.nproc_per_node + local_rank;
  env["RANK"] = s(rank);
  env["LOCAL_RANK"] = s(local_rank);
  env["WORLD_SIZE"] = s(world);
  env["LOCAL_WORLD_SIZE"] = s(o.nproc_per_node);
  env["GROUP_RANK"] = s(node);
  env["NODE_RANK"] = s(node);
  env["GROUP_WORLD_SIZE"] = s(nnodes);
  env["ROLE_RANK"] = s(rank);  // one role ("default") covering all workers, as in torchrun
  env["ROLE_WORLD_SIZE"] = s(world);
  env["MASTER_ADDR"] = a.master_addr;
  // MASTER_ADDR/MASTER_PORT belong to the program (torch's TCPStore binds MASTER_PORT on rank 0);
  // our workers find gzrun's store through GZ_STORE_ADDR/GZ_STORE_PORT.
  env["MASTER_PORT"] = s(a.master_port);
  env["GZ_LAUNCHER"] = "gzrun";
  env["GZ_STORE_HOSTED"] = "1";
  if (o.etcd()) {
    add_etcd_worker_env(o, env);  // no store host: every worker reaches the etcd cluster
  } else {
    env["GZ_STORE_ADDR"] = a.master_addr;
    env["GZ_STORE_PORT"] = s(a.store_port);
  }
  env["GZ_NNODES"] = s(nnodes);
  if (o.elastic) {
    env["GZ_MIN_NODES"] = s(o.min_nodes);
    env["GZ_MAX_NODES"] = s(o.max_nodes);
  }
  env["GZ_RUN_ID"] = a.run_id;
  env["GZ_RESTART_COUNT"] = s(a.attempt);
  env["TORCHELASTIC_RESTART_COUNT"] = s(a.attempt);
  env["TORCHELASTIC_MAX_RESTARTS"] = s(o.max_restarts);
  env["TORCHELASTIC_RUN_ID"] = a.run_id;
  // The worker side (gz::init) reads these to rebuild its communicator instead of exiting.
  env["GZ_RECOVERY"] = o.in_place() ? "in_place" : "restart";
  env["GZ_REPLACEMENT"] = s(replacement);
  env["GZ_RDZV_TIMEOUT_S"] = s(static_cast<long long>(o.rdzv_timeout_s + 0.999));
  if (!base.has("GZ_DUMP_DIR")) env["GZ_DUMP_DIR"] = dump_dir_for(o, a.run_id);  // flight-recorder dumps
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
