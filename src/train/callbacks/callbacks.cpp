// Small built-in callbacks: the lr schedule and early stopping.
#include <torch/torch.h>

#include "gz/core/log.h"
#include "gz/train/callback.h"
#include "gz/train/scheduler.h"
#include "gz/train/trainer.h"

namespace gz::train {

void LrSchedulerCallback::on_step_begin(Trainer& t) {
  // schedule_step = step, except with elastic_batch scale_lr (samples seen / first global batch).
  double lr = t.scheduler().lr_at(t.state().schedule_step) * t.state().lr_scale;
  for (auto& group : t.optimizer().param_groups()) group.options().set_lr(lr);
  t.state().lr = lr;
}

void EarlyStopping::on_evaluate(Trainer& t) {
  // The Trainer counts evaluations without an improvement > early_stopping_threshold.
  (void)threshold_;
  if (patience_ > 0 && t.state().evals_without_improvement >= patience_) {
    t.state().should_stop = true;
    if (t.is_main())
      GZ_LOG(warn, "early stopping at step ", t.state().step, ": no improvement of ", t.config().metric_for_best_model,
             " in ", patience_, " evaluations (best ", t.state().best_metric, " at step ", t.state().best_step, ")");
  }
}

}  // namespace gz::train
