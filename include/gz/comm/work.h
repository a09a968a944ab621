// Handle of an asynchronous collective (c10d's Work contract).
#pragma once

#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>

#include "gz/core/deadline.h"

namespace gz::comm {

/// @brief Completion handle. wait() returns when the op finished and rethrows its stored failure.
class Work {
 public:
  explicit Work(Duration default_timeout) : default_timeout_(default_timeout) {}
  /// @brief True once the op finished (successfully or not); never blocks.
  bool is_completed();
  /// @brief Block until completion; rethrows the op's failure. Throws gz::TimeoutError when the
  /// deadline passes first (the op itself keeps its own deadline and fails on its own).
  void wait(Deadline deadline);
  /// @brief wait() with the communicator's timeout.
  void wait() { wait(Deadline::after(default_timeout_)); }

  /// @brief Called by the executor.
  void finish(std::exception_ptr error);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  Duration default_timeout_;
};

using WorkPtr = std::shared_ptr<Work>;

}  // namespace gz::comm
