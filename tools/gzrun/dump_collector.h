// Collecting the flight-recorder dumps of this node's workers: ask the live ones for a fresh dump
// (sigqueue SIGUSR1 carrying a request number, only to workers whose ready file says they answer
// it), wait a bounded time for their files, and pack them, bounded in size, with what gzrun sees
// of each process (running, stopped, exited, killed) into one node report (JSON lines).
#pragma once

#include <sys/types.h>

#include <mutex>
#include <string>
#include <vector>

#include "gz/core/deadline.h"
#include "options.h"

namespace gz::launcher {

/// @brief Where the workers of run `run_id` write dumps (their GZ_DUMP_DIR unless the user set
/// one): DIR/dumps/<run_id> with --log-dir DIR, else /tmp/gz-dumps/<run_id>.
std::string dump_dir_for(const LaunchOptions& o, const std::string& run_id);

/// @brief One worker as the supervisor knows it.
struct WorkerView {
  int rank = 0, local_rank = 0;
  pid_t pid = -1;
  bool alive = false;
  int status = 0;                 ///< waitpid status once it ended
  bool first_failure = false;     ///< its end was this node's first failure
  bool stopped_by_gzrun = false;  ///< it ended after gzrun began stopping the workers
  int replacement = 0;            ///< --recovery in-place: its rank's replacements before it
};

/// @brief The workers of the current round, shared by the supervisor (writer) and the threads
/// that answer status requests. Every access is under one mutex.
class WorkerBoard {
 public:
  void start_round(const std::string& run_id, const std::string& dump_dir, int node, int nnodes, int round);
  /// @brief A worker started: its rank's entry, replacing the one of a worker it replaced in place.
  void add(const WorkerView& w);
  void ended(pid_t pid, int status, bool first_failure, bool stopped_by_gzrun);
  struct Snapshot {
    std::string run_id, dump_dir;
    int node = 0, nnodes = 1, round = 0;
    std::vector<WorkerView> workers;
  };
  Snapshot snapshot() const;

 private:
  mutable std::mutex mu_;
  Snapshot s_;
};

/// @brief "running", "stopped" (state T or t), "exited" (a zombie not reaped yet) or "gone", from
/// /proc/<pid>/stat.
std::string process_state(pid_t pid);

/// @brief At most `max_bytes` of a dump: the header, communicator and end lines, every op not
/// done, and the newest done ops of each communicator that fit (a "note" line says what was
/// left out). Text within the bound comes back unchanged.
std::string bound_dump(const std::string& text, size_t max_bytes);

/// @brief Ask this node's live workers for a dump numbered `request` and wait (at most `wait`)
/// until each answered or cannot (stopped, gone, no ready file); returns the node report: one
/// "gzrun" line (what gzrun saw of each worker) and every worker's dump, bounded to
/// `max_rank_bytes` each. Never throws; problems become fields of the report.
std::string collect_node_report(const WorkerBoard::Snapshot& board, const std::string& host, int64_t request,
                                Duration wait, size_t max_rank_bytes = 256 * 1024);

}  // namespace gz::launcher
