#include "torch/horovod/stall_inspector.h"

#include <sstream>

#include "gz/core/error.h"
#include "gz/core/log.h"

namespace gz::horovod {

void StallInspector::observe(const CycleReport& report, const std::vector<uint8_t>& done, bool agreed_any,
                             Clock::time_point now) {
  const int world = report.world();
  for (size_t i = 0; i < done.size(); ++i) {
    if (done[i]) continue;
    const int have = report.count(i);
    if (have == world || have == 0) {
      if (have == world) partial_[i] = 0;
      continue;
    }
    if (!partial_[i]) {
      partial_[i] = 1;
      since_[i] = now;
    } else if (now - since_[i] >= warning_ && !warned_[i]) {
      warned_[i] = 1;
      GZ_LOG(warn, "DistributedOptimizer: rank ", rank_, ": tensor '", names_[i], "' submitted by ", have,
             " of ", world, " ranks; still missing on ranks [", report.missing_ranks(i), "] after ",
             format_duration(std::chrono::duration_cast<Duration>(now - since_[i])));
    }
    if (now - since_[i] >= error_) flag_ = true;
  }
  if (!agreed_any && now - last_progress_ >= error_) flag_ = true;
  if (agreed_any) last_progress_ = now;
}

void StallInspector::fail(const CycleReport& report, const std::vector<uint8_t>& done, int cycles) const {
  std::ostringstream os;
  int listed = 0;
  for (size_t i = 0; i < done.size() && listed < 10; ++i) {
    if (done[i] || !partial_[i]) continue;
    os << (listed++ ? "; " : "") << "'" << names_[i] << "' missing on ranks [" << report.missing_ranks(i)
       << "]";
  }
  if (!listed)
    for (size_t i = 0; i < done.size() && listed < 10; ++i)
      if (!done[i]) os << (listed++ ? ", " : "not submitted by any rank: ") << "'" << names_[i] << "'";
  GZ_THROW(TimeoutError, "DistributedOptimizer: rank ", rank_, ": stalled after ", cycles,
           " negotiation cycles: ", os.str());
}

}  // namespace gz::horovod
