// The rendezvous store as gzrun sees it: hosted on node rank 0, and the place where the nodes'
// gzruns meet before every attempt.
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

  /// @brief On node rank 0 (elastic: on the host that owns --master-addr): start the server on
  /// --master-port (0 = a free port; the server holds the listening socket, so there is no window
  /// for another process to take it). Throws gz::Error naming the port when it is busy. Other
  /// nodes: nothing to do. Elastic, busy port on the owning host: another gzrun of the job there
  /// hosts it (several gzruns on one machine), this one is a client.
  void start();
  /// @brief Whether this gzrun runs the store server (it must outlive the job's use of it).
  bool hosts_store() const { return hosts_; }
  /// @brief This gzrun's store client (connecting waits up to --rdzv-timeout; each operation is
  /// then bounded by the heartbeat timeout). Multi-node only.
  Store& client();
  /// @brief The store's port: the actual port on node 0, --master-port elsewhere.
  int port() const { return port_; }
  /// @brief Returns true when gzrun was asked to stop (checked while waiting for other nodes).
  using Cancelled = std::function<bool()>;
  /// @brief Multi-node only: wait (up to --rdzv-timeout) until every node's gzrun is ready for
  /// `attempt`; returns the run id shared by all nodes ("<node0 pid>-<attempt>"). On one node
  /// it returns "<pid>-<attempt>" at once. Throws gz::TimeoutError naming how many nodes came,
  /// gz::Aborted when cancelled.
  std::string meet(int attempt, const Cancelled& cancelled);
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
  /// @brief Whether this build can host a store (the TcpStore implementation is linked).
  static bool available();

 private:
  struct Impl;
  /// @brief Barrier of the nodes' gzruns that polls, so signals are seen while waiting.
  /// `job_failed` (optional) ends the wait early: returns false then.
  bool node_barrier(const std::string& name, int nnodes, const Cancelled& cancelled,
                    const std::function<bool()>& job_failed = nullptr);
  /// @brief The address clients use: loopback for node 0 when no address was named.
  std::string client_host() const;
  const LaunchOptions& o_;
  std::string token_;
  int port_ = 0;
  bool hosts_ = false;
  std::unique_ptr<Impl> impl_;
};

/// @brief Fail early with a clear message when `port` is already taken on `addr`
/// (bind() probe; the real server binds right after). Throws gz::SystemError naming the port.
void check_port_free(const std::string& addr, int port);

/// @brief Whether `addr` (an IPv4 address or a host name) is an address of this host (loopback
/// included): the elastic job's store runs where --master-addr points.
bool is_local_address(const std::string& addr);

}  // namespace gz::launcher
