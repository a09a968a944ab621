// Horovod mode's stall inspector: tensors that some ranks submitted and others did not, and for how
// long. It warns once per tensor (naming it and the ranks that lack it), then raises this rank's
// stall flag, which every rank sees in the next exchange and fails on with the same report.
#pragma once

#include <string>
#include <vector>

#include "gz/core/deadline.h"
#include "torch/horovod/negotiation.h"

namespace gz::horovod {

class StallInspector {
 public:
  /// @brief `names`: the tensors in index order (kept by reference). Warn after `warning`, flag
  /// after `error`.
  StallInspector(const std::vector<std::string>& names, int rank, Duration warning, Duration error)
      : names_(names),
        rank_(rank),
        warning_(warning),
        error_(error),
        partial_(names.size(), 0),
        warned_(names.size(), 0),
        since_(names.size()) {}

  /// @brief Start of a step's loop.
  void start(Clock::time_point now) { last_progress_ = now; }
  /// @brief Tensors were reduced (a replayed group): the step is not stalled.
  void progressed(Clock::time_point now) { last_progress_ = now; }
  /// @brief After a negotiation cycle: track the tensors some ranks lack (warn past `warning`),
  /// and raise the flag once one stays partial past `error`, or when no tensor was agreed for
  /// `error` (tensors no rank submits, e.g. unused everywhere).
  void observe(const CycleReport& report, const std::vector<uint8_t>& done, bool agreed_any,
               Clock::time_point now);
  /// @brief The stall flag this rank publishes with its next exchange.
  bool flag() const { return flag_; }
  /// @brief Throws gz::TimeoutError naming the partial tensors and their missing ranks (or the
  /// tensors no rank submitted). Every rank saw the same flags, so every rank throws alike.
  [[noreturn]] void fail(const CycleReport& report, const std::vector<uint8_t>& done, int cycles) const;

 private:
  const std::vector<std::string>& names_;
  int rank_;
  Duration warning_, error_;
  std::vector<uint8_t> partial_, warned_;
  std::vector<Clock::time_point> since_;  // per tensor: first cycle it was partial in
  Clock::time_point last_progress_;
  bool flag_ = false;
};

}  // namespace gz::horovod
