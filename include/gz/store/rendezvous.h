// Who am I and where is everyone: init methods (env://, tcp://, file://) and launcher detection
// (gzrun, torchrun, OpenMPI, MPICH/PMI, SLURM), so one program starts the same under each.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gz/core/env.h"
#include "gz/store/store.h"
#include "gz/store/tcp_store.h"

namespace gz {

/// @brief Position of this process in the job.
struct WorldInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;
  int num_nodes = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  /// @brief "gzrun", "torchrun", "env", "openmpi", "pmi", "slurm" or "single" (no launcher).
  std::string launcher = "single";
};

/// @brief Read the WorldInfo from launcher variables (torchrun names first, then OpenMPI, PMI,
/// SLURM). No variables at all = a single process. Inconsistent values throw InvalidArgument.
WorldInfo detect_world(const Env& env);

/// @brief Expand a SLURM hostlist ("node[01-03,07],gpu5" -> node01 node02 node03 node07 gpu5).
/// Throws InvalidArgument on bad syntax or more than `max_hosts` hosts.
std::vector<std::string> expand_slurm_nodelist(const std::string& nodelist, size_t max_hosts = 65536);
/// @brief First host of a SLURM hostlist without expanding the rest ("node[01-04,07],gpu5" -> node01).
std::string slurm_first_host(const std::string& nodelist);

/// @brief How to rendezvous.
struct InitOptions {
  /// @brief "" or "env://" (launcher variables), "tcp://host:port", "file:///path", or
  /// "etcd://host:2379,host:2379/prefix" (an etcd cluster, see gz/store/etcd_store.h).
  ///
  /// env:// with GZ_STORE_BACKEND=etcd (gzrun --rdzv-backend etcd sets it) uses the etcd cluster
  /// GZ_STORE_ENDPOINTS under GZ_STORE_PREFIX. With etcd (either way) GZ_STORE_USER names the etcd
  /// user whose password is the rendezvous token, GZ_STORE_CACERT / GZ_STORE_CERT / GZ_STORE_KEY
  /// are the TLS files for https:// endpoints, and `insecure` allows what EtcdStoreOptions'
  /// security rule forbids.
  std::string init_method;
  int rank = -1;        ///< required with tcp:// and file:// unless the environment has it
  int world_size = -1;  ///< likewise
  Duration timeout = default_timeout();
  /// @brief Shared secret of the job's store; empty = GZ_RDZV_TOKEN. Required (on every rank)
  /// when the store's address is not loopback, unless `insecure`.
  std::string token;
  /// @brief Allow a store beyond loopback without a token (also GZ_RDZV_INSECURE=1): only on a
  /// network where everyone who can reach the port is trusted.
  bool insecure = false;
};

/// @brief Result of rendezvous: the world, a store every rank shares, and the server when this
/// process hosts it (keep the Rendezvous alive as long as the store is used).
struct Rendezvous {
  WorldInfo world;
  std::shared_ptr<Store> store;  ///< the run's keys: `base` under run_prefix(GZ_RUN_ID)
  std::shared_ptr<Store> base;   ///< the job's store itself (a later round's run is under it)
  std::shared_ptr<TcpStoreServer> server;
};

/// @brief The prefix of one run's keys (a launch or gzrun round: GZ_RUN_ID) in the job's store.
inline std::string run_prefix(const std::string& run_id) { return "run/" + run_id; }

/// @brief Collective over `run_store` (a run's keys): every rank of `w` announces itself (once,
/// however often it calls) and waits for all. With `leave`, asked every 200 ms while waiting:
/// true gives up (returns false; the count stays). Throws gz::TimeoutError at `deadline` naming
/// the missing ranks and `where`.
bool meet(Store& run_store, const WorldInfo& w, Deadline deadline, const std::string& where,
          const std::function<bool()>& leave = {});

/// @brief Connect to (or host) the job's store. Collective: every rank calls it.
Rendezvous rendezvous(const InitOptions& options, const Env& env);
inline Rendezvous rendezvous(const InitOptions& options) { return rendezvous(options, Env::from_process()); }

}  // namespace gz
