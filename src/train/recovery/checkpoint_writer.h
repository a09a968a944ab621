// Disk checkpoints written in the background (config key async_checkpoint): the training thread
// copies the state into reused host buffers (StateCapture, the snapshots' copy) and goes on; a
// thread of the writer builds the archive from the copy and writes it through CheckpointManager
// (docs/reliability.md, "Disk checkpoints in the background").
#pragma once

#include <cstdint>
#include <exception>
#include <map>
#include <string>
#include <thread>

#include "gz/train/checkpoint.h"
#include "state_capture.h"

namespace gz::train {

/// @brief Writes disk checkpoints from one StateCapture, one write at a time, each on a thread
/// of its own, with CheckpointManager::save()'s atomicity (temp dir, fsync, rename): a crash in
/// the middle of a write leaves the previous checkpoint complete, and resume: auto never sees a
/// partial one.
///
/// A failed write is kept and thrown by the next wait() (the next save's start, or the end of
/// training), naming the checkpoint: it is never lost.
class CheckpointWriter {
 public:
  explicit CheckpointWriter(CheckpointManager& checkpoints) : checkpoints_(checkpoints) {}
  /// @brief Waits for the write in flight (an exception left train(): the write still ends); a
  /// failure not yet reported is logged as a warning.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  /// @brief Wait until no write is in flight. Throws gz::Error naming the checkpoint when that
  /// write failed (once).
  void wait();
  /// @brief Copy `live` into the capture and start writing the copy as the checkpoint of `step`.
  /// With `defer_copy` the parameters and optimizer state are copied in the background
  /// (StateCapture::capture_deferred()): call wait_copied() before changing them. Call wait()
  /// first: the capture is the one the last write read. Returns the directory the checkpoint
  /// will have once written.
  std::string start(const TrainingState& live, int64_t step, int64_t epoch,
                    std::map<std::string, double> metrics, bool defer_copy = true);
  /// @brief The capture start() copies into: its wait_copied() returns once the last start()'s
  /// copy of the live state is done (a failed copy fails the write, reported by wait()).
  StateCapture& capture() { return capture_; }
  /// @brief Seconds spent writing on the background threads, and how many writes (read them
  /// after wait()).
  double write_seconds() const { return seconds_; }
  int64_t writes() const { return writes_; }

 private:
  void write(int64_t step, int64_t epoch, const std::map<std::string, double>& metrics);
  CheckpointManager& checkpoints_;
  StateCapture capture_;
  std::thread thread_;
  std::exception_ptr error_;  // of the last write, until wait() reports it
  std::string dir_;           // the last write's checkpoint
  double seconds_ = 0;        // written by the write's thread, read after its join
  int64_t writes_ = 0;
};

}  // namespace gz::train
