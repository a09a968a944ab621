#include "torch/horovod/cycle_loop.h"

#include <algorithm>

namespace gz::horovod {

namespace {
Duration stall_error(const DistributedOptimizerOptions& o, const comm::Communicator& g) {
  return o.stall_error.count() > 0 ? o.stall_error : g.timeout();
}

std::vector<std::vector<size_t>> schedule_of(Submissions& subs) {
  std::lock_guard<std::mutex> lock(subs.mu);
  return subs.schedule.groups();
}
}  // namespace

CycleLoop::CycleLoop(comm::Communicator& group, Submissions& subs, Fusion& fusion,
                     const std::vector<std::string>& names, const DistributedOptimizerOptions& options,
                     Timeline* timeline)
    : subs_(subs),
      fusion_(fusion),
      options_(options),
      timeline_(timeline),
      n_(names.size()),
      negotiator_(group, names.size()),
      stall_(names, group.rank(), options.stall_warning, stall_error(options, group)),
      // Every rank holds the same schedule (built from agreed groups after the same steps), so
      // every rank replays, or negotiates, alike.
      replay_(schedule_of(subs)),
      // A rank waits at most this long for its next group before it confirms anyway: the group
      // then fails everywhere and the stall inspector takes over.
      patience_(std::min({options.stall_warning, stall_error(options, group), group.timeout()}) / 2),
      done_(names.size(), 0),
      ready_(names.size(), 0) {}

StepOutcome CycleLoop::run() {
  StepOutcome out;
  next_cycle_ = Clock::now();  // the first cycle starts at once
  stall_.start(next_cycle_);
  fusion_.begin_step();
  while (ndone_ < n_) {
    const bool confirming = replay_.active();
    wait_for_cycle(confirming);
    const auto start = Clock::now();
    next_cycle_ = start + options_.cycle_time;
    const CycleReport& report = negotiator_.exchange(ready_, stall_.flag());
    if (timeline_) timeline_->span("comm", confirming ? "confirm" : "negotiate", start, Clock::now());
    ++out.cycles;
    // One confirmation covers every following group that all ranks hold by now (communication
    // lagging behind backward, or backward over): one fused reduction for them all.
    if (confirming && reduce(replay_.take_confirmed(report, out.executed))) {
      stall_.progressed(Clock::now());
      continue;
    }
    negotiate(report, out);  // not replaying, or some rank lacks part of the next group
  }
  out.replayed = replay_.ran_whole();
  return out;
}

void CycleLoop::wait_for_cycle(bool confirming) {
  std::unique_lock<std::mutex> lock(subs_.mu);
  if (confirming) {
    // Replaying, a cycle costs every rank a rendezvous: enter one only when this rank holds the
    // whole next group (as a DDP bucket), or when backward is over and it never will.
    subs_.cv.wait_for(lock, patience_,
                      [&] { return subs_.schedule.complete(replay_.next()) || subs_.closing; });
  } else {
    // Cycles start at least cycle_time apart, so the gradients that become ready in between are
    // negotiated and reduced together: one allgather and one fused all-reduce for many tensors
    // (Horovod's background loop does the same) instead of a rendezvous of every rank per ready
    // gradient. Once every local gradient is submitted, go at once: the step waits.
    subs_.cv.wait_until(lock, next_cycle_, [&] { return subs_.count == n_; });
  }
  for (size_t i = 0; i < n_; ++i) ready_[i] = subs_.submitted[i] && !done_[i];
}

void CycleLoop::negotiate(const CycleReport& report, StepOutcome& out) {
  const auto agreed = Negotiator::agreed(report, done_);
  stall_.observe(report, done_, !agreed.empty(), Clock::now());
  // Every rank saw the same flags, so every rank fails here with the same report.
  if (report.any_stall()) stall_.fail(report, done_, out.cycles);
  if (reduce(agreed)) out.executed.push_back(agreed);
}

bool CycleLoop::reduce(const std::vector<size_t>& idx) {
  if (idx.empty()) return false;
  fusion_.reduce(idx);
  for (size_t i : idx) done_[i] = 1;
  ndone_ += idx.size();
  return true;
}

}  // namespace gz::horovod
