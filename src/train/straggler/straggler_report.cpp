// The straggler report as a training Callback: phase totals per window, one all-gather, the
// analysis (straggler_analysis.cpp), warnings, per-rank figures and the end summary on rank 0.
#include <unistd.h>

#include <cstring>
#include <iostream>
#include <sstream>

#include "gz/comm/communicator.h"
#include "gz/core/env.h"
#include "gz/core/error.h"
#include "gz/core/log.h"
#include "gz/core/phase.h"
#include "gz/train/callback.h"
#include "gz/train/config.h"
#include "gz/train/straggler.h"
#include "gz/train/trainer.h"

namespace gz::train {
namespace {

constexpr size_t kFields = 6;  // RankWindow's fields, in pack() order
constexpr size_t kHostBytes = 64;

std::vector<double> pack(const RankWindow& w) {
  return {w.step_ms, w.data_ms, w.compute_ms, w.comm_ms, w.optimizer_ms, w.other_ms};
}

RankWindow unpack(const double* v) {
  RankWindow w;
  w.step_ms = v[0];
  w.data_ms = v[1];
  w.compute_ms = v[2];
  w.comm_ms = v[3];
  w.optimizer_ms = v[4];
  w.other_ms = v[5];
  return w;
}

// This rank's window from two phase-total reads `steps` steps apart. Evaluation and checkpoints
// are left out of the step time: they are not part of the steady step, and their own waits are
// not arrival skew at the gradient all-reduces.
RankWindow window_of(const PhaseTotals& from, const PhaseTotals& to, int64_t steps) {
  const double per = 1e6 * static_cast<double>(steps);
  const auto d = [&](Phase p) { return static_cast<double>(to.of(p) - from.of(p)) / per; };
  RankWindow w;
  w.data_ms = d(Phase::data);
  w.compute_ms = d(Phase::forward) + d(Phase::backward);
  w.comm_ms = d(Phase::comm);
  w.optimizer_ms = d(Phase::optimizer);
  w.other_ms = d(Phase::idle) + d(Phase::recovery);
  w.step_ms = w.data_ms + w.compute_ms + w.comm_ms + w.optimizer_ms + w.other_ms;
  return w;
}

std::vector<std::string> exchange_hostnames(comm::Communicator& g) {
  char mine[kHostBytes] = {0};
  if (gethostname(mine, kHostBytes - 1) != 0) std::strcpy(mine, "?");
  std::vector<char> all(kHostBytes * static_cast<size_t>(g.size()));
  g.allgather(mine, all.data(), kHostBytes, DType::u8);
  std::vector<std::string> hosts;
  for (int r = 0; r < g.size(); ++r) {
    const char* h = all.data() + kHostBytes * static_cast<size_t>(r);
    hosts.emplace_back(h, strnlen(h, kHostBytes - 1));
  }
  return hosts;
}

}  // namespace

StragglerOptions straggler_options(const TrainConfig& c, const Env& env) {
  StragglerOptions o;
  o.every = c.straggler.every;
  o.windows = c.straggler.windows;
  o.threshold_ms = c.straggler.threshold_ms;
  o.threshold_fraction = c.straggler.threshold_fraction;
  o.link_probe = c.straggler.link_probe;
  o.min_window_ms = c.straggler.min_window_ms;
  if (auto every = env.get_int("GZ_STRAGGLER_EVERY")) {
    if (*every < 0) GZ_THROW(InvalidArgument, "GZ_STRAGGLER_EVERY must be >= 0 (0 = off), got ", *every);
    o.every = *every;
  }
  return o;
}

struct StragglerReport::Impl {
  StragglerOptions o;
  std::shared_ptr<HistoryLogger> history;
  comm::CommPtr group;
  std::unique_ptr<StragglerTracker> tracker;
  PhaseTotals base;
  int64_t base_step = -1;
  int64_t window_steps = 0;  // of the window now running (next_window_steps of the last one)
  // What the report itself costs: its exchanges (and analysis, logging) and its link probes,
  // against the training time since the first window began.
  int64_t exchange_ns = 0, probe_ns = 0, exchanges = 0, probes = 0, start_ns = 0;

  // The exchange runs on the communicator's progress thread while the next steps load data and
  // compute (an all-gather across hosts takes tens of ms on a loaded machine); its result is read
  // at the end of the next window. The buffers live here until then.
  std::vector<double> send, recv;
  comm::WorkPtr pending;
  int64_t pending_step = 0, pending_steps = 0;

  ~Impl() {
    if (pending)
      comm::finish_or_abort(*group, *pending, "straggler report: exchange still running at the end");
  }

  void post(const RankWindow& mine, int64_t step, int64_t steps) {
    send = pack(mine);
    recv.assign(kFields * static_cast<size_t>(group->size()), 0.0);
    pending = group->allgather_async(send.data(), recv.data(), kFields, DType::f64);
    pending_step = step;
    pending_steps = steps;
  }

  std::vector<RankWindow> collect() {
    pending->wait();
    pending.reset();
    std::vector<RankWindow> ranks;
    for (int r = 0; r < group->size(); ++r)
      ranks.push_back(unpack(recv.data() + kFields * static_cast<size_t>(r)));
    return ranks;
  }

  // Analyse the exchanged window: warnings and the history row on rank 0, and the link probe
  // (collective) when the analysis, the same on every rank, says it is due.
  void analyse(Trainer& t, int64_t step) {
    const auto ranks = collect();
    const WindowAnalysis a = analyze_window(ranks, o);
    const std::string warning = tracker->add_window(a, pending_step, pending_steps);
    window_steps = tracker->next_window_steps(a);
    const auto prefix = [step] { return "straggler (step " + std::to_string(step) + "): "; };
    if (t.is_main()) {
      if (!warning.empty()) GZ_LOG(warn, prefix(), warning);
      log(t, ranks, a);
    }
    if (!tracker->probe_due(a)) return;
    const int64_t t0 = phase_totals().at_ns;
    const std::string link = tracker->add_probe(probe(), a, step);
    if (t.is_main() && !link.empty()) GZ_LOG(warn, prefix(), link);
    probe_ns += phase_totals().at_ns - t0;
    ++probes;
  }

  // Every rank probes the host ring's pairs it belongs to; one all-reduce hands every rank every
  // pair's result, so all trackers stay in step.
  std::vector<comm::LinkMeasure> probe() {
    const auto pairs = tracker->probe_pairs();
    comm::LinkProbeOptions po;
    po.bytes = o.probe_bytes;
    const auto mine = comm::probe_links(*group, pairs, po);
    std::vector<double> flat(2 * pairs.size(), 0.0);
    for (const auto& m : mine)
      for (size_t i = 0; i < pairs.size(); ++i)
        if (pairs[i] == std::make_pair(m.a, m.b)) {
          flat[2 * i] = m.rtt_us;
          flat[2 * i + 1] = m.bytes_per_s;
        }
    group->allreduce(flat.data(), flat.size(), DType::f64, comm::ReduceOp::sum);
    std::vector<comm::LinkMeasure> all;
    for (size_t i = 0; i < pairs.size(); ++i)
      all.push_back({pairs[i].first, pairs[i].second, flat[2 * i], flat[2 * i + 1]});
    return all;
  }

  void log(Trainer& t, const std::vector<RankWindow>& ranks, const WindowAnalysis& a) {
    if (!history) return;
    std::map<std::string, double> v{{"step_ms", a.step_ms},
                                    {"comm_ms", a.comm_ms},
                                    {"late_rank", static_cast<double>(a.late_rank)},
                                    {"threshold_ms", a.threshold_ms},
                                    {"report_ms", 1e-6 * static_cast<double>(exchange_ns + probe_ns)}};
    for (size_t r = 0; r < ranks.size(); ++r) {
      const std::string p = "rank" + std::to_string(r) + "/";
      v[p + "data_ms"] = ranks[r].data_ms;
      v[p + "compute_ms"] = ranks[r].compute_ms;
      v[p + "comm_ms"] = ranks[r].comm_ms;
      v[p + "optimizer_ms"] = ranks[r].optimizer_ms;
      v[p + "other_ms"] = ranks[r].other_ms;
      v[p + "late_ms"] = a.ranks[r].late_ms;
    }
    history->log(t, "straggler", v);
  }
};

StragglerReport::StragglerReport(StragglerOptions options, std::shared_ptr<HistoryLogger> history)
    : impl_(std::make_unique<Impl>()) {
  impl_->o = options;
  impl_->history = std::move(history);
}

StragglerReport::~StragglerReport() = default;

void StragglerReport::on_train_begin(Trainer& t) {
  auto& m = *impl_;
  // Again after an in-place recovery: the last window's exchange belongs to the old group (most
  // likely aborted) and must neither be read nor pair with the new group's ops.
  if (m.pending && m.group)
    comm::finish_or_abort(*m.group, *m.pending, "straggler report: a new train() began (recovery)");
  m.pending.reset();
  m.tracker.reset();
  m.base_step = -1;
  m.window_steps = m.o.every;
  m.group = t.group();
  if (!m.group || m.group->size() < 2 || m.o.every <= 0) return;
  m.tracker = std::make_unique<StragglerTracker>(m.o, exchange_hostnames(*m.group));
}

void StragglerReport::on_step_end(Trainer& t) {
  auto& m = *impl_;
  if (!m.tracker) return;
  const int64_t step = t.state().step;
  if (m.base_step < 0) {  // the first step carries set-up costs: windows start after it
    m.base = phase_totals();
    m.base_step = step;
    m.start_ns = m.base.at_ns;
    return;
  }
  if (step - m.base_step < m.window_steps) return;
  const PhaseTotals now = phase_totals();
  const RankWindow mine = window_of(m.base, now, step - m.base_step);
  const int64_t probe_before = m.probe_ns;
  if (m.pending) m.analyse(t, step);  // the window before this one
  m.post(mine, step, step - m.base_step);
  // The report's own time (a probe's apart) and the probe are not part of the next window.
  m.base = phase_totals();
  m.exchange_ns += m.base.at_ns - now.at_ns - (m.probe_ns - probe_before);
  ++m.exchanges;
  m.base_step = step;
}

void StragglerReport::on_train_end(Trainer& t) {
  auto& m = *impl_;
  if (!m.tracker) return;
  if (m.pending) m.analyse(t, t.state().step);  // the last window (collective: every rank)
  if (!t.is_main()) return;
  const double total_s = m.start_ns > 0 ? 1e-9 * static_cast<double>(phase_totals().at_ns - m.start_ns) : 0;
  std::ostringstream cost;
  cost.setf(std::ios::fixed);
  cost.precision(1);
  cost << "  the report itself: " << 1e-6 * static_cast<double>(m.exchange_ns) << " ms in " << m.exchanges
       << " exchange(s)";
  if (m.probes > 0)
    cost << ", " << 1e-6 * static_cast<double>(m.probe_ns) << " ms in " << m.probes << " link probe(s)";
  cost.precision(3);
  if (total_s > 0)
    cost << " (" << 100 * 1e-9 * static_cast<double>(m.exchange_ns + m.probe_ns) / total_s << "% of "
         << total_s << " s of training on rank 0)";
  std::cout << m.tracker->summary() << "\n" << cost.str() << std::endl;
}

}  // namespace gz::train
