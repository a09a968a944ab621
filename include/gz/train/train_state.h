// Progress of a training run, shared between the Trainer and its callbacks.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>

namespace gz::train {

/// @brief Counters and latest values; everything a resumed run needs besides tensors.
struct TrainState {
  int64_t step = 0;             ///< optimizer steps done
  int64_t epoch = 0;            ///< current epoch (0-based)
  int64_t total_steps = 0;
  int64_t steps_per_epoch = 0;
  double lr = 0;
  double loss = 0;              ///< last step's training loss averaged over ranks
  double best_metric = std::numeric_limits<double>::quiet_NaN();
  int64_t best_step = -1;
  int64_t evals_without_improvement = 0;
  std::map<std::string, double> metrics;  ///< latest evaluation (test_accuracy, test_loss, ...)
  bool should_stop = false;     ///< set by callbacks (early stopping) to end training
  double samples_per_second = 0;
  // Sample accounting (all ranks together), exact across resumes on another world size.
  int64_t epoch_samples = 0;  ///< positions of this epoch's order already trained on
  int64_t samples_seen = 0;   ///< samples trained on since the start of the run (all epochs)
  int64_t global_batch = 0;   ///< samples per optimizer step on the current world
  double lr_scale = 1;        ///< multiplies the scheduled lr (elastic_batch: scale_lr)
  int64_t schedule_step = 0;  ///< where the lr schedule is read (= step unless scale_lr)
};

}  // namespace gz::train
