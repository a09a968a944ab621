// The straggler report: which rank makes the others wait, in which phase, and what it costs.
//
// DDP's all-reduce equalises step times: every rank's step takes as long as the slowest one's, so
// per-rank step times name nobody. What differs is where each rank spends its step: the rank
// that arrives last at the gradient all-reduces waits least there (its peers wait for it). So
// every K steps the ranks exchange, in one small all-gather, the time per step they spent in each
// phase (gz::phase_totals(): data, forward + backward, exposed communication wait, optimizer,
// the rest). For rank r, lateness = median over the other ranks of their exposed wait - r's own;
// the phase in which r exceeds the others' median by most explains it; lateness / step time is
// the throughput the job loses to r. No clocks are compared across hosts. A rank is named after
// it has been the late one for `windows` windows in a row, above a threshold that keeps a healthy
// job quiet. When no rank is late but communication dominates the step, a short link probe
// between hosts (gz/comm/link_probe.h) looks for a slow host link.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gz/comm/link_probe.h"
#include "gz/train/callback.h"

namespace gz {
class Env;
}

namespace gz::train {

struct TrainConfig;

/// @brief Knobs of the straggler report (config block `straggler:`, see docs/debugging-slow.md).
struct StragglerOptions {
  /// @brief Steps per window (one all-gather of a few numbers per rank per window); 0 = off.
  int64_t every = 10;
  /// @brief ... but a window spans at least this long: with 16 ms steps, windows of 63 steps, so
  /// the exchange costs the same share of any job. Decided from the last window's median step
  /// time, the same number on every rank.
  double min_window_ms = 1000;
  /// @brief Windows in a row a rank must be the late one before it is named.
  int64_t windows = 3;
  /// @brief A rank counts as late only when it is at least this many ms/step behind ...
  double threshold_ms = 5;
  /// @brief ... and at least this fraction of the step time.
  double threshold_fraction = 0.2;
  /// @brief Probe the links between hosts when no rank is late but communication is at least
  /// probe_comm_share of the step.
  bool link_probe = true;
  double probe_comm_share = 0.3;
  /// @brief Bytes each way per host pair and probe.
  size_t probe_bytes = size_t{1} << 20;
};

/// @brief The config's straggler block; the environment variable GZ_STRAGGLER_EVERY, when set,
/// overrides straggler.every (so a job can be rerun with the report off without editing its
/// config). Throws gz::InvalidArgument for a malformed or negative value.
StragglerOptions straggler_options(const TrainConfig& config, const Env& env);

/// @brief One rank's averages over one window, in ms per step.
struct RankWindow {
  double step_ms = 0;  ///< wall time per step, evaluation and checkpoints excluded
  double data_ms = 0;
  double compute_ms = 0;  ///< forward + backward (without DDP's exposed wait)
  double comm_ms = 0;     ///< exposed communication wait
  double optimizer_ms = 0;
  double other_ms = 0;  ///< outside the marked phases: callbacks, logging
};

/// @brief The phases that can explain a late rank, in RankVerdict::cause order.
enum class StragglerCause { data, compute, optimizer, other };
/// @brief "data loading", "compute (forward + backward)", "the optimizer step", "outside the
/// marked phases (callbacks, logging)".
const char* straggler_cause_text(StragglerCause cause);
/// @brief "data", "compute", "optimizer", "other" (JSONL values).
const char* straggler_cause_name(StragglerCause cause);

/// @brief What one window says about one rank.
struct RankVerdict {
  double late_ms = 0;  ///< median of the other ranks' exposed wait - this rank's (ms/step)
  StragglerCause cause = StragglerCause::other;
  double cause_excess_ms = 0;  ///< this rank's time in `cause` - the other ranks' median
};

/// @brief One window, all ranks.
struct WindowAnalysis {
  std::vector<RankVerdict> ranks;
  int late_rank = -1;       ///< the latest rank if it passes the threshold, else -1
  double step_ms = 0;       ///< median step time over ranks
  double comm_ms = 0;       ///< median exposed communication wait
  double threshold_ms = 0;  ///< what late_rank had to pass
};

/// @brief Analyse one window (every rank's averages; at least two ranks).
WindowAnalysis analyze_window(const std::vector<RankWindow>& ranks, const StragglerOptions& options);

/// @brief The report's state across windows. Deterministic: every rank feeds it the same
/// all-gathered numbers and gets the same decisions (when to probe links), so ranks agree on
/// collective calls without another exchange; only rank 0 prints.
class StragglerTracker {
 public:
  /// @brief `hosts[r]`: rank r's host name (ranks of one host share it).
  StragglerTracker(StragglerOptions options, std::vector<std::string> hosts);

  /// @brief Account for a window of `steps` steps (0 = every) that ended at `last_step`. Returns a
  /// warning line when a rank has been late for `windows` windows in a row (and again every 10 x
  /// windows while it stays late), else "".
  std::string add_window(const WindowAnalysis& analysis, int64_t last_step, int64_t steps = 0);
  /// @brief Steps of the next window: `every`, or more so that it spans min_window_ms at this
  /// window's median step time (at most 100 x every).
  int64_t next_window_steps(const WindowAnalysis& analysis) const;
  /// @brief Whether the link probe should run now (after add_window of the same analysis).
  bool probe_due(const WindowAnalysis& analysis) const;
  /// @brief The host ring's pairs to probe: the first rank of each host with the next host's.
  std::vector<std::pair<int, int>> probe_pairs() const;
  /// @brief Account for a probe's measures (every pair's, ranks as in probe_pairs()). Returns a
  /// warning line when a host was found slow by two probes in a row, else "".
  std::string add_probe(const std::vector<comm::LinkMeasure>& measures, const WindowAnalysis& analysis,
                        int64_t last_step);
  /// @brief The end-of-training summary (one or a few lines).
  std::string summary() const;

  int host_count() const { return static_cast<int>(host_names_.size()); }

 private:
  struct RankStats {
    int64_t late_windows = 0;
    double late_ms_sum = 0;
    double loss_sum = 0;
    std::vector<int64_t> cause_windows = std::vector<int64_t>(4, 0);
    bool named = false;
  };
  std::string rank_label(int rank) const;
  std::string host_ranks(int host) const;

  StragglerOptions o_;
  std::vector<std::string> hosts_;       // per rank
  std::vector<std::string> host_names_;  // per host, in order of first rank
  std::vector<int> host_of_;             // per rank
  std::vector<int> first_rank_;          // per host
  int64_t windows_seen_ = 0;
  int64_t first_step_ = -1;
  int64_t last_step_ = -1;
  // The current streak: one rank late window after window.
  int streak_rank_ = -1;
  int64_t streak_ = 0;
  int64_t streak_first_step_ = 0;
  double streak_late_ = 0, streak_loss_ = 0, streak_excess_ = 0;
  std::vector<int64_t> streak_causes_;
  double max_late_ms_ = 0;
  double max_late_fraction_ = 0;
  std::vector<RankStats> stats_;
  // Link probes.
  int64_t windows_since_probe_ = 0;
  int64_t probe_gap_ = 1;
  int64_t probes_ = 0;
  std::vector<int> suspect_hosts_;
  int64_t suspect_confirmations_ = 0;
  bool link_named_ = false;
  std::string link_summary_;
};

class HistoryLogger;

/// @brief The built-in Callback: windows of `every` steps (or more, min_window_ms) from the second
/// step on (the first carries set-up costs), one asynchronous all-gather per window (it runs on
/// the communicator's progress thread during the next window and is analysed at its end: a
/// warning comes one window after the data that proves it), warnings ("straggler (step N): ...")
/// and per-rank figures (history.jsonl kind "straggler", TensorBoard tags
/// straggler/rank<r>/...) on rank 0, a summary at the end. Off in single and dp modes and on one
/// rank.
class StragglerReport : public Callback {
 public:
  StragglerReport(StragglerOptions options, std::shared_ptr<HistoryLogger> history);
  ~StragglerReport() override;
  bool changes_training_state() const override { return false; }
  void on_train_begin(Trainer& t) override;
  void on_step_end(Trainer& t) override;
  void on_train_end(Trainer& t) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// @brief TEST ONLY (fault injection for the straggler tests and benchmarks, never for real
/// jobs): when GZ_TEST_SLOW_DATA_MS is set, a callback that makes rank GZ_TEST_SLOW_RANK (default
/// 0) spend that many extra ms in the data phase of every step, as a loader falling behind would.
/// nullptr when the variable is unset. Throws gz::InvalidArgument for malformed values.
CallbackPtr make_test_fault_injection(const Env& env);

}  // namespace gz::train
