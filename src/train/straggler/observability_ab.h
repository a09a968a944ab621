// What the flight recorder and the straggler report cost in training, measured A/B within one run.
#pragma once

#include <chrono>
#include <cstdint>

#include "gz/train/callback.h"

namespace gz::train {

/// @brief Wraps the straggler report (GZ_OBS_AB_WINDOW=W, a benchmark's switch): steps alternate
/// in windows of W between "on" (the recorders and the report as configured) and "off" (every
/// flight recorder of the process paused, the report not called), and rank 0 prints both windows'
/// throughput at the end. Between separate runs this VM's throughput differs by up to 10 % for the
/// same settings; windows of one run see the same vCPU placement and the same neighbours, so their
/// ratio resolves far smaller costs. `control` labels the windows alike but switches nothing: the
/// ratio the method reports when there is nothing to find. W should be a multiple of the report's
/// `every`, so that on-windows exchange as often as a run without this wrapper.
class ObservabilityAB : public Callback {
 public:
  ObservabilityAB(CallbackPtr report, int64_t window, bool control);
  ~ObservabilityAB() override;
  void on_train_begin(Trainer& t) override;
  void on_train_end(Trainer& t) override;
  void on_epoch_begin(Trainer& t) override { report_->on_epoch_begin(t); }
  void on_epoch_end(Trainer& t) override { report_->on_epoch_end(t); }
  void on_step_begin(Trainer& t) override;
  void on_step_end(Trainer& t) override;
  void on_evaluate(Trainer& t) override { report_->on_evaluate(t); }
  void on_save(Trainer& t, const std::string& dir) override { report_->on_save(t, dir); }
  bool changes_training_state() const override { return report_->changes_training_state(); }

 private:
  bool on_window(int64_t step) const { return (step / window_) % 2 == 0; }

  CallbackPtr report_;
  int64_t window_;
  bool control_;
  int64_t prev_step_ = -1;
  std::chrono::steady_clock::time_point prev_{};
  double seconds_[2] = {0, 0};  ///< [off, on]
  int64_t steps_[2] = {0, 0};
};

}  // namespace gz::train
