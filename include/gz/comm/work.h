// Handle of an asynchronous op (c10d's Work contract).
#pragma once

#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>

#include "gz/core/deadline.h"

namespace gz::comm {

/// @brief Completion handle of an asynchronous op.
///
/// The op carries its own deadline (OpOptions) and fails on its own when that passes; abort() of
/// its communicator completes it with gz::Aborted, queued or running. A Work is finished only once
/// the op has stopped touching its buffers, so an owner that waits for finished() may free them.
class Work {
 public:
  /// @brief Slack wait() gives the op past its own deadline, so the op's own, more precise error
  /// (which peer, which step) normally wins over "Work::wait gave up".
  static constexpr Duration kGrace{2000};

  explicit Work(Deadline op_deadline) : op_deadline_(op_deadline) {}
  /// @brief True once the op finished (successfully or not); never blocks.
  bool is_completed();
  /// @brief Block until completion and rethrow the op's failure. Throws gz::TimeoutError when
  /// `deadline` passes first; the op may then still be running (see wait_finished()).
  void wait(Deadline deadline);
  /// @brief wait() until the op's own deadline plus kGrace.
  void wait();
  /// @brief Block until the op has returned, however it ended; never throws. Bounded by the op's
  /// own deadline (every backend honours it) or by an abort() of its communicator. Owners call it
  /// before freeing what the op uses.
  void wait_finished() noexcept;
  /// @brief The op's deadline, fixed when it was issued.
  Deadline op_deadline() const { return op_deadline_; }

  /// @brief Called once by the communicator when the op returned (error = null on success).
  void finish(std::exception_ptr error);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  Deadline op_deadline_;
};

using WorkPtr = std::shared_ptr<Work>;

}  // namespace gz::comm
