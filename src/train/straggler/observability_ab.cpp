#include "train/straggler/observability_ab.h"

#include <cstdio>

#include "gz/comm/flight_recorder.h"
#include "gz/train/trainer.h"

namespace gz::train {

ObservabilityAB::ObservabilityAB(CallbackPtr report, int64_t window, bool control)
    : report_(std::move(report)), window_(window < 1 ? 1 : window), control_(control) {}

void ObservabilityAB::on_train_begin(Trainer& t) {
  prev_step_ = -1;
  seconds_[0] = seconds_[1] = 0;
  steps_[0] = steps_[1] = 0;
  report_->on_train_begin(t);
}

void ObservabilityAB::on_step_begin(Trainer& t) {
  const auto now = std::chrono::steady_clock::now();
  const int64_t step = t.state().step;
  // A step lasts from its on_step_begin to the next one's: its data, compute, communication,
  // every callback (the report's exchange included). The first two windows are warm-up.
  if (prev_step_ >= 2 * window_) {
    const int w = on_window(prev_step_) ? 1 : 0;
    seconds_[w] += std::chrono::duration<double>(now - prev_).count();
    ++steps_[w];
  }
  prev_step_ = step;
  prev_ = now;
  // Every rank switches at the same step. DDP and Horovod mode have no op in flight between two
  // steps; ZeRO's parameter all-gathers do (issued by step(), waited in the next forward), so a
  // switch may leave one of them as a queued op in a dump: a benchmark's artefact.
  if (!control_) comm::set_flight_recorders_paused(!on_window(step));
}

ObservabilityAB::~ObservabilityAB() { comm::set_flight_recorders_paused(false); }  // train() threw

void ObservabilityAB::on_step_end(Trainer& t) {
  if (control_ || on_window(t.state().step - 1)) report_->on_step_end(t);
}

void ObservabilityAB::on_train_end(Trainer& t) {
  comm::set_flight_recorders_paused(false);
  report_->on_train_end(t);
  if (!t.is_main()) return;
  const double on = steps_[1] > 0 ? steps_[1] / seconds_[1] : 0,
               off = steps_[0] > 0 ? steps_[0] / seconds_[0] : 0;
  std::printf(
      "obs A/B (window %lld%s): on %lld steps %.3f s = %.4f steps/s; off %lld steps %.3f s = %.4f steps/s; "
      "on/off %.5f\n",
      static_cast<long long>(window_), control_ ? ", control: nothing switched" : "",
      static_cast<long long>(steps_[1]), seconds_[1], on, static_cast<long long>(steps_[0]), seconds_[0], off,
      off > 0 ? on / off : 0.0);
  std::fflush(stdout);
}

}  // namespace gz::train
