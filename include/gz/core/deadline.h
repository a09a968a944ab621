// Deadlines: every blocking call in Guozhuang takes one. Never infinite by default.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace gz {

using Clock = std::chrono::steady_clock;
using Duration = std::chrono::milliseconds;

/// @brief Default timeout for blocking calls: GZ_TIMEOUT_S from the environment, else 300 s.
Duration default_timeout();

/// @brief A point in time after which a blocking call gives up with gz::TimeoutError.
class Deadline {
 public:
  /// @brief A deadline `d` from now.
  static Deadline after(Duration d) { return Deadline(Clock::now() + d); }
  /// @brief A deadline default_timeout() from now.
  static Deadline from_default() { return after(default_timeout()); }
  explicit Deadline(Clock::time_point at) : at_(at) {}

  Clock::time_point at() const { return at_; }
  bool expired() const { return Clock::now() >= at_; }
  /// @brief Time left, clamped at zero.
  Duration remaining() const;
  /// @brief Milliseconds left clamped to [0, INT32_MAX], for poll() and friends.
  int remaining_ms() const;

 private:
  Clock::time_point at_;
};

/// @brief Measures elapsed time for error messages ("after 1203 ms").
class Stopwatch {
 public:
  Stopwatch() : start_(Clock::now()) {}
  Duration elapsed() const { return std::chrono::duration_cast<Duration>(Clock::now() - start_); }
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  void reset() { start_ = Clock::now(); }

 private:
  Clock::time_point start_;
};

/// @brief "1.2 s" / "350 ms" for messages.
std::string format_duration(Duration d);

}  // namespace gz
