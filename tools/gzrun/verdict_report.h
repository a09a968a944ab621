// gzrun's verdict: node reports (dump_collector.h) gathered through the store and judged by the
// doctor (tools/doctor) into one line naming the culprit and the cause. Three uses:
//  - a failed round: every node uploads its report, node 0 prints the verdict;
//  - a running job: `gzrun --status` (a store client like any other, with the job's token) or
//    SIGUSR1 to a gzrun posts a request; every node's StatusWatcher answers with a fresh report;
//  - offline: `gzrun --analyze DIR` judges a directory of dumps and reports.
// Store keys (under "gzrun/"): round<r>/report/<node>, status/req (request counter),
// status/<id>/<node> (answers), status/job ("<run id> <nodes> <workers per node>", by node 0).
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dump_collector.h"
#include "gz/core/deadline.h"
#include "options.h"

namespace gz {
class Store;
}

namespace gz::launcher {

struct JobFailure;

/// @brief A fresh store client whose operations are bounded (the monitor's kind).
using StoreConnect = std::function<std::unique_ptr<Store>()>;

/// @brief Clients of the job's store for the verdict's reports: bounded to min(1 s, half the
/// heartbeat timeout) per connect and operation, so a node cut off from the store gives up on its
/// report quickly instead of delaying its exit (the job monitor decides about the store).
StoreConnect verdict_store_client(const LaunchOptions& o, const std::string& token);

/// @brief Store key of node `node`'s report for the failure of round `round`.
std::string report_key(int round, int node);
/// @brief Store key of node `node`'s answer to status request `id`.
std::string status_key(int64_t id, int node);

/// @brief The "job" line of the doctor's input: run id, size, the failure (may be null) and the
/// nodes that sent no report.
std::string job_line(const std::string& run_id, int nnodes, int nproc_per_node, const JobFailure* failure,
                     const std::vector<int>& silent);

/// @brief Read the reports of nodes 0..nnodes-1 (`key(n)`) until those of the nodes in `expect`
/// (empty: all) are there or `deadline`; the others are taken if they are there. Returns them
/// concatenated, and the nodes that sent none in *silent.
std::string gather_reports(Store& store, const std::function<std::string(int)>& key, int nnodes,
                           Deadline deadline, std::vector<int>* silent, const std::vector<int>& expect = {});

/// @brief Judge `input` (node reports and a job line): the verdict's text ("verdict: ..." and
/// details). When `save_dir` is not empty the input and the text are kept there
/// (<what>.jsonl, <what>.txt) for `gzrun --analyze`.
std::string judge_reports(const std::string& input, double stuck_ms, const std::string& save_dir,
                          const std::string& what);

/// @brief Print text line by line on gzrun's stderr (the way gzrun says things).
void say_lines(const std::string& text);

/// @brief `gzrun --analyze DIR`: prints the verdict; 0, or 1 when DIR has nothing to read.
int run_analyze(const std::string& dir);
/// @brief `gzrun --status`: asks the running job at --master-addr/--master-port (its store, with
/// the job's token) for a fresh picture and prints the verdict. 0, or 1 when the job cannot be
/// reached or does not answer.
int run_status_client(const LaunchOptions& o, const std::string& env_token);

/// @brief Answers status requests for this node (a thread with its own store client), and on
/// request (SIGUSR1 to this gzrun) asks the whole job and prints the verdict.
class StatusWatcher {
 public:
  StatusWatcher(const LaunchOptions& o, StoreConnect connect, const WorkerBoard& board, std::string host);
  ~StatusWatcher();
  StatusWatcher(const StatusWatcher&) = delete;
  StatusWatcher& operator=(const StatusWatcher&) = delete;
  /// @brief Ask every node and print the verdict (from the watcher's thread, soon).
  void ask_job();

 private:
  void loop();
  void answer(Store& s, int64_t id);
  void ask(Store& s);

  const LaunchOptions& o_;
  StoreConnect connect_;
  const WorkerBoard& board_;
  std::string host_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, asked_ = false;
  std::string published_job_;
  std::thread thread_;
};

}  // namespace gz::launcher
