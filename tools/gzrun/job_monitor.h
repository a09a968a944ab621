// Job-wide failure detection for multi-node jobs: every node's gzrun heartbeats in the store,
// watches the round's failure record and the other nodes' heartbeats, and publishes its own
// failures there, so that one failure anywhere stops the workers of every node.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "joiners.h"
#include "options.h"

namespace gz {
class Store;
}

namespace gz::launcher {

/// @brief How a round ended for the whole job.
struct JobFailure {
  /// @brief admit is no failure: an elastic job ends the round to take in a node waiting to join.
  enum class Kind { none, worker, node_lost, store_lost, interrupted, admit };
  Kind kind = Kind::none;
  int node = -1;     ///< the node that failed or was lost (-1: not known / the store host)
  std::string text;  ///< what every gzrun prints: node, rank, cause
  bool failed() const { return kind != Kind::none; }
  /// @brief The store record "kind|node|text" and back.
  std::string encode() const;
  static JobFailure decode(const std::string& record);
};

/// @brief Store keys (all under "gzrun/"):
///   gzrun/round<r>/hb/<node>    counter each gzrun adds 1 to every interval (its heartbeat)
///   gzrun/round                 the job's current round, moved by compare_set
///   gzrun/round<r>/failure      first failure of round r ("kind|node|text"), first writer wins
///   gzrun/round<r>/acked/<node> set when that node's gzrun saw round r's failure (the store host
///                               waits for the nodes that still heartbeat)
///   gzrun/round<r+1>/joined     elastic: nodes waiting for the next round (admitted while their
///                               beat, gzrun/waiting/<seq>, moves: joiners.h)
///   gzrun/round<r>/exit/arrived nodes whose workers all succeeded (no admission after the first)
class JobMonitor {
 public:
  /// @brief `connect` makes a fresh store client whose every operation is bounded by the
  /// heartbeat timeout (the monitor owns it; only the monitor's thread uses it).
  using Connect = std::function<std::unique_ptr<Store>()>;
  /// @brief `store_where` names the store host in messages; `hosts_store`: this gzrun runs it;
  /// `store_kind` says what is lost when it stops answering ("store host", "etcd cluster").
  JobMonitor(const LaunchOptions& options, Connect connect, std::string store_where, bool hosts_store,
             std::string store_kind = "store host");
  ~JobMonitor();
  JobMonitor(const JobMonitor&) = delete;
  JobMonitor& operator=(const JobMonitor&) = delete;

  /// @brief Start watching round `round` (after the nodes met for it), in which this gzrun is node
  /// `node_rank` of `nnodes`.
  void start_round(int round, int node_rank, int nnodes);
  /// @brief Publish a failure of this node (asynchronously: the supervisor's loop never blocks
  /// on the store). The first failure recorded in the round wins; failure() then tells it.
  void report_local(JobFailure f);
  /// @brief Readable when the job's failure for this round became known (poll it).
  int fd() const { return pipe_[0]; }
  /// @brief How long the store has not answered this node's monitor (0 while it answers).
  Duration store_silent_for() const;
  /// @brief The round's failure as known so far (kind none while the job runs).
  JobFailure failure() const;
  /// @brief End the round: flush a pending report, acknowledge the failure and, on the store host,
  /// wait (at most the heartbeat timeout) until every node that still heartbeats acknowledged it,
  /// so nobody mistakes the store host leaving for a lost store. Stops the thread.
  void end_round();
  /// @brief After a failed round: move the job's round counter to round+1 (one compare_set in
  /// the store, whoever comes first) and return the round now stored. Throws gz::Error when the
  /// store cannot be reached.
  int advance_round(int round);
  /// @brief Store key of round r's item `what` ("gzrun/round<r>/<what>").
  static std::string round_key(int round, const std::string& what);

 private:
  void loop();
  void tick();
  /// @brief The store, its operations bounded by what is left of the heartbeat timeout.
  Store& store_until_silent();
  /// @brief Make one store request (`request(Store&)`) bounded by what is left of the silence
  /// budget; its answer renews the budget. Every request of the monitor thread goes through here,
  /// so none can outlast the budget by its own full timeout.
  template <class F>
  decltype(auto) ask(F&& request) {
    Store& s = store_until_silent();
    if constexpr (std::is_void_v<decltype(request(s))>) {
      request(s);
      last_ok_ = std::chrono::steady_clock::now();
    } else {
      decltype(auto) answer = request(s);
      last_ok_ = std::chrono::steady_clock::now();
      return answer;
    }
  }
  void restore_full_timeout();
  /// @brief Set the failure once and wake the supervisor.
  void learn(const JobFailure& f);
  void publish(const JobFailure& f);
  /// @brief Elastic: a node waits to join the next round while this one has room and no node has
  /// finished: publish an admit record (ends the round without counting a restart).
  bool admit_waiting();
  Store& store();

  const LaunchOptions& o_;
  Connect connect_;
  std::string where_;
  std::string kind_;
  bool hosts_store_ = false;
  std::unique_ptr<Store> store_;
  int pipe_[2] = {-1, -1};

  std::thread thread_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  int round_ = 0;
  int node_rank_ = 0;
  int nnodes_ = 1;
  JobFailure failure_;
  std::vector<JobFailure> pending_;  ///< local failures to publish

  // Thread-only state.
  struct Peer {
    int64_t beats = -1;
    std::chrono::steady_clock::time_point changed{};
  };
  std::map<int, Peer> peers_;
  JoinerBeats waiting_;  ///< beats of the nodes waiting for the next round (admit only live ones)
  /// Last answer from the store (also read by store_silent_for() from the supervisor's thread).
  std::atomic<std::chrono::steady_clock::time_point> last_ok_{};
  bool store_lost_ = false;
};

}  // namespace gz::launcher
