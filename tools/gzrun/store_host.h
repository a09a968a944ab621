// The rendezvous store as gzrun sees it: hosted on node rank 0 (or, with --rdzv-backend etcd, an
// etcd cluster nobody hosts), and the place where the nodes' gzruns meet before every attempt.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "options.h"
#include "round_info.h"

namespace gz {
class Store;
}

namespace gz::launcher {

/// @brief Hosts the TcpStoreServer (node rank 0) and synchronises the nodes' gzruns.
class StoreHost {
 public:
  explicit StoreHost(const LaunchOptions& options, std::string token);
  ~StoreHost();
  StoreHost(const StoreHost&) = delete;
  StoreHost& operator=(const StoreHost&) = delete;

  /// @brief On node rank 0 (elastic: on the host that owns --master-addr): check that the
  /// program's MASTER_PORT is free and start the server on options.store_port() (0 = a free port;
  /// the server holds the listening socket, so there is no window for another process to take it).
  /// Throws gz::Error naming the port when one is busy. Other nodes: nothing to do. Elastic, busy
  /// store port on the owning host: another gzrun of the job there hosts it (several gzruns on one
  /// machine), this one is a client; client() then fails clearly when what holds the port does
  /// not prove it is the job's store (the handshake: token and name).
  void start();
  /// @brief Whether this gzrun runs the store server (it must outlive the job's use of it).
  bool hosts_store() const { return hosts_; }
  /// @brief This gzrun's store client (connecting waits up to --rdzv-timeout; each operation is
  /// then bounded by the heartbeat timeout). Multi-node only.
  Store& client();
  /// @brief The store's port: the actual port where this gzrun hosts it, options.store_port()
  /// elsewhere.
  int port() const { return port_; }
  /// @brief The program's MASTER_PORT: --master-port, or on one node without it a port that was
  /// free when start() probed it (never the store's).
  int program_port() const { return program_port_; }
  /// @brief Returns true when gzrun was asked to stop (checked while waiting for other nodes).
  using Cancelled = std::function<bool()>;
  /// @brief Multi-node only: wait (up to --rdzv-timeout) until every node's gzrun is ready for
  /// `attempt`; returns the run id shared by all nodes ("<node0 pid>-<attempt>"). On one node
  /// it returns "<launch_id()>-<attempt>" at once. Throws gz::TimeoutError naming how many nodes came,
  /// gz::Aborted when cancelled.
  /// With etcd, `master_addr` (when given) receives the program's MASTER_ADDR: node 0's host
  /// (--master-addr when given there), published by node 0, since no store host names it.
  std::string meet(int attempt, const Cancelled& cancelled, std::string* master_addr = nullptr);
  /// @brief etcd: throw gz::Error when a job with this --rdzv-id already ran to its end, or left
  /// its keys without ending and none of its nodes heartbeats (watched up to the heartbeat
  /// timeout). etcd outlives jobs: a rerun would meet the old job's counters and, elastic, its
  /// end marker. No-op for gzrun's own store.
  void refuse_old_job();
  /// @brief Multi-node only, after this node's workers all succeeded: wait (up to
  /// --rdzv-timeout) for the round's other nodes to finish too, so the store host keeps serving
  /// the store while their workers still use it (torchrun's exit barrier). Returns false on
  /// timeout/cancel. `job_failed` is polled while waiting: true when the round failed elsewhere
  /// (then Finish::job_failed is returned and the node takes part in the job's restart or gives up).
  enum class Finish { done, others_did_not_finish, job_failed };
  Finish finish(const RoundInfo& round, const Cancelled& cancelled, const std::function<bool()>& job_failed);
  /// @brief Store host only: wait (at most `seconds`) until the `nnodes` nodes of `round` checked
  /// out of its exit barrier, so none of them sees the store vanish.
  void await_departures(int round, int nnodes, double seconds);
  /// @brief A new client of the store whose every operation is bounded by the heartbeat timeout
  /// (for the job monitor). Throws gz::Error when the store cannot be reached within it.
  std::unique_ptr<Store> monitor_client() const;
  /// @brief "ADDR:PORT" of the store, for messages.
  std::string where() const;

 private:
  struct Impl;
  /// @brief Barrier of the nodes' gzruns that polls, so signals are seen while waiting.
  /// `job_failed` (optional) ends the wait early: returns false then.
  bool node_barrier(const std::string& name, int nnodes, const Cancelled& cancelled,
                    const std::function<bool()>& job_failed = nullptr);
  /// @brief The address clients use: loopback for node 0 when no address was named.
  std::string client_host() const;
  /// @brief etcd: the job is over on every node; remove its keys but the end marker.
  void remove_job_keys();
  const LaunchOptions& o_;
  std::string token_;
  int port_ = 0;
  bool hosts_ = false;
  int program_port_ = 0;
  bool joined_busy_port_ = false;  ///< elastic: the store port was busy here, taken for the job's store
  std::unique_ptr<Impl> impl_;
};

/// @brief A port free on `addr` right now (bind to port 0, read it, close).
int probe_free_port(const std::string& addr);

/// @brief Fail early with a clear message when `port` is already taken on `addr`
/// (bind() probe; the real server binds right after). Throws gz::SystemError naming the port and
/// `what` binds it.
void check_port_free(const std::string& addr, int port, const std::string& what = "the rendezvous store");

/// @brief Whether `addr` (an IPv4 address or a host name) is an address of this host (loopback
/// included): the elastic job's store runs where --master-addr points.
bool is_local_address(const std::string& addr);

}  // namespace gz::launcher
