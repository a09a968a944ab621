// In-memory snapshots of the training state, one folder per node (by default in /dev/shm, which
// outlives the worker processes), written atomically and in the background. LibTorch-free: a
// snapshot is a header and the bytes of a serialized archive (the Trainer makes them).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gz/core/env.h"

namespace gz::train {

/// @brief What a snapshot is of: checked before a snapshot is restored.
struct SnapshotHeader {
  int64_t step = 0;  ///< optimizer steps done when it was taken
  int64_t epoch = 0;
  int64_t world = 0;         ///< ranks of the job that wrote it
  uint64_t fingerprint = 0;  ///< hash of the config fields that shape the state (snapshot_fingerprint)
  uint64_t run = 0;          ///< stable_hash of the run's id (the store's, set when written)
  int64_t rank = -1;         ///< whose shard (zero_stage > 0), -1: the whole state (the store's)
};

/// @brief Snapshots of one run on one node under `dir`: snap-<step>-<run>.bin, the newest `keep`
/// generations; a store of rank r's shards (zero_stage > 0, `owner` r) snap-<step>-<run>-r<r>.bin.
///
/// A snapshot is written to a temp file and renamed into place, so the newest complete one is
/// always readable, also after a SIGKILL in the middle of a write. A file carries its header, the
/// payload's size and a 64-bit hash of it: a truncated or damaged file is never restored. Only
/// the snapshots of this store's run are listed and read: another run's (a finished or failed
/// job in the same work_dir) are never restored. A run that holds its run lock
/// (hold_run_lock(), run-<run>.lock here) is alive: no other run removes its snapshots.
class SnapshotStore {
 public:
  /// @brief `run`: stable_hash() of the run's id (snapshot_run_id()), the same on every rank and
  /// across the launcher's restarts of the run.
  /// `owner`: the rank whose shard state this store holds (its own, or a buddy's copy); -1: the
  /// whole state (zero_stage 0).
  SnapshotStore(std::string dir, int keep, uint64_t run, int owner = -1);
  const std::string& dir() const { return dir_; }

  /// @brief Write one snapshot atomically, then delete all but the newest `keep`. Throws
  /// gz::SystemError naming the file.
  void write(const SnapshotHeader& header, const std::string& payload) const;
  /// @brief Steps of this run's complete snapshots here, newest first (headers checked, payloads
  /// not).
  std::vector<int64_t> steps() const;
  /// @brief The payload of the snapshot of `step`, after checking that it is of that step, of a
  /// job with this `fingerprint` (a snapshot of another config is refused: gz::InvalidArgument
  /// saying so) and whole (size, hash: gz::Error). `header` receives its header.
  std::string read(int64_t step, uint64_t fingerprint, SnapshotHeader* header = nullptr) const;
  /// @brief The header of this store's snapshot of `step` (payload not checked); none when it is
  /// missing or not a snapshot.
  std::optional<SnapshotHeader> header(int64_t step) const;
  /// @brief Remove this run's snapshot files (a run that did not restore one starts clean).
  void remove_snapshots() const;
  /// @brief Remove this run's snapshots and run lock, and the folder when nothing else is left in
  /// it (the run ended).
  void remove_all();
  /// @brief Mark this run alive for as long as this store (or a copy) exists: a shared flock on
  /// run-<run>.lock, which every process of the run may hold. Creates the folder. Throws
  /// gz::SystemError / gz::Error when the folder cannot be made or is not private.
  void hold_run_lock();
  /// @brief Delete the snapshot files here that are not this run's (another run's, or not
  /// readable as a snapshot), except those of a run that holds its run lock; returns how many.
  /// Between two restarts of a run no process holds its lock: a new run started in that window
  /// removes the restarting run's snapshots (that run then resumes from its disk checkpoint).
  int remove_other_runs() const;
  /// @brief Delete this run's shard files here written by a world of another size than `world`,
  /// whoever's copy (a world restores them once, resharded, and never again); returns how many.
  /// Temp files of writes in flight are left alone.
  int remove_other_worlds(int world) const;
  /// @brief Headers of this run's shard files here, whoever's (rank) and of whatever world
  /// (headers checked, payloads not): what a world of another size may restore.
  std::vector<SnapshotHeader> shard_headers() const;
  /// @brief Path of this run's snapshot of `step`.
  std::string path(int64_t step) const;
  uint64_t run() const { return run_; }
  int owner() const { return owner_; }

 private:
  std::string dir_;
  int keep_;
  uint64_t run_;
  int owner_;
  std::shared_ptr<const int> run_lock_;  // the locked descriptor, closed with the last copy
};

/// @brief One background thread that writes snapshots in order: one write runs while at most one
/// more waits. A write's payload may be built on that thread (submit with a function), so the
/// caller's thread only hands over what the payload is made from.
class SnapshotWriter {
 public:
  /// @brief Appends a payload to `out` on the writer's thread. `out` arrives empty, with the
  /// capacity of the last payload: the writer keeps its buffer, so a payload of the same size
  /// neither grows nor page-faults its way into fresh memory.
  using PayloadFn = std::function<void(std::string& out)>;

  explicit SnapshotWriter(const SnapshotStore& store);
  /// @brief Finishes the pending writes (a snapshot taken is not dropped on an orderly exit).
  ~SnapshotWriter();
  SnapshotWriter(const SnapshotWriter&) = delete;
  SnapshotWriter& operator=(const SnapshotWriter&) = delete;

  /// @brief Queue a write of `payload` (bytes already made on the caller's thread): waits until
  /// no write is waiting or running, and the writer frees the bytes after writing them, so at
  /// most two payloads exist at a time (the fallback for state it cannot capture: a GPU model's
  /// payload may be large). Rethrows a failed previous write.
  void submit(const SnapshotHeader& header, std::string payload);
  /// @brief Queue a write whose payload `make_payload` builds when the writer's thread gets to it
  /// (a throw fails that write); waits while another write is already waiting (not while one
  /// runs). Rethrows a failed previous write, and then does not queue this one.
  void submit(const SnapshotHeader& header, PayloadFn make_payload);
  /// @brief Wait until nothing is pending; rethrows a failed write.
  void flush();
  /// @brief Seconds the writer's thread spent on writes (building payloads included), and how many.
  std::pair<double, int64_t> work() const;

 private:
  struct Job {
    SnapshotHeader header;
    PayloadFn make;
    bool keep_buffer;  ///< reuse the payload's buffer for the next write (built payloads)
  };
  void loop();
  void rethrow_locked();
  const SnapshotStore& store_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Job> job_;  // the waiting one
  bool busy_ = false, stop_ = false;
  std::string error_;
  std::string payload_;  // the writer thread's, reused from one write to the next
  double seconds_ = 0;
  int64_t writes_ = 0;
  std::thread thread_;
};

/// @brief FNV-1a over `text`: a hash that is the same in every build (config fingerprints).
uint64_t stable_hash(const std::string& text);

/// @brief The id of this run that its launcher keeps across restarts: gzrun's GZ_RUN_ID without
/// its "-<GZ_RESTART_COUNT>" round ("<pid>.<random>" of node 0's gzrun), else torchrun's
/// TORCHELASTIC_RUN_ID unless it is torchrun's default "none"; empty without a launcher.
std::string snapshot_run_id(const Env& env);

}  // namespace gz::train
