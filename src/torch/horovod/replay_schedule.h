// Horovod mode's schedule replay (Horovod's response cache, taken further): once a step has been
// negotiated, the next one reduces the same groups in the same order, each as soon as this rank
// holds all of its tensors, with one confirming exchange instead of a negotiation every cycle.
// A group some rank lacks (a gradient skipped, a new order) sends the rest of the step back to
// negotiation.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "gz/torch/bucket_plan.h"
#include "torch/horovod/negotiation.h"

namespace gz::horovod {

/// @brief The groups to replay and, per group, how many of its tensors this rank still lacks.
/// Not thread-safe: its owner guards it (the training thread submits, the progress thread reads).
class ReplaySchedule {
 public:
  /// @brief The next step replays the groups `executed` (agreed groups, so the same on every rank),
  /// merged in order into buckets by gz::plan_buckets; a group stays whole. `dense_bytes[i]`: what
  /// tensor i puts on the wire when dense (0 when it travels as rows). Merging is idempotent, so a
  /// replayed step records the schedule it ran.
  void record(const std::vector<std::vector<size_t>>& executed, const std::vector<size_t>& dense_bytes,
              const BucketLimits& limits);
  /// @brief Negotiate the next step (after a failed one, or with replay off).
  void clear() { groups_.clear(); }
  bool empty() const { return groups_.empty(); }
  const std::vector<std::vector<size_t>>& groups() const { return groups_; }
  /// @brief Start of a step: every tensor of every group still to come.
  void rearm();
  /// @brief This rank submitted tensor `i`: whether that completed its group.
  bool submitted(size_t i);
  /// @brief Whether this rank holds every tensor of group `k`.
  bool complete(size_t k) const { return left_[k] == 0; }

 private:
  std::vector<std::vector<size_t>> groups_;  // a partition of the tensors, in launch order
  std::vector<size_t> group_of_;
  std::vector<size_t> left_;
};

/// @brief The replay of one step on the progress thread: a cursor over its copy of the groups.
class Replay {
 public:
  /// @brief A step that replays `groups` (none: it negotiates from the start).
  explicit Replay(std::vector<std::vector<size_t>> groups)
      : groups_(std::move(groups)), active_(!groups_.empty()), ran_whole_(active_) {}
  bool active() const { return active_ && next_ < groups_.size(); }
  /// @brief The next group this rank waits for before it confirms.
  size_t next() const { return next_; }
  /// @brief After a confirming exchange: the tensors of every next group that all ranks hold (one
  /// fused reduction for them all), appended to `executed` group by group. Empty when some rank
  /// lacks part of the next group: the replay stops and the step negotiates the rest.
  std::vector<size_t> take_confirmed(const CycleReport& report, std::vector<std::vector<size_t>>& executed);
  /// @brief Whether the whole step ran from the schedule.
  bool ran_whole() const { return ran_whole_; }

 private:
  std::vector<std::vector<size_t>> groups_;
  size_t next_ = 0;
  bool active_;
  bool ran_whole_;
};

}  // namespace gz::horovod
