// In-memory snapshots at zero_stage > 0: every rank's own shard, with a copy on a buddy rank on
// another node. Rank r's shard (its block of the parameters and optimizer state, in its sharded
// checkpoint file's format, plus what every rank holds alike: buffers, counters, RNG, scaler) is
// written to its node's snapshot folder and sent point-to-point to rank (r + ranks per node) %
// world, the same local rank of the next node (a ring over nodes), which writes it as "held for
// r". Losing any one node then loses no shard. The restore picks the newest step for which every
// rank's shard is on some node, and each shard goes to its rank from its own file or its buddy.
#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <set>

#include "../trainer_impl.h"
#include "gz/core/deadline.h"
#include "gz/core/error.h"
#include "gz/core/log.h"
#include "gz/core/phase.h"
#include "gz/torch/collectives.h"
#include "gz/torch/process_group.h"
#include "gz/train/recovery/chunked_broadcast.h"
#include "gz/train/recovery/snapshot_store.h"

namespace gz::train {

namespace {

constexpr int kShardGenerations = 2;     // per store: this rank's shard, and the buddy's copy
constexpr size_t kShardStepsListed = 4;  // steps per store a rank reports at a restore (>= kShardGenerations)

// The payload: the rest's archive size (8 bytes), the rest (a state.pt of what the shards do not
// hold, and the names of the parameters they do), then the shard's bytes.
std::string frame_shard_payload(const std::string& rest, const std::string& shard) {
  std::string out(sizeof(uint64_t), '\0');
  const uint64_t n = rest.size();
  std::memcpy(out.data(), &n, sizeof n);
  out.reserve(out.size() + rest.size() + shard.size());
  out += rest;
  out += shard;
  return out;
}

std::pair<std::string, std::string> unframe_shard_payload(const std::string& payload,
                                                          const std::string& name) {
  uint64_t n = 0;
  if (payload.size() >= sizeof n) std::memcpy(&n, payload.data(), sizeof n);
  if (payload.size() < sizeof n || n > payload.size() - sizeof n)
    GZ_THROW(Error, name, " is not a shard snapshot (its sizes do not add up)");
  return {payload.substr(sizeof n, n), payload.substr(sizeof n + n)};
}

std::string join_lines(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += n + '\n';
  return out;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> out;
  for (size_t at = 0, nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1)
    out.push_back(text.substr(at, nl - at));
  return out;
}

// Which steps of which rank's shard each node holds, merged over the ranks (each fills its own
// cells). Row q: the steps (+1; 0 = none) q's own folder holds, then those q's buddy holds for q
// (files of this world size only: another's are restore_resharded_snapshot()'s).
struct ShardTable {
  static constexpr size_t kOwn = 0, kBuddy = kShardStepsListed, kRow = 2 * kShardStepsListed;
  explicit ShardTable(int world) : world(world), cells(static_cast<size_t>(world) * kRow, 0.0) {}
  double& cell(int q, size_t i) { return cells[static_cast<size_t>(q) * kRow + i]; }
  double cell(int q, size_t i) const { return cells[static_cast<size_t>(q) * kRow + i]; }

  void list(const SnapshotStore* store, int owner, size_t column, int this_world) {
    if (!store) return;
    size_t i = 0;
    for (int64_t step : store->steps()) {
      const auto h = store->header(step);
      if (h && h->world == this_world && i < kShardStepsListed)
        cell(owner, column + i++) = static_cast<double>(step + 1);
    }
  }
  // Collective: every rank's cells (a step's cell has one writer: the rank, or its buddy).
  void merge(const comm::CommPtr& group) {
    if (!group || world == 1) return;
    auto t = torch::from_blob(cells.data(), {static_cast<int64_t>(cells.size())}, torch::kFloat64);
    gz::allreduce(t, comm::ReduceOp::max, group);
  }
  bool holds(int q, size_t column, int64_t step) const {
    for (size_t i = 0; i < kShardStepsListed; ++i)
      if (static_cast<int64_t>(cell(q, column + i)) - 1 == step) return true;
    return false;
  }
  std::vector<int64_t> steps() const {  // every step listed, newest first
    std::vector<int64_t> out;
    for (int q = 0; q < world; ++q)
      for (size_t i = 0; i < kRow; ++i)
        if (const auto v = static_cast<int64_t>(cell(q, i)); v > 0) out.push_back(v - 1);
    std::sort(out.rbegin(), out.rend());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }
  std::vector<int> missing(int64_t step) const {  // ranks whose shard of `step` no node holds
    std::vector<int> out;
    for (int q = 0; q < world; ++q)
      if (!holds(q, kOwn, step) && !holds(q, kBuddy, step)) out.push_back(q);
    return out;
  }
  int world;
  std::vector<double> cells;
};

// Node index parity: even nodes send first in a ring of exchanges (exchange_bytes()).
bool shard_sends_first(int rank, int per_node) { return (rank / per_node) % 2 == 0; }

}  // namespace

// On the exchange group's progress thread: this rank's payload to its writer first (its own copy
// does not depend on a peer), then to its buddy; the buddy's from the previous node to the other
// writer. A failed write turns that writer off for the run.
void Trainer::exchange_shard_snapshot(Impl& im, const SnapshotHeader& h, int rank, std::string payload) {
  Stopwatch clock;
  auto write = [&](SnapshotWriter* writer, std::atomic<bool>& off, SnapshotWriter::PayloadFn bytes) {
    if (!writer || off) return;
    try {
      writer->submit(h, std::move(bytes));  // waits while this writer's previous one still waits
    } catch (const std::exception& e) {
      off = true;
      GZ_LOG(warn, "rank ", rank, ": ", e.what(), "; its snapshots are off for the rest of this run");
    }
  };
  // Shared with the writer, which copies it into its own buffer while the exchange sends it.
  const auto mine = std::make_shared<const std::string>(std::move(payload));
  if (!mine->empty())
    write(im.snapshot_writer.get(), im.own_writes_off, [mine](std::string& out) { out = *mine; });
  if (im.buddy_to >= 0) {
    auto held = std::make_shared<std::string>(exchange_bytes(*im.snapshot_comm, mine.get(), im.buddy_to,
                                                             im.buddy_from,
                                                             shard_sends_first(rank, im.shard_per_node)));
    if (!held->empty())
      write(im.held_writer.get(), im.held_writes_off, [held](std::string& out) { out.swap(*held); });
  }
  im.shard_exchange_ns += static_cast<int64_t>(clock.seconds() * 1e9);
}

void Trainer::setup_shard_snapshots(const std::string& dir, const std::string& run) {
  impl_->shard_snapshots = true;  // on every rank alike: the buddy exchange is collective
  start_shard_snapshots(dir, stable_hash(run));
}

// The one rule for setup and for an in-place recovery's new group (its rank, world and nodes):
// the stores of this rank's shard and of its buddy's copy, the exchange group, the writers.
void Trainer::start_shard_snapshots(const std::string& dir, uint64_t run) {
  auto& im = *impl_;
  int per_node = im.snapshot_local_world > 0 ? im.snapshot_local_world
                                             : (gz::is_initialized() ? gz::local_size() : world_);
  per_node = std::clamp(per_node, 1, world_);
  im.shard_per_node = per_node;
  im.buddy_to = im.buddy_from = -1;
  im.held_writer.reset();  // none after stop_shard_snapshots(); a writer goes before its store
  im.snapshot_writer.reset();
  im.held_snapshots.reset();
  auto own = std::make_unique<SnapshotStore>(dir, kShardGenerations, run, rank_);
  if (per_node < world_ && world_ % per_node == 0) {
    im.buddy_to = (rank_ + per_node) % world_;
    im.buddy_from = (rank_ - per_node + world_) % world_;
    im.held_snapshots = std::make_unique<SnapshotStore>(dir, kShardGenerations, run, im.buddy_from);
  } else if (is_main()) {
    GZ_LOG(warn, "zero_stage ", config_.zero_stage,
           " snapshots: ", per_node < world_ ? "nodes of unequal rank counts" : "one node",
           ": each rank's shard is kept on its own node only (losing the node loses the snapshot)");
  }
  if (group_ && world_ > 1) {  // collective: before anything that may end this setup early
    std::vector<int> all(static_cast<size_t>(world_));
    std::iota(all.begin(), all.end(), 0);
    im.snapshot_comm = group_->new_group(all);
  }
  try {
    own->hold_run_lock();  // every rank of the run: another job leaves our files alone
  } catch (const std::exception& e) {
    im.snapshots = std::move(own);
    GZ_LOG(warn, "rank ", rank_, ": ", e.what(), "; this rank writes no snapshots");
    return;
  }
  im.snapshots = std::move(own);  // the last store's run lock is released after this one's is held
  im.snapshot_writer = std::make_unique<SnapshotWriter>(*im.snapshots);
  if (im.held_snapshots) im.held_writer = std::make_unique<SnapshotWriter>(*im.held_snapshots);
  if (rank_ % per_node != 0) return;
  if (const int n = im.snapshots->remove_other_runs(); n > 0)
    GZ_LOG(warn, "rank ", rank_, ": removed ", n, " snapshot file(s) of another run from ", dir);
}

// After the restore (which may reshard them): this world never restores another world's shards
// again (its own snapshots are newer from its first one on; a later world of another size finds
// this world's), neither the ranks it no longer has (an elastic round, a node lost in place) nor
// those whose rank numbers it reuses (a middle node lost: the survivors renumbered), which no
// store of this world would prune; the node's memory is freed now rather than when the run ends.
// (A crash before this world's first snapshot then finds none: the disk checkpoint.)
void Trainer::remove_other_worlds_shards() {
  auto& im = *impl_;
  if (!im.snapshots || rank_ % std::max(1, im.shard_per_node) != 0) return;
  if (const int n = im.snapshots->remove_other_worlds(world_); n > 0)
    GZ_LOG(info, "rank ", rank_, ": removed ", n,
           " shard snapshot file(s) of other world sizes (this run has ", world_, " ranks) from ",
           im.snapshots->dir());
}

// Before an in-place recovery's regroup: the exchange group is aborted (an exchange with a lost
// peer ends now, not at its op timeout), the exchange in flight has returned and the writers have
// written what was queued (the restore then sees every snapshot taken) before they go: nothing
// still running uses what the next start_shard_snapshots() replaces.
void Trainer::stop_shard_snapshots(const std::string& why) {
  auto& im = *impl_;
  if (!im.shard_snapshots) return;
  if (im.snapshot_comm && !im.snapshot_comm->aborted())
    im.snapshot_comm->abort("rank " + std::to_string(rank_) + " recovers in place: " + why);
  try {
    wait_shard_exchange();
  } catch (const std::exception& e) {
    GZ_LOG(warn, "rank ", rank_, ": the last shard snapshot's exchange did not complete: ", e.what());
  }
  for (auto* writer : {im.held_writer.get(), im.snapshot_writer.get()}) {
    if (!writer) continue;
    try {
      writer->flush();
    } catch (const std::exception& e) {
      GZ_LOG(warn, "rank ", rank_, ": the last shard snapshot's write failed (", e.what(), ")");
    }
  }
  im.held_writer.reset();  // before the stores they write to
  im.snapshot_writer.reset();
  im.snapshot_comm.reset();
}

void Trainer::take_shard_snapshot() {
  gz::ScopedPhase phase(gz::Phase::checkpoint);  // this rank's own time, not training
  Stopwatch clock;
  auto& im = *impl_;
  Stopwatch waiting;
  wait_shard_exchange();  // one exchange at a time; a peer lost in the last one fails this step
  im.snapshot_wait_seconds += waiting.seconds();
  const SnapshotHeader h{state_.step, state_.epoch, world_, snapshot_fingerprint()};
  // On this thread only the copy: the shard's tensors (serialized later) and the rest's archive
  // (buffers, counters, RNG, scaler: small, written now).
  std::function<std::string()> shard;  // null: nothing to send (the buddy then writes nothing)
  std::string rest;
  try {
    std::vector<std::string> held;
    shard = snapshot_shard(&held);
    TrainingState state = live_state();  // what the shards do not hold, as a sharded checkpoint's state.pt
    state.optimizer = nullptr;
    const std::set<std::string> in_shard(held.begin(), held.end());
    state.model.erase(
        std::remove_if(state.model.begin(), state.model.end(),
                       [&](const NamedTensor& t) { return !t.buffer && in_shard.count(t.name); }),
        state.model.end());
    torch::serialize::OutputArchive root;
    write_training_state(state, root);
    root.write("gz_sharded_params", c10::IValue(join_lines(held)));
    root.save_to([&rest](const void* p, size_t n) {
      rest.append(static_cast<const char*>(p), n);
      return n;
    });
  } catch (const std::exception& e) {
    shard = nullptr;
    if (!im.shard_snapshot_failed_logged.exchange(true))
      GZ_LOG(warn, "rank ", rank_, ": its shard snapshot of step ", state_.step, " failed: ", e.what());
  }
  auto job = [&im, h, rank = rank_, shard = std::move(shard), rest = std::move(rest),
              slow = im.checkpoints->test_hooks().in_state_copy] {
    if (slow) slow();  // a test holds the serialization up while the next steps run
    std::string payload;
    try {
      if (shard) payload = frame_shard_payload(rest, shard());
    } catch (const std::exception& e) {  // still exchanged (empty): the buddy waits for it
      GZ_LOG(warn, "rank ", rank, ": its shard snapshot of step ", h.step, " failed: ", e.what());
    }
    exchange_shard_snapshot(im, h, rank, std::move(payload));
  };
  // Every rank takes part in the exchange (a rank that skipped it would leave its buddy waiting
  // until the op timeout); on the exchange's own group it runs beside the next steps.
  if (im.snapshot_comm)
    im.shard_exchange.work = im.snapshot_comm->submit(std::move(job));
  else
    job();
  im.snapshot_seconds += clock.seconds();
  ++im.snapshots_taken;
}

void Trainer::wait_shard_exchange() {
  auto work = std::move(impl_->shard_exchange.work);
  if (!work) return;
  // An abort of the training group (a peer's, the move watcher's) does not reach the exchange's
  // own group: pass it on, so a stopped buddy does not hold this thread for the exchange's whole
  // op deadline while the peers already wait in the next generation.
  while (!work->is_completed()) {
    if (group_ && group_->aborted() && impl_->snapshot_comm && !impl_->snapshot_comm->aborted())
      impl_->snapshot_comm->abort("rank " + std::to_string(rank_) + "'s training group was aborted");
    try {
      work->wait(Deadline::after(std::chrono::milliseconds(100)));  // returns as soon as it completes
    } catch (const std::exception&) {
      // Its failure is rethrown below, once it has finished.
    }
  }
  work->wait_finished();  // bounded by the deadline of each op inside (a chunk, a write)
  work->wait();           // its failure: a peer lost while sending
}

std::optional<std::string> Trainer::fetch_shard_snapshot(int64_t step,
                                                         const std::vector<int64_t>& own_ranks) {
  auto& im = *impl_;
  const bool have_own = own_ranks[static_cast<size_t>(rank_)] != 0;
  // This rank sends its buddy_from's copy when that rank's node lost its own.
  const bool send = im.buddy_from >= 0 && !own_ranks[static_cast<size_t>(im.buddy_from)];
  std::string payload, copy, message;
  bool ok = true;
  try {
    auto read = [&](const SnapshotStore& store) {
      SnapshotHeader h;
      std::string bytes = store.read(step, snapshot_fingerprint(), &h);
      if (h.world != world_)
        GZ_THROW(InvalidArgument, "snapshot ", store.path(step), " is of world ", h.world, ", not ", world_);
      return bytes;
    };
    if (have_own) payload = read(*im.snapshots);
    if (send) copy = read(*im.held_snapshots);
  } catch (const std::exception& e) {
    ok = false;
    message = e.what();
  }
  if (!every_rank_read(ok, message,
                       detail::concat("the zero_stage ", config_.zero_stage, " snapshot of step ", step)))
    return std::nullopt;
  if (im.buddy_to >= 0) {
    // Node n sends to n - 1: the ring of the take, reversed; even nodes send first again.
    std::string got =
        exchange_bytes(*group_, send ? &copy : nullptr, im.buddy_from, have_own ? -1 : im.buddy_to,
                       shard_sends_first(rank_, im.shard_per_node));
    if (!have_own) payload = std::move(got);
  }
  return payload;
}

void Trainer::apply_shard_rest(const std::string& rest, int64_t step, const std::string& name) {
  torch::serialize::InputArchive root;
  root.load_from(rest.data(), rest.size());
  c10::IValue names;
  if (!root.try_read("gz_sharded_params", names)) GZ_THROW(Error, name, " lists no sharded parameters");
  const auto held = split_lines(names.toStringRef());
  CheckpointInfo info;
  info.dir = impl_->snapshots->dir();
  info.step = step;
  apply_state(root, info, name, &held);  // re-plans the steps for this world (elastic_batch)
}

void Trainer::apply_shard_snapshot(const std::string& payload, int64_t step) {
  const std::string name = detail::concat("rank ", rank_, "'s shard snapshot of step ", step);
  std::exception_ptr error;
  std::pair<std::string, std::string> parts;
  try {
    parts = unframe_shard_payload(payload, name);
    apply_shard_rest(parts.first, step, name);
  } catch (const c10::Error& e) {
    error =
        std::make_exception_ptr(Error(detail::concat(name, " cannot be read: ", e.what_without_backtrace())));
  } catch (...) {  // apply_state()'s gz::Error names the snapshot already
    error = std::current_exception();
  }
  agree(error, "restoring the shard snapshots of step " + std::to_string(step));
  load_shard_bytes(parts.second, name, step);  // collective: every rank installs or none does
}

// The restore: one choice over every shard file of this run (of any world size), then the
// same-world path (each shard to its own rank, point-to-point, from its node or its buddy) or the
// resharding one. Resharding: the snapshots were written by a world of another size W (a node
// lost in place, a restart on fewer or more ranks). Every old rank q's shard (its payload: the
// rest, its blocks) is read by one rank whose folder holds it (q's own node's or its buddy's) and
// broadcast in chunks to every rank; each rank then loads the blocks of its new layout from the
// old blocks that overlap them (the sharded checkpoint's resharding loader,
// zero::load_shard_snapshots_collective) and the rest from old rank 0's payload (re-planned for
// this world as a disk checkpoint is). Memory: transiently every rank holds every old shard's
// bytes, i.e. the whole parameter and optimizer state once per rank (ranks per node times per
// node), plus the parsed old shards its blocks overlap; freed once loaded.

namespace {

// Collective: the element-wise maximum over the group's ranks.
void allreduce_max(std::vector<double>& v, const comm::CommPtr& group, int world) {
  if (!group || world == 1 || v.empty()) return;
  auto t = torch::from_blob(v.data(), {static_cast<int64_t>(v.size())}, torch::kFloat64);
  gz::allreduce(t, comm::ReduceOp::max, group);
}

// Snapshots (a step and the world that wrote it) tried, newest first, before the disk checkpoint
// is used: two generations per store, of up to two world sizes (the last one's and this one's).
constexpr int kRestoreTries = 4 * kShardGenerations;
// A snapshot's key, all-reduced as one double: (step + 1) * kWorldKey + world (exact below 2^53).
constexpr int64_t kWorldKey = int64_t{1} << 20;

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (int q : ranks) out += (out.empty() ? "" : ", ") + std::to_string(q);
  return out;
}

}  // namespace

int64_t Trainer::choose_shard_snapshot(std::vector<int>& holder) {
  auto& im = *impl_;
  const auto files = im.snapshots ? im.snapshots->shard_headers() : std::vector<SnapshotHeader>{};
  const uint64_t fingerprint = snapshot_fingerprint();
  auto usable = [&](const SnapshotHeader& h) {
    return h.world > 0 && h.world < kWorldKey && h.rank < h.world && h.fingerprint == fingerprint;
  };
  auto key = [](const SnapshotHeader& h) { return static_cast<double>((h.step + 1) * kWorldKey + h.world); };
  double bound = std::numeric_limits<double>::infinity();
  int64_t newest = -1;
  int newest_world = 0;
  std::vector<int> lacking;
  for (int tries = 0; tries < kRestoreTries; ++tries) {
    std::vector<double> v{0.0};  // the newest snapshot below `bound` any rank holds a shard of
    for (const auto& h : files)
      if (usable(h) && key(h) < bound) v[0] = std::max(v[0], key(h));
    allreduce_max(v, group_, world_);
    if (v[0] <= 0) break;
    const auto k = static_cast<int64_t>(v[0]);
    const int64_t step = k / kWorldKey - 1;
    const int world = static_cast<int>(k % kWorldKey);
    // Each of its shards' holder: the lowest rank whose folder holds it (-rank, maxed).
    std::vector<double> who(static_cast<size_t>(world), -static_cast<double>(world_));
    for (const auto& h : files)
      if (usable(h) && h.step == step && h.world == world)
        who[static_cast<size_t>(h.rank)] = -static_cast<double>(rank_);
    allreduce_max(who, group_, world_);
    holder.assign(static_cast<size_t>(world), world_);
    std::vector<int> missing;
    for (int q = 0; q < world; ++q)
      if ((holder[static_cast<size_t>(q)] = -static_cast<int>(who[static_cast<size_t>(q)])) == world_)
        missing.push_back(q);
    if (missing.empty() && newest >= 0 && is_main())
      GZ_LOG(warn, "the zero_stage ", config_.zero_stage, " snapshot of step ", newest, " (written by ",
             newest_world, " ranks) lacks the shard of rank(s) ", rank_list(lacking),
             " (no rank's folder holds it): restoring step ", step, " (written by ", world, " ranks)");
    if (missing.empty()) return step;
    if (newest < 0) newest = step, newest_world = world, lacking = missing;
    bound = v[0];
  }
  holder.clear();
  if (newest >= 0 && is_main())
    GZ_LOG(
        warn, "the zero_stage ", config_.zero_stage,
        newest_world == world_
            ? detail::concat(" snapshot of step ", newest, " lacks the shard of rank(s) ", rank_list(lacking))
            : detail::concat(" snapshots here were written by ", newest_world, " ranks, this run has ",
                             world_, ": the newest, of step ", newest, ", lacks the shard of old rank(s) ",
                             rank_list(lacking)),
        " (no rank's folder holds it), and no older one is whole; using the disk checkpoint");
  return -1;
}

bool Trainer::restore_shard_snapshot() {
  std::vector<int> holder;  // its size: the world that wrote the chosen snapshot
  const int64_t step = choose_shard_snapshot(holder);
  const bool restored = step >= 0 && restore_shard_snapshot(step, holder);
  remove_other_worlds_shards();  // after every rank's reads (the restore's last collective)
  return restored;
}

bool Trainer::restore_shard_snapshot(int64_t step, const std::vector<int>& holder) {
  Stopwatch clock;
  const int64_t disk = disk_checkpoint_step(step);
  if (disk > step) return false;
  const std::string on_disk = disk < 0 ? std::string("none") : std::to_string(disk);
  if (static_cast<int>(holder.size()) == world_) {
    // This world's: only from each shard's own node or its buddy's. A copy elsewhere may be of
    // another history of the same step (files are named by step and rank: a step redone after an
    // older restore, ranks renumbered at the same size), which nothing could tell apart.
    int from_own = 0;
    const auto restored = restore_same_world_snapshot(step, from_own);
    if (!restored && is_main())
      GZ_LOG(warn, "the zero_stage ", config_.zero_stage, " snapshot of step ", step,
             " is not whole on its ranks' and their buddies' nodes; using the disk checkpoint");
    if (restored && *restored && is_main())
      GZ_LOG(info, "restored the zero_stage ", config_.zero_stage, " snapshot of step ", step, " in ",
             clock.seconds(), " s: ", from_own, " of ", world_, " shard(s) from their rank's node, ",
             world_ - from_own, " sent by their buddy; disk checkpoint: ", on_disk);
    return restored.value_or(false);
  }
  // Another world's: each old shard from the lowest rank whose folder holds it.
  auto payloads = gather_old_shards(step, holder);
  if (!payloads) return false;
  apply_resharded_snapshot(*payloads, step);
  if (is_main())
    GZ_LOG(warn, "restored the zero_stage ", config_.zero_stage, " snapshot of step ", step, " written by ",
           holder.size(), " ranks, resharded to ", world_, ", in ", clock.seconds(),
           " s; disk checkpoint: ", on_disk);
  return true;
}

std::optional<bool> Trainer::restore_same_world_snapshot(int64_t step, int& from_own) {
  auto& im = *impl_;
  ShardTable table(world_);
  table.list(im.snapshots.get(), rank_, ShardTable::kOwn, world_);
  table.list(im.held_snapshots.get(), im.buddy_from, ShardTable::kBuddy, world_);
  table.merge(group_);
  if (!table.missing(step).empty()) return std::nullopt;  // the same on every rank (merged)
  std::vector<int64_t> own(static_cast<size_t>(world_));
  for (int q = 0; q < world_; ++q)
    own[static_cast<size_t>(q)] = table.holds(q, ShardTable::kOwn, step) ? 1 : 0;
  auto payload = fetch_shard_snapshot(step, own);
  if (!payload) return false;
  apply_shard_snapshot(*payload, step);
  from_own = static_cast<int>(std::accumulate(own.begin(), own.end(), int64_t{0}));
  return true;
}

std::optional<std::vector<std::string>> Trainer::gather_old_shards(int64_t step,
                                                                   const std::vector<int>& holder) {
  auto& im = *impl_;
  const int old_world = static_cast<int>(holder.size());
  std::vector<std::string> payloads(holder.size());
  bool ok = true;
  std::string message;
  for (int q = 0; q < old_world; ++q) {
    std::string& bytes = payloads[static_cast<size_t>(q)];
    if (holder[static_cast<size_t>(q)] == rank_ && ok) {
      const SnapshotStore store(im.snapshots->dir(), 1, im.snapshots->run(), q);  // to read q's shard
      try {
        SnapshotHeader h;
        bytes = store.read(step, snapshot_fingerprint(), &h);
        if (h.world != old_world)
          GZ_THROW(InvalidArgument, "snapshot ", store.path(step), " of rank ", q, " is of world ", h.world,
                   ", not ", old_world);
      } catch (const std::exception& e) {
        ok = false;
        message = e.what();
        bytes.clear();
      }
    }
    // Sent even when empty (the holder could not read it): every rank runs the same broadcasts,
    // and every rank sees the empty one (a payload is never empty) and stops after it.
    if (group_ && world_ > 1) broadcast_bytes(*group_, bytes, holder[static_cast<size_t>(q)]);
    if (bytes.empty()) break;
  }
  if (!every_rank_read(ok, message,
                       detail::concat("the zero_stage ", config_.zero_stage, " snapshot of step ", step,
                                      " (written by ", old_world, " ranks)")))
    return std::nullopt;
  return payloads;
}

void Trainer::apply_resharded_snapshot(std::vector<std::string>& payloads, int64_t step) {
  const std::string name =
      detail::concat("the shard snapshots of step ", step, " (written by ", payloads.size(), " ranks)");
  std::exception_ptr error;
  std::vector<std::string> shards(payloads.size());
  try {
    for (size_t q = 0; q < payloads.size(); ++q) {
      auto parts = unframe_shard_payload(payloads[q], name);
      std::string().swap(payloads[q]);
      shards[q] = std::move(parts.second);
      if (q != 0) continue;
      // The rest (buffers, counters, RNG, scaler, data position): old rank 0's, as state.pt is.
      apply_shard_rest(parts.first, step, name);
    }
  } catch (const c10::Error& e) {
    error =
        std::make_exception_ptr(Error(detail::concat(name, " cannot be read: ", e.what_without_backtrace())));
  } catch (...) {
    error = std::current_exception();
  }
  agree(error, "restoring " + name);
  load_shard_snapshots(shards, name, step);  // collective: every rank installs or none does
}

}  // namespace gz::train
