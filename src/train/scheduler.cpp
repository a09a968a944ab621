#include "gz/train/scheduler.h"

#include <algorithm>
#include <cmath>

#include "gz/core/error.h"

namespace gz::train {

LrScheduler::LrScheduler(SchedulerOptions options) : options_(std::move(options)) {
  const auto& o = options_;
  if (o.name != "multi_step" && o.name != "cosine" && o.name != "linear" && o.name != "constant")
    GZ_THROW(InvalidArgument, "unknown scheduler '", o.name, "' (known: multi_step cosine linear constant)");
  GZ_CHECK_ARG(o.base_lr > 0, "scheduler base_lr ", o.base_lr);
  GZ_CHECK_ARG(o.warmup_steps >= 0, "scheduler warmup_steps ", o.warmup_steps);
  GZ_CHECK_ARG(o.total_steps >= 1, "scheduler total_steps ", o.total_steps);
  GZ_CHECK_ARG(o.min_lr >= 0 && o.min_lr <= o.base_lr, "scheduler min_lr ", o.min_lr);
  GZ_CHECK_ARG(std::is_sorted(o.milestones.begin(), o.milestones.end()), "scheduler milestones must be sorted");
}

double LrScheduler::lr_at(int64_t step) const {
  const auto& o = options_;
  if (step < 0) step = 0;
  if (step < o.warmup_steps) return o.base_lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps);
  if (o.name == "constant") return o.base_lr;
  if (o.name == "multi_step") {
    auto passed = std::upper_bound(o.milestones.begin(), o.milestones.end(), step) - o.milestones.begin();
    return o.base_lr * std::pow(o.gamma, static_cast<double>(passed));
  }
  double span = static_cast<double>(std::max<int64_t>(1, o.total_steps - o.warmup_steps));
  double t = std::min(static_cast<double>(step - o.warmup_steps), span) / span;
  if (o.name == "cosine") return o.min_lr + (o.base_lr - o.min_lr) * 0.5 * (1.0 + std::cos(M_PI * t));
  return o.min_lr + (o.base_lr - o.min_lr) * (1.0 - t);  // linear
}

}  // namespace gz::train
