// Learning-rate schedules as pure functions of the optimizer step, so a resumed run is exact.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gz::train {

/// @brief A schedule fully resolved to optimizer steps.
struct SchedulerOptions {
  std::string name = "constant";   ///< multi_step, cosine, linear, constant
  double base_lr = 1e-3;
  int64_t warmup_steps = 0;        ///< lr rises linearly to base_lr over these steps
  int64_t total_steps = 1;         ///< cosine/linear decay ends here
  std::vector<int64_t> milestones; ///< multi_step: steps at which lr is multiplied by gamma
  double gamma = 0.1;
  double min_lr = 0;
};

/// @brief lr(step) for step = 0, 1, ... (the lr used by the step-th optimizer update).
///
/// Warm-up (step < warmup_steps): base_lr * (step + 1) / warmup_steps. Then, with
/// t = step - warmup_steps and T = total_steps - warmup_steps:
/// constant: base_lr; multi_step: base_lr * gamma^(milestones <= step);
/// cosine: min_lr + (base_lr - min_lr) * (1 + cos(pi * min(t, T) / T)) / 2;
/// linear: min_lr + (base_lr - min_lr) * (1 - min(t, T) / T).
class LrScheduler {
 public:
  /// @brief Validates the options; throws gz::InvalidArgument.
  explicit LrScheduler(SchedulerOptions options);
  double lr_at(int64_t step) const;
  const SchedulerOptions& options() const { return options_; }

 private:
  SchedulerOptions options_;
};

}  // namespace gz::train
