// In-memory snapshots of the training state, one folder per node (by default in /dev/shm, which
// outlives the worker processes), written atomically and in the background. LibTorch-free: a
// snapshot is a header and the bytes of a serialized archive (the Trainer fills them).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace gz::train {

/// @brief What a snapshot is of: checked before a snapshot is restored.
struct SnapshotHeader {
  int64_t step = 0;  ///< optimizer steps done when it was taken
  int64_t epoch = 0;
  int64_t world = 0;         ///< ranks of the job that wrote it
  uint64_t fingerprint = 0;  ///< hash of the config fields that shape the state (snapshot_fingerprint)
};

/// @brief Snapshots of one node under `dir`: snap-<step>.bin, the newest `keep` generations.
///
/// A snapshot is written to a temp file and renamed into place, so the newest complete one is
/// always readable, also after a SIGKILL in the middle of a write. A file carries its header, the
/// payload's size and a 64-bit hash of it: a truncated or damaged file is never restored.
class SnapshotStore {
 public:
  SnapshotStore(std::string dir, int keep);
  const std::string& dir() const { return dir_; }

  /// @brief Write one snapshot atomically, then delete all but the newest `keep`. Throws
  /// gz::SystemError naming the file.
  void write(const SnapshotHeader& header, const std::string& payload) const;
  /// @brief Steps of the complete snapshots here, newest first (headers checked, payloads not).
  std::vector<int64_t> steps() const;
  /// @brief The payload of the snapshot of `step`, after checking that it is of that step, of a
  /// job with this `fingerprint` (a snapshot of another config is refused: gz::InvalidArgument
  /// saying so) and whole (size, hash: gz::Error). `header` receives its header.
  std::string read(int64_t step, uint64_t fingerprint, SnapshotHeader* header = nullptr) const;
  /// @brief Remove the folder and every snapshot in it (the run ended).
  void remove_all() const;
  /// @brief Path of the snapshot of `step`.
  std::string path(int64_t step) const;

 private:
  std::string dir_;
  int keep_;
};

/// @brief One background thread that writes snapshots, at most one at a time: submit() waits for
/// the previous write, so the memory held is one payload besides the files.
class SnapshotWriter {
 public:
  explicit SnapshotWriter(const SnapshotStore& store);
  /// @brief Finishes the pending write (a snapshot taken is not dropped on an orderly exit).
  ~SnapshotWriter();
  SnapshotWriter(const SnapshotWriter&) = delete;
  SnapshotWriter& operator=(const SnapshotWriter&) = delete;

  /// @brief Queue a write; waits while the previous one runs. Rethrows a failed previous write.
  void submit(const SnapshotHeader& header, std::string payload);
  /// @brief Wait until nothing is pending; rethrows a failed write.
  void flush();

 private:
  void loop();
  void rethrow_locked();
  const SnapshotStore& store_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<std::pair<SnapshotHeader, std::string>> job_;
  bool busy_ = false, stop_ = false;
  std::string error_;
  std::thread thread_;
};

/// @brief FNV-1a over `text`: a hash that is the same in every build (config fingerprints).
uint64_t stable_hash(const std::string& text);

}  // namespace gz::train
