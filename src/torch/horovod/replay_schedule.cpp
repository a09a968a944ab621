#include "torch/horovod/replay_schedule.h"

#include <algorithm>
#include <numeric>

namespace gz::horovod {

void ReplaySchedule::record(const std::vector<std::vector<size_t>>& executed,
                            const std::vector<size_t>& dense_bytes, const BucketLimits& limits) {
  std::vector<BucketItem> items(executed.size());
  for (size_t k = 0; k < executed.size(); ++k)
    for (size_t i : executed[k]) items[k].bytes += dense_bytes[i];
  std::vector<size_t> order(executed.size());
  std::iota(order.begin(), order.end(), size_t(0));
  groups_.clear();
  for (const auto& bucket : plan_buckets(items, order, limits)) {
    groups_.emplace_back();
    for (size_t k : bucket)
      groups_.back().insert(groups_.back().end(), executed[k].begin(), executed[k].end());
  }
  group_of_.assign(dense_bytes.size(), 0);
  for (size_t k = 0; k < groups_.size(); ++k)
    for (size_t i : groups_[k]) group_of_[i] = k;
  left_.assign(groups_.size(), 0);
}

void ReplaySchedule::rearm() {
  left_.resize(groups_.size());
  for (size_t k = 0; k < groups_.size(); ++k) left_[k] = groups_[k].size();
}

bool ReplaySchedule::submitted(size_t i) {
  if (groups_.empty()) return false;
  return --left_[group_of_[i]] == 0;
}

std::vector<size_t> Replay::take_confirmed(const CycleReport& report,
                                           std::vector<std::vector<size_t>>& executed) {
  auto everywhere = [&](size_t i) { return report.everywhere(i); };
  std::vector<size_t> ready;
  while (next_ < groups_.size() && std::all_of(groups_[next_].begin(), groups_[next_].end(), everywhere)) {
    const auto& g = groups_[next_++];
    ready.insert(ready.end(), g.begin(), g.end());
    executed.push_back(g);
  }
  if (ready.empty()) {
    active_ = false;
    ran_whole_ = false;
  }
  return ready;
}

}  // namespace gz::horovod
