// Runs the local workers: spawn, relay output, fail fast, forward signals, restart.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dump_collector.h"
#include "gz/core/deadline.h"
#include "gz/core/env.h"
#include "job_monitor.h"
#include "options.h"
#include "output_relay.h"
#include "process.h"
#include "round_info.h"
#include "store_host.h"
#include "worker_env.h"

namespace gz::launcher {

/// @brief What the supervisor needs besides the options.
struct SupervisorConfig {
  std::string program_path;  ///< resolved PROGRAM
  Env base_env;              ///< gzrun's environment; workers get it plus the launcher variables
  std::string master_addr;
  int master_port = 0;  ///< the program's MASTER_PORT
  int store_port = 0;   ///< gzrun's store
  int cores = 1;
  /// @brief Polled while gzrun waits for other nodes: handles pending signals, true = stop.
  using Cancelled = std::function<bool()>;
  /// @brief Called before each round (nodes meet there, or join an elastic job's next round);
  /// returns this node's place in it. `round` is the round the job is expected to be at. May
  /// throw. Unset: one node, round `round`, run id "<launch_id()>-<round>".
  std::function<RoundInfo(int round, const Cancelled&)> begin_round;
  /// @brief Called once every local worker succeeded (nodes wait for each other there, polling
  /// `job_failed`): done; others_did_not_finish (gzrun exits 1); job_failed (the round failed on
  /// another node: restart with the job or give up).
  using Finish = StoreHost::Finish;
  std::function<Finish(const RoundInfo&, const Cancelled&, const std::function<bool()>& job_failed)> after_success;
  /// @brief Multi-node: after a round ended by `failure` with the job going on, move the job to
  /// the next round (in the store); returns its number. Throws gz::Error.
  std::function<int(const RoundInfo&, const JobFailure& failure)> next_round;
  /// @brief Elastic: why the job cannot go on after `failure` (too few nodes), "" when it can.
  std::function<std::string(const RoundInfo&, const JobFailure& failure)> cannot_continue;
  /// @brief Elastic: the job is over (success, or the reason), for nodes still waiting to join.
  std::function<void(const std::string& reason, bool success)> end_job;
  /// @brief Multi-node: the job-wide failure detector (nullptr on one node).
  JobMonitor* monitor = nullptr;
  std::string hostname;  ///< this node's name, for failure records
  /// @brief Multi-node: a fresh store client for the flight-recorder verdict (reports of the
  /// nodes go through the store); null on one node.
  std::function<std::unique_ptr<Store>()> store_client;
  /// @brief Multi-node: SIGUSR1 to gzrun asks the whole job for its status (StatusWatcher).
  std::function<void()> ask_status;
};

/// @brief Supervises one node's workers until they all succeed, one fails with no restarts
/// left, or gzrun is signalled. See run() for the exit codes.
class Supervisor {
 public:
  Supervisor(const LaunchOptions& options, SupervisorConfig config);
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;
  /// @brief Runs to the end. Returns gzrun's exit code: 0 all workers exited 0; 1 a worker
  /// failed and restarts are exhausted (or an attempt could not start); 128+N when gzrun got
  /// signal N.
  int run();
  /// @brief The workers of the current round, for threads that answer status requests.
  const WorkerBoard& board() const { return board_; }

 private:
  enum class Outcome { success, failed, interrupted };
  struct Worker {
    int local_rank = 0;
    int rank = 0;
    pid_t pid = -1;
    bool alive = false;
    int status = 0;
  };

  Outcome run_attempt();
  void open_logs();
  void start_workers();
  /// @brief Spawn the worker of `local_rank` (its pipes to the relay, workers_, the board), the
  /// `replacement`th in-place replacement of it in this round (0: its first start). False when it
  /// could not start: the failure is recorded and published and the workers are being stopped.
  bool start_worker(int local_rank, int replacement);
  /// @brief --recovery in-place: replace the failed worker `w` (`what` says how it ended) while
  /// the others keep running. False when the node's budget for this round is spent or the job
  /// failed already: the caller takes the restart path.
  bool replace_in_place(const Worker& w, const std::string& what);
  /// @brief The round is over without success: decide (give up, or the next round). Returns the
  /// exit code, or -1 with `next` set to go on.
  int after_failure(Outcome out, int& next);
  void end_job(const std::string& reason, bool success);
  void reap();
  void on_exit(const Worker& w);
  void on_signal(int sig);
  /// @brief Send sig to every live worker's process group; start the grace timer once.
  void begin_stop(int sig);
  void kill_all_groups(int sig, bool only_alive);
  bool all_reaped() const;
  /// @brief Kill and reap processes gzrun adopted as subreaper (escaped from worker groups).
  void kill_adopted();
  /// @brief Handle pending signals; true when gzrun was asked to stop.
  bool poll_interrupt();

  const LaunchOptions& o_;
  SupervisorConfig c_;
  OutputRelay relay_;
  SignalPipe signals_;
  /// @brief Every worker started in this attempt; a worker replaced in place stays (not alive)
  /// next to its replacement.
  std::vector<Worker> workers_;
  int devnull_ = -1;
  AttemptInfo attempt_;  ///< this round's facts for the workers' environment

  // Per-attempt state.
  bool stopping_ = false;
  bool escalated_ = false;
  Clock::time_point kill_at_{};
  std::string failure_;  ///< first failure of this attempt, "" when none
  int interrupt_sig_ = 0;
  RoundInfo round_;
  bool job_failure_seen_ = false;
  std::vector<int> replacements_;  ///< per local rank: its GZ_REPLACEMENT (this round)
  /// @brief In-place replacements on this node in this round (the budget's count).
  int replaced() const;
  /// @brief Publish a failure of this node to the other nodes (multi-node only).
  void publish_local(int kind, const std::string& what);
  /// @brief The job monitor learnt of a failure: report it and stop the local workers (or,
  /// --recovery in-place of an elastic job, move them to the next round: move_in_place()).
  void on_job_failure();
  /// @brief Whether `f` (another node lost, or a node waiting for admission) is left by moving
  /// the live local workers to the next round instead of stopping them.
  bool can_move_in_place(const JobFailure& f) const;
  /// @brief Join the next round and tell each live worker its new rank there (RoundMove in the
  /// store); the workers keep running. Falls back to stopping them when the job cannot go on.
  void move_in_place();
  /// @brief This round's facts for the workers' environment (attempt_) and the board.
  void enter_round();
  /// @brief The job failure `jf` stops this node's workers (the normal path, no move).
  void stop_for(const JobFailure& jf);
  /// @brief Claim `ranks`' accepts keys in `round`'s run (claim_round_moves): false when one
  /// of them withdrew from moves or the store failed (none stays claimed then).
  bool claim_moves(const RoundInfo& round, const std::vector<int>& ranks);
  /// @brief Give the claims back (the move failed); best effort.
  void release_moves(const RoundInfo& round, const std::vector<int>& ranks);
  /// @brief Make the claims of `ranks` final right before the notices (commit_round_moves): false
  /// when a worker withdrew at its deadline meanwhile. Store failures throw.
  bool commit_moves(const RoundInfo& round, const std::vector<int>& ranks);
  /// @brief After a failed commit, in the round this node joined: report the failure job-wide
  /// and stop the local workers (the restart path).
  void stop_in_joined_round();
  /// @brief Write each live worker its place in `next` among `old`'s run keys (RoundMove).
  void tell_moves(const RoundInfo& old, const RoundInfo& next, const std::string& why);
  /// @brief Whether a worker of this round exited 0 (the job is ending).
  bool any_finished() const;
  /// @brief The global rank of `local_rank` on node `node_rank`.
  int rank_of(int node_rank, int local_rank) const;
  bool move_pending_ = false;
  std::string fatal_;  ///< a move failed for good: gzrun exits 1 with this reason

  // Flight-recorder verdict (dump_collector.h, verdict_report.h): before the workers are stopped,
  // ask them for dumps and send this node's report to the store (in the background); after the
  // round, node 0 gathers the reports and prints the verdict. SIGUSR1: the same while running.
  void collect_for_verdict();
  void print_verdict(const JobFailure& failure);
  void on_status_signal();
  WorkerBoard board_;
  bool collected_ = false;
  std::string report_;
  std::thread upload_;
  std::thread verdict_;  ///< node 0 gathering the reports and printing the verdict
  /// @brief The rounds of run(), until gzrun is to exit (its exit code).
  int run_rounds();
};

}  // namespace gz::launcher
