#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <sstream>

#include <torch/torch.h>

#include "gz/train/callback.h"
#include "gz/train/trainer.h"

namespace gz::train {

namespace {

std::string clock_text(double s) {
  if (!(s >= 0) || s > 360000) return "--:--";
  long t = static_cast<long>(s + 0.5);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%02ld:%02ld", t / 60, t % 60);
  return buf;
}

}  // namespace

ProgressBar::ProgressBar(bool bar, int tty) : bar_(bar), tty_(tty < 0 ? ::isatty(STDOUT_FILENO) == 1 : tty != 0) {}

void ProgressBar::on_train_begin(Trainer& t) {
  clock_.reset();
  since_draw_.reset();
  start_step_ = t.state().step;
}

void ProgressBar::draw(Trainer& t, bool final_line) {
  const auto& s = t.state();
  double secs = clock_.seconds();
  double rate = secs > 0 ? static_cast<double>(s.step - start_step_) / secs : 0;
  double eta = rate > 0 ? static_cast<double>(s.total_steps - s.step) / rate : -1;
  std::ostringstream os;
  os.setf(std::ios::fixed);
  if (bar_ && tty_) {
    const int width = 24;
    int filled = s.total_steps > 0 ? static_cast<int>(width * s.step / s.total_steps) : 0;
    os << "\r[" << std::string(filled, '#') << std::string(width - filled, '.') << "] ";
  } else {
    os << "[train] ";
  }
  os << "step " << s.step << "/" << s.total_steps << " ep " << s.epoch + 1;
  os.precision(2);
  os << " " << rate << " it/s ETA " << clock_text(eta);
  os.precision(4);
  os << " loss " << s.loss;
  os << std::scientific;
  os.precision(2);
  os << " lr " << s.lr;
  std::string line = os.str();
  if (bar_ && tty_) {
    std::cout << line << "\033[K" << (final_line ? "\n" : "") << std::flush;
    dirty_ = !final_line;
  } else {
    std::cout << line << "\n" << std::flush;
  }
}

void ProgressBar::on_step_end(Trainer& t) {
  if (!t.is_main()) return;
  const auto& s = t.state();
  if (bar_ && tty_) {
    // Redraw at most 10 times a second.
    if (since_draw_.seconds() >= 0.1 || s.step == s.total_steps) {
      draw(t, false);
      since_draw_.reset();
    }
  } else if (s.step % t.config().log_every == 0 || s.step == s.total_steps) {
    draw(t, false);
  }
}

void ProgressBar::on_evaluate(Trainer& t) {
  if (!t.is_main()) return;
  if (dirty_) {
    std::cout << "\n";
    dirty_ = false;
  }
  const auto& m = t.state().metrics;
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(4);
  os << "[eval] step " << t.state().step << " epoch " << t.state().epoch + 1;
  for (const char* k : {"test_accuracy", "test_loss"}) {
    auto it = m.find(k);
    if (it != m.end()) os << " " << k << "=" << it->second;
  }
  os.precision(1);
  os << " elapsed " << t.elapsed_seconds() << "s";
  std::cout << os.str() << "\n" << std::flush;
}

void ProgressBar::on_train_end(Trainer& t) {
  if (!t.is_main()) return;
  if (dirty_) std::cout << "\n" << std::flush;
  dirty_ = false;
}

}  // namespace gz::train
