// The straggler report's arithmetic: one window's lateness and cause per rank, and the state
// across windows (streaks, link probes, the summary). No communication here: every rank runs the
// same code on the same all-gathered numbers (see gz/train/straggler.h).
#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <sstream>

#include "gz/core/error.h"
#include "gz/train/straggler.h"

namespace gz::train {
namespace {

constexpr size_t kCauses = 4;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The median of field `f` over every rank but `skip`: "the others" (with two ranks, the other one).
template <typename F>
double median_of_others(const std::vector<RankWindow>& ranks, size_t skip, F f) {
  std::vector<double> v;
  for (size_t j = 0; j < ranks.size(); ++j)
    if (j != skip) v.push_back(f(ranks[j]));
  return median(std::move(v));
}

double cause_value(const RankWindow& w, size_t cause) {
  switch (cause) {
    case 0:
      return w.data_ms;
    case 1:
      return w.compute_ms;
    case 2:
      return w.optimizer_ms;
    default:
      return w.other_ms;
  }
}

std::string fixed(double v, int precision) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(precision);
  os << v;
  return os.str();
}

// "190 ms", "4.2 ms", "0.35 ms": readable at every scale.
std::string ms(double v) { return fixed(v, std::fabs(v) >= 100 ? 0 : std::fabs(v) >= 1 ? 1 : 2) + " ms"; }

std::string percent(double fraction) { return fixed(100 * fraction, 0) + "%"; }

}  // namespace

const char* straggler_cause_text(StragglerCause cause) {
  switch (cause) {
    case StragglerCause::data:
      return "data loading";
    case StragglerCause::compute:
      return "compute (forward + backward)";
    case StragglerCause::optimizer:
      return "the optimizer step";
    case StragglerCause::other:
      return "outside the marked phases (callbacks, logging)";
  }
  return "?";
}

const char* straggler_cause_name(StragglerCause cause) {
  switch (cause) {
    case StragglerCause::data:
      return "data";
    case StragglerCause::compute:
      return "compute";
    case StragglerCause::optimizer:
      return "optimizer";
    case StragglerCause::other:
      return "other";
  }
  return "?";
}

WindowAnalysis analyze_window(const std::vector<RankWindow>& ranks, const StragglerOptions& o) {
  GZ_CHECK_ARG(ranks.size() >= 2, "straggler analysis needs at least two ranks, got ", ranks.size());
  WindowAnalysis a;
  std::vector<double> steps, comms;
  for (const auto& w : ranks) {
    steps.push_back(w.step_ms);
    comms.push_back(w.comm_ms);
  }
  a.step_ms = median(steps);
  a.comm_ms = median(comms);
  a.threshold_ms = std::max(o.threshold_ms, o.threshold_fraction * a.step_ms);
  int latest = -1;
  for (size_t r = 0; r < ranks.size(); ++r) {
    RankVerdict v;
    // The last to arrive waits least: its lateness is how much less it waits than the others.
    v.late_ms = median_of_others(ranks, r, [](const RankWindow& w) { return w.comm_ms; }) - ranks[r].comm_ms;
    v.cause_excess_ms = -INFINITY;
    for (size_t c = 0; c < kCauses; ++c) {
      const double excess = cause_value(ranks[r], c) - median_of_others(ranks, r, [c](const RankWindow& w) {
                              return cause_value(w, c);
                            });
      if (excess > v.cause_excess_ms) {
        v.cause_excess_ms = excess;
        v.cause = static_cast<StragglerCause>(c);
      }
    }
    a.ranks.push_back(v);
    if (latest < 0 || v.late_ms > a.ranks[static_cast<size_t>(latest)].late_ms) latest = static_cast<int>(r);
  }
  // Late enough to matter, and explained: a phase of its own took at least half of the lateness
  // longer than on the others (noise in the waits alone is not a straggler).
  const RankVerdict& l = a.ranks[static_cast<size_t>(latest)];
  if (l.late_ms >= a.threshold_ms && l.cause_excess_ms >= 0.5 * l.late_ms) a.late_rank = latest;
  return a;
}

StragglerTracker::StragglerTracker(StragglerOptions options, std::vector<std::string> hosts)
    : o_(options), hosts_(std::move(hosts)) {
  GZ_CHECK_ARG(o_.every > 0 && o_.windows > 0, "straggler report: every and windows must be positive");
  std::map<std::string, int> index;
  for (size_t r = 0; r < hosts_.size(); ++r) {
    auto it = index.find(hosts_[r]);
    if (it == index.end()) {
      it = index.emplace(hosts_[r], static_cast<int>(host_names_.size())).first;
      host_names_.push_back(hosts_[r]);
      first_rank_.push_back(static_cast<int>(r));
    }
    host_of_.push_back(it->second);
  }
  stats_.resize(hosts_.size());
}

std::string StragglerTracker::rank_label(int rank) const {
  return "rank " + std::to_string(rank) + " (" + hosts_[static_cast<size_t>(rank)] + ")";
}

std::string StragglerTracker::host_ranks(int host) const {
  std::string s;
  int n = 0;
  for (size_t r = 0; r < host_of_.size(); ++r)
    if (host_of_[r] == host) s += (n++ ? ", " : "") + std::to_string(r);
  return (n == 1 ? "rank " : "ranks ") + s;
}

int64_t StragglerTracker::next_window_steps(const WindowAnalysis& a) const {
  if (!(a.step_ms > 0)) return o_.every;
  const double wanted = std::ceil(o_.min_window_ms / a.step_ms);
  return std::clamp<int64_t>(static_cast<int64_t>(std::min(wanted, 1e9)), o_.every, 100 * o_.every);
}

std::string StragglerTracker::add_window(const WindowAnalysis& a, int64_t last_step, int64_t steps) {
  GZ_CHECK_ARG(a.ranks.size() == hosts_.size(), "straggler report: ", a.ranks.size(),
               " ranks in a window of a ", hosts_.size(), "-rank job");
  ++windows_seen_;
  ++windows_since_probe_;
  const int64_t first = last_step - (steps > 0 ? steps : o_.every) + 1;
  if (first_step_ < 0) first_step_ = first;
  last_step_ = last_step;
  for (const auto& v : a.ranks) {
    max_late_ms_ = std::max(max_late_ms_, v.late_ms);
    if (a.step_ms > 0) max_late_fraction_ = std::max(max_late_fraction_, v.late_ms / a.step_ms);
  }
  if (a.late_rank < 0) {
    streak_rank_ = -1;
    streak_ = 0;
    return "";
  }
  const auto& v = a.ranks[static_cast<size_t>(a.late_rank)];
  const double loss = a.step_ms > 0 ? std::min(1.0, v.late_ms / a.step_ms) : 0;
  RankStats& st = stats_[static_cast<size_t>(a.late_rank)];
  ++st.late_windows;
  st.late_ms_sum += v.late_ms;
  st.loss_sum += loss;
  ++st.cause_windows[static_cast<size_t>(v.cause)];
  if (a.late_rank != streak_rank_) {
    streak_rank_ = a.late_rank;
    streak_ = 0;
    streak_first_step_ = first;
    streak_late_ = streak_loss_ = streak_excess_ = 0;
    streak_causes_.assign(kCauses, 0);
  }
  ++streak_;
  streak_late_ += v.late_ms;
  streak_loss_ += loss;
  streak_excess_ += v.cause_excess_ms;
  ++streak_causes_[static_cast<size_t>(v.cause)];
  const int64_t n = o_.windows;
  if (streak_ < n || (streak_ > n && (streak_ - n) % (10 * n) != 0)) return "";
  st.named = true;
  const auto cause = static_cast<StragglerCause>(
      std::max_element(streak_causes_.begin(), streak_causes_.end()) - streak_causes_.begin());
  const double k = static_cast<double>(streak_);
  return rank_label(a.late_rank) + " is " + ms(streak_late_ / k) + "/step behind the median, in " +
         straggler_cause_text(cause) + " (+" + ms(streak_excess_ / k) +
         "/step over the other ranks' median); the job loses ~" + percent(streak_loss_ / k) +
         " throughput to it (steps " + std::to_string(streak_first_step_) + "-" + std::to_string(last_step) +
         ", " + std::to_string(streak_) + " windows)";
}

bool StragglerTracker::probe_due(const WindowAnalysis& a) const {
  return o_.link_probe && host_count() >= 2 && a.late_rank < 0 && a.step_ms > 0 &&
         a.comm_ms >= o_.probe_comm_share * a.step_ms && windows_since_probe_ >= probe_gap_;
}

std::vector<std::pair<int, int>> StragglerTracker::probe_pairs() const {
  std::vector<std::pair<int, int>> pairs;
  const int h = host_count();
  for (int i = 0; i < h && h >= 2; ++i) {
    const int a = first_rank_[static_cast<size_t>(i)], b = first_rank_[static_cast<size_t>((i + 1) % h)];
    if (h == 2 && i == 1) break;  // two hosts: one link
    pairs.push_back({std::min(a, b), std::max(a, b)});
  }
  return pairs;
}

std::string StragglerTracker::add_probe(const std::vector<comm::LinkMeasure>& measures,
                                        const WindowAnalysis& a, int64_t last_step) {
  ++probes_;
  windows_since_probe_ = 0;
  std::vector<comm::LinkMeasure> by_host = measures;
  for (auto& m : by_host) {
    m.a = host_of_.at(static_cast<size_t>(m.a));
    m.b = host_of_.at(static_cast<size_t>(m.b));
  }
  const comm::LinkJudgement j = comm::judge_links(host_count(), by_host);
  if (j.slow_nodes.empty()) {
    suspect_hosts_.clear();
    suspect_confirmations_ = 0;
    probe_gap_ = std::min<int64_t>(probe_gap_ * 2, 32);  // nothing found: look less often
    if (link_summary_.empty())
      link_summary_ = "links between hosts: probed " + std::to_string(probes_) +
                      " time(s) while communication dominated the step, none slow (median " +
                      comm::format_rate(j.median_link_bps) + ")";
    return "";
  }
  if (j.slow_nodes == suspect_hosts_) {
    ++suspect_confirmations_;
  } else {
    suspect_hosts_ = j.slow_nodes;
    suspect_confirmations_ = 1;
    probe_gap_ = 1;  // confirm at the next window
  }
  std::string who;
  double slowest = INFINITY;
  for (int h : j.slow_nodes) {
    who += (who.empty() ? "" : "; ") + std::string("host ") + host_names_[static_cast<size_t>(h)] + " (" +
           host_ranks(h) + ")";
    slowest = std::min(slowest, j.best_link_bps[static_cast<size_t>(h)]);
  }
  const double share = a.step_ms > 0 ? a.comm_ms / a.step_ms : 0;
  const double loss = share * std::max(0.0, 1 - slowest / std::max(j.median_best_bps, 1.0));
  link_summary_ = who + ": slow network link, " + comm::format_rate(slowest) + " against " +
                  comm::format_rate(j.median_best_bps) + " on the other hosts' links (" +
                  std::to_string(suspect_confirmations_) + " probe(s) in a row)";
  if (suspect_confirmations_ < 2) return "";
  probe_gap_ = std::min<int64_t>(probe_gap_ * 2, 32);
  if (link_named_ && suspect_confirmations_ % 5 != 2) return "";
  link_named_ = true;
  return who + " has a slow network link: " + comm::format_rate(slowest) + " against " +
         comm::format_rate(j.median_best_bps) + " on the other hosts' links; communication is " +
         percent(share) + " of the step, the job loses ~" + percent(loss) +
         " throughput to it (link probes at steps up to " + std::to_string(last_step) + ")";
}

std::string StragglerTracker::summary() const {
  std::ostringstream os;
  os << "straggler report: " << windows_seen_ << " window(s) of " << o_.every << "+ steps";
  if (windows_seen_ > 0) os << " (steps " << first_step_ << "-" << last_step_ << ")";
  bool any = false;
  std::vector<size_t> order(stats_.size());
  for (size_t r = 0; r < order.size(); ++r) order[r] = r;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t x, size_t y) { return stats_[x].late_windows > stats_[y].late_windows; });
  for (size_t r : order) {
    const RankStats& st = stats_[r];
    if (!st.named) continue;
    any = true;
    const double k = static_cast<double>(st.late_windows);
    const auto cause = static_cast<StragglerCause>(
        std::max_element(st.cause_windows.begin(), st.cause_windows.end()) - st.cause_windows.begin());
    os << "\n  " << rank_label(static_cast<int>(r)) << ": late in " << st.late_windows << " of "
       << windows_seen_ << " windows, " << ms(st.late_ms_sum / k)
       << "/step behind the median on average, mostly in " << straggler_cause_text(cause) << "; ~"
       << percent(st.loss_sum / k) << " throughput lost";
  }
  if (!any)
    os << "\n  no straggler: the latest rank was at most " << ms(std::max(0.0, max_late_ms_))
       << "/step behind the median (" << percent(std::max(0.0, max_late_fraction_)) << " of a step)";
  if (!link_summary_.empty()) os << "\n  " << link_summary_;
  return os.str();
}

}  // namespace gz::train
