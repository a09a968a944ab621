// Disk checkpoints written on a background thread from a copy of the state.
#include "checkpoint_writer.h"

#include <torch/torch.h>

#include "gz/core/deadline.h"
#include "gz/core/error.h"
#include "gz/core/log.h"

namespace gz::train {

CheckpointWriter::~CheckpointWriter() {
  try {
    wait();
  } catch (const std::exception& e) {
    GZ_LOG(warn, e.what());
  } catch (...) {
    GZ_LOG(warn, "writing checkpoint ", dir_, " in the background failed");
  }
}

void CheckpointWriter::wait() {
  if (thread_.joinable()) thread_.join();
  if (!error_) return;
  std::exception_ptr error;
  std::swap(error, error_);  // reported once
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    GZ_THROW(Error, "writing checkpoint ", dir_, " in the background failed: ", e.what());
  } catch (...) {
    GZ_THROW(Error, "writing checkpoint ", dir_, " in the background failed (an unknown exception)");
  }
}

std::string CheckpointWriter::start(const TrainingState& live, int64_t step, int64_t epoch,
                                    std::map<std::string, double> metrics, bool defer_copy) {
  if (thread_.joinable()) GZ_THROW(Error, "CheckpointWriter::start() while a write is in flight");
  if (defer_copy)
    capture_.capture_deferred(live, checkpoints_.test_hooks().in_state_copy);
  else
    capture_.capture(live);
  dir_ = checkpoints_.path_of(step);
  thread_ = std::thread([this, step, epoch, metrics = std::move(metrics)] { write(step, epoch, metrics); });
  return dir_;
}

void CheckpointWriter::write(int64_t step, int64_t epoch, const std::map<std::string, double>& metrics) {
  Stopwatch clock;
  try {
    if (const auto& hook = checkpoints_.test_hooks().in_background_write) hook(dir_);
    if (auto copy_failed = capture_.wait_copied()) std::rethrow_exception(copy_failed);
    torch::serialize::OutputArchive root;
    write_training_state(capture_.state(), root);
    checkpoints_.save(root, step, epoch, metrics);
  } catch (...) {
    error_ = std::current_exception();
  }
  seconds_ += clock.seconds();
  ++writes_;
}

}  // namespace gz::train
