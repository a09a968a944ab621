#include "gz/comm/work.h"

#include "gz/core/error.h"

namespace gz::comm {

bool Work::is_completed() {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void Work::wait(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  Stopwatch sw;
  if (!cv_.wait_until(lock, deadline.at(), [&] { return done_; }))
    GZ_THROW(TimeoutError, "Work::wait: asynchronous op not finished after ", format_duration(sw.elapsed()),
             " (its own deadline is ",
             op_deadline_.expired() ? std::string("past") : "in " + format_duration(op_deadline_.remaining()), ")");
  if (error_) std::rethrow_exception(error_);
}

void Work::wait() { wait(Deadline(op_deadline_.at() + kGrace)); }

void Work::wait_finished() noexcept {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
}

void Work::finish(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::move(error);
    done_ = true;
  }
  cv_.notify_all();
}

}  // namespace gz::comm
