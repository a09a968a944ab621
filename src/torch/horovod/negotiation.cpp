#include "torch/horovod/negotiation.h"

#include <algorithm>

namespace gz::horovod {

int CycleReport::count(size_t tensor) const {
  int have = 0;
  for (int r = 0; r < world_; ++r) have += has(r, tensor) ? 1 : 0;
  return have;
}

bool CycleReport::any_stall() const {
  for (int r = 0; r < world_; ++r)
    if (has(r, n_)) return true;
  return false;
}

std::string CycleReport::missing_ranks(size_t tensor) const {
  std::string out;
  for (int r = 0; r < world_; ++r)
    if (!has(r, tensor)) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

const CycleReport& Negotiator::exchange(const std::vector<uint8_t>& ready, bool stall) {
  std::copy(ready.begin(), ready.end(), msg_.begin());
  msg_.back() = stall ? 1 : 0;
  group_.allgather(msg_.data(), report_.all_.data(), msg_.size(), DType::u8);
  return report_;
}

std::vector<size_t> Negotiator::agreed(const CycleReport& report, const std::vector<uint8_t>& done) {
  std::vector<size_t> out;
  for (size_t i = 0; i < done.size(); ++i)
    if (!done[i] && report.everywhere(i)) out.push_back(i);
  return out;
}

}  // namespace gz::horovod
