// The Trainer's in-memory snapshots: taken after a step (one writer per node), restored after a
// restart when every rank can get the newest one (its node's file or a peer's copy over the
// group), else the disk checkpoint.
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <random>

#include "../trainer_impl.h"
#include "gz/core/env.h"
#include "gz/core/error.h"
#include "gz/core/log.h"
#include "gz/core/phase.h"
#include "gz/torch/process_group.h"
#include "gz/train/recovery/chunked_broadcast.h"
#include "gz/train/recovery/snapshot_store.h"

namespace gz::train {

namespace fs = std::filesystem;

namespace {

// Collective: the run's id (snapshot_run_id(), else one rank 0 draws for this launch alone).
std::string snapshot_run(const comm::CommPtr& group, int rank) {
  std::string run = snapshot_run_id(Env::from_process());
  if (!run.empty()) return run;
  // Nothing relaunches this job as the same run: a snapshot it finds is another run's, and its
  // own serve no later process.
  std::random_device rd;
  int64_t id = rank == 0 ? static_cast<int64_t>((uint64_t{rd()} << 32) ^ rd()) : 0;
  if (group && group->size() > 1) group->broadcast(&id, 1, DType::i64, 0);
  if (rank == 0)
    GZ_LOG(info,
           "snapshots: no launcher run id (GZ_RUN_ID, TORCHELASTIC_RUN_ID): a relaunch is a new "
           "run and does not restore this one's");
  return detail::concat("local#", id);
}

void append_archive(torch::serialize::OutputArchive& archive, std::string& out) {
  archive.save_to([&out](const void* p, size_t n) {
    out.append(static_cast<const char*>(p), n);
    return n;
  });
}

}  // namespace

uint64_t Trainer::snapshot_fingerprint() const {
  const auto& c = config_;
  // What shapes the state and its trajectory; not the world or the per-rank batch, which an
  // elastic round may change (the snapshot is re-sharded like a disk checkpoint).
  return stable_hash(detail::concat(c.net_type, '|', c.num_classes, '|', c.in_channels, '|', c.input_size,
                                    '|', c.optimizer, '|', c.dataset, '|', c.train_data, '|', c.train_limit,
                                    '|', c.seed, '|', c.mixed_precision, '|', c.mode, '|', c.elastic_batch,
                                    '|', c.zero_stage, '|', c.global_batch_size, '|', c.dropout));
}

void Trainer::setup_snapshots() {
  const auto& c = config_;
  check_in_place_recovery();  // what in-place recovery restores are these snapshots
  if (c.snapshot_every <= 0) return;
  std::string dir = c.snapshot_dir;
  if (dir.empty()) {
    std::error_code ec;
    const std::string work = fs::absolute(c.work_dir, ec).lexically_normal().string();
    char name[24];
    std::snprintf(name, sizeof name, "%016llx", static_cast<unsigned long long>(stable_hash(work)));
    dir = detail::concat("/dev/shm/gz-snapshots-", ::getuid(), "/", name);
  }
  const std::string run = snapshot_run(group_, rank_), job = run.substr(0, run.find('#'));
  // A ZeRO rank's parameters (stage 3) and optimizer state are its own shard: every rank writes
  // its own, with a copy on another node (shard_snapshot.cpp).
  if (c.zero_stage > 0) return setup_shard_snapshots(dir, run);
  impl_->snapshots = std::make_unique<SnapshotStore>(dir, 2, stable_hash(run));
  // In ddp/horovod/dp every rank holds the same model and optimizer state after a step, so one
  // copy per node is enough and every other node holds the same one: losing a node loses none.
  const int local = gz::is_initialized() ? gz::local_rank() : rank_;
  if (local != 0) return;
  try {
    impl_->snapshots->hold_run_lock();  // another job sharing the folder leaves our files alone
  } catch (const std::exception& e) {
    GZ_LOG(warn, "rank ", rank_, ": ", e.what(), "; snapshots are off for this run");
    return;
  }
  // One capture: a snapshot waits until the writer has built the last one's archive (measured:
  // docs/benchmarks.md); GZ_SNAPSHOT_CAPTURES=2 lets it lag one behind, at twice the memory.
  const auto captures = Env::from_process().get_int("GZ_SNAPSHOT_CAPTURES", 1);
  impl_->snapshot_captures =
      std::make_unique<CaptureRing>(static_cast<int>(std::clamp<long long>(captures, 1, 4)));
  impl_->snapshot_writer = std::make_unique<SnapshotWriter>(*impl_->snapshots);
  if (const int n = impl_->snapshots->remove_other_runs(); n > 0)
    GZ_LOG(warn, "rank ", rank_, ": removed ", n, " snapshot file(s) of another run from ", dir,
           ": this run (", job, ") does not restore them");
}

void Trainer::take_snapshot() {
  // The training thread's share of a snapshot (a copy, else the archive) is this rank's own time,
  // not training: the straggler report must not charge it to the node's local rank 0 as an
  // unexplained delay.
  if (impl_->shard_snapshots) return take_shard_snapshot();
  gz::ScopedPhase phase(gz::Phase::checkpoint);
  Stopwatch clock;
  const SnapshotHeader h{state_.step, state_.epoch, world_, snapshot_fingerprint()};
  try {
    const TrainingState live = live_state();
    const std::string why = StateCapture::unsupported(live);
    if (why.empty()) {
      submit_capture(live, h);
    } else {
      if (!impl_->snapshot_fallback_logged)
        GZ_LOG(info, "rank ", rank_, ": snapshots of ", why, " are serialized on the training thread");
      impl_->snapshot_fallback_logged = true;
      torch::serialize::OutputArchive root;
      write_training_state(live, root);
      std::string bytes;
      append_archive(root, bytes);
      impl_->snapshot_writer->submit(h, std::move(bytes));
    }
  } catch (const std::exception& e) {
    // A full /dev/shm (64 MB in a default container) must not end training on this rank while
    // its peers wait in the next collective: without snapshots, restarts use disk checkpoints.
    GZ_LOG(warn, "rank ", rank_, ": ", e.what(), "; snapshots are off for the rest of this run");
    impl_->snapshot_writer.reset();
    return;
  }
  impl_->snapshot_seconds += clock.seconds();
  ++impl_->snapshots_taken;
}

void Trainer::submit_capture(const TrainingState& live, const SnapshotHeader& header) {
  CaptureRing& ring = *impl_->snapshot_captures;
  Stopwatch waiting;
  StateCapture& capture = ring.acquire();  // waits while the writer still reads it
  impl_->snapshot_wait_seconds += waiting.seconds();
  try {
    // The bulk is copied alongside the next step's forward and backward (finish_state_copies()).
    if (impl_->defer_state_copy) {
      capture.capture_deferred(live, impl_->checkpoints->test_hooks().in_state_copy);
      impl_->snapshot_copying = &capture;
    } else {
      capture.capture(live);
    }
    waiting = Stopwatch();
    impl_->snapshot_writer->submit(header, [&ring, &capture](std::string& out) {
      // Released once the archive is built, also when building it failed.
      std::unique_ptr<StateCapture, std::function<void(StateCapture*)>> release(
          &capture, [&ring](StateCapture* c) { ring.release(*c); });
      if (auto copy_failed = capture.wait_copied()) std::rethrow_exception(copy_failed);
      torch::serialize::OutputArchive root;
      write_training_state(capture.state(), root);
      append_archive(root, out);
    });
    impl_->snapshot_wait_seconds += waiting.seconds();  // while another write was queued
  } catch (...) {
    ring.release(capture);  // not queued
    throw;
  }
}

void Trainer::finish_snapshots(bool completed) {
  try {
    wait_shard_exchange();  // zero_stage > 0: the last shard's copy to its buddy
  } catch (const std::exception& e) {
    GZ_LOG(warn, "rank ", rank_, ": the last shard snapshot's exchange failed: ", e.what());
  }
  if (!impl_->snapshot_writer) return;
  for (auto* writer : {impl_->held_writer.get(), impl_->snapshot_writer.get()}) {
    if (!writer) continue;
    try {
      writer->flush();
    } catch (const std::exception& e) {
      GZ_LOG(warn, "rank ", rank_, ": ", e.what());
    }
  }
  if (completed) {  // the run is done: free the node's memory
    if (impl_->held_snapshots) impl_->held_snapshots->remove_snapshots();
    impl_->snapshots->remove_all();
  }
  if (is_main() && impl_->snapshots_taken > 0) {
    const auto [writer_seconds, writes] = impl_->snapshot_writer->work();
    const double n = static_cast<double>(impl_->snapshots_taken);
    GZ_LOG(info, "snapshots: ", impl_->snapshots_taken, " taken in ", impl_->snapshot_seconds,
           " s on the training thread (", 1e3 * impl_->snapshot_seconds / n, " ms each, ",
           1e3 * impl_->snapshot_wait_seconds / n, " of it waiting for the writer); the writer thread: ",
           1e3 * writer_seconds / static_cast<double>(std::max<int64_t>(1, writes)),
           " ms per write (archive, hash, file)",
           impl_->shard_snapshots
               ? detail::concat("; the exchange's thread (zero_stage ", config_.zero_stage,
                                ": serializing the shard, the buddy copy): ",
                                1e-6 * static_cast<double>(impl_->shard_exchange_ns) / n, " ms per snapshot")
               : std::string());
  }
}

bool Trainer::every_rank_read(bool ok, const std::string& error, const std::string& what) {
  std::vector<double> failed{ok ? 0.0 : 1.0};
  allreduce_sum(failed);
  if (failed[0] == 0) return true;
  if (!ok) GZ_LOG(warn, "rank ", rank_, ": ", error);
  if (is_main())
    GZ_LOG(warn, what, " could not be read on ", failed[0], " rank(s): using the disk checkpoint");
  return false;
}

std::optional<std::string> Trainer::read_snapshot(int64_t step, int source, bool all_hold, bool lacks) {
  std::string payload, message;
  bool ok = true;
  if (all_hold || rank_ == source) {
    try {
      payload = impl_->snapshots->read(step, snapshot_fingerprint());
    } catch (const std::exception& e) {
      ok = false;
      message = e.what();
    }
  }
  if (!every_rank_read(ok, message, "the snapshot of step " + std::to_string(step))) return std::nullopt;
  // To the ranks whose node lost it, in chunks: one op for gigabytes could outlast its deadline.
  if (!all_hold && group_) {
    // One line per node that lacked it (its local rank 0): the rate its link gave the transfer.
    const bool says = lacks && (gz::is_initialized() ? gz::local_rank() : rank_) == 0;
    Stopwatch clock;  // after the all-reduce above: the source has read its file
    broadcast_bytes(*group_, payload, source);
    if (says) {
      const double seconds = clock.seconds(), mb = static_cast<double>(payload.size()) / 1e6;
      GZ_LOG(info, "received the snapshot of step ", step, " (", mb, " MB) from rank ", source, " in ",
             seconds, " s: ", mb / std::max(seconds, 1e-9), " MB/s");
    }
  }
  return payload;
}

int64_t Trainer::disk_checkpoint_step(int64_t snapshot_step) {
  int64_t disk = -1;
  if (is_main())
    if (auto latest = impl_->checkpoints->latest()) disk = latest->step;
  disk = broadcast_value(disk);
  if (disk > snapshot_step && is_main())
    GZ_LOG(info, "the disk checkpoint of step ", disk, " is newer than the snapshot of step ", snapshot_step);
  return disk;
}

bool Trainer::restore_snapshot() {
  if (impl_->shard_snapshots) {
    return restore_shard_snapshot();  // removes the files of other world sizes
  }
  Stopwatch clock;
  const auto held = impl_->snapshots->steps();
  const int64_t mine = held.empty() ? -1 : held.front();
  // Every rank's newest step (+1, 0 = none), summed into its own slot.
  std::vector<double> newest(static_cast<size_t>(world_), 0.0);
  newest[static_cast<size_t>(rank_)] = static_cast<double>(mine + 1);
  allreduce_sum(newest);
  int64_t step = -1;
  for (double v : newest) step = std::max(step, static_cast<int64_t>(v) - 1);
  if (step < 0) return false;
  int source = -1, holders = 0;
  for (int r = 0; r < world_; ++r)
    if (static_cast<int64_t>(newest[static_cast<size_t>(r)]) - 1 == step) {
      if (source < 0) source = r;
      ++holders;
    }
  const int64_t disk = disk_checkpoint_step(step);
  if (disk > step) return false;
  // `step` is the newest any rank holds, so a rank holds it exactly when it is its own newest.
  auto payload = read_snapshot(step, source, holders == world_, mine != step);
  if (!payload) return false;
  std::exception_ptr error;
  const std::string name = detail::concat("snapshot of step ", step, " (", impl_->snapshots->path(step), ")");
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(payload->data(), payload->size());
    CheckpointInfo info;
    info.dir = impl_->snapshots->dir();
    info.step = step;
    apply_checkpoint(archive, info, name);
  } catch (...) {
    error = std::current_exception();
  }
  agree(error, "restoring the " + name);
  if (is_main())
    GZ_LOG(info, "restored the ", name, " in ", clock.seconds(), " s: held by ", holders, " of ", world_,
           " rank(s)", holders == world_ ? "" : detail::concat(", sent by rank ", source),
           "; disk checkpoint: ", disk < 0 ? std::string("none") : std::to_string(disk));
  return true;
}

}  // namespace gz::train
