// The move notice between gzrun and its live workers, and a worker following it.
#include "gz/store/round_move.h"

#include <algorithm>
#include <chrono>
#include <sstream>
#include <thread>

#include "gz/core/error.h"
#include "gz/core/log.h"
#include "gz/store/prefix_store.h"

namespace gz {

namespace {
const std::string kAcceptsPrefix = "accepts-moves/";
// The accepts key's values (round_accepts_key); every change is a compare-and-set.
const std::string kAccepted = "1", kWithdrawn = "0", kClaimed = "claimed", kMoving = "moving";

std::string cas(Store& run, const std::string& key, const std::string& from, const std::string& to) {
  return to_string(run.compare_set(key, to_bytes(from), to_bytes(to)));
}

// Says "accepted" in `run` unless gzrun claimed this worker already (its notice follows).
void announce(Store& run, int rank) {
  const std::string key = kAcceptsPrefix + std::to_string(rank);
  if (cas(run, key, "", kAccepted) == kWithdrawn) cas(run, key, kWithdrawn, kAccepted);
}
}  // namespace

bool claim_round_moves(Store& run, const std::vector<int>& ranks) {
  std::vector<int> claimed;
  for (int r : ranks) {
    // Success returns the value stored; a missing key returns the expected value unchanged.
    if (cas(run, round_accepts_key(r), kAccepted, kClaimed) != kClaimed) {
      release_round_moves(run, claimed);
      return false;
    }
    claimed.push_back(r);
  }
  return true;
}

bool round_accepts(Store& run, int rank) {
  const std::string key = round_accepts_key(rank);
  // A read by compare-and-set ("claimed" for itself is no write): one request, no wait.
  return cas(run, key, kClaimed, kClaimed) == kAccepted;
}

void release_round_moves(Store& run, const std::vector<int>& ranks) {
  for (int r : ranks) cas(run, round_accepts_key(r), kClaimed, kAccepted);
}

bool commit_round_moves(Store& run, const std::vector<int>& ranks) {
  bool all = true;
  // Each one even after a failure: a worker still claimed is committed too (and stopped by gzrun
  // with the others), so that none of them is left waiting for a release that never comes.
  for (int r : ranks) all = cas(run, round_accepts_key(r), kClaimed, kMoving) == kMoving && all;
  return all;
}

std::string round_move_key(int rank) { return "moved/" + std::to_string(rank); }

std::string encode_round_move(const RoundMove& m) {
  // The run id never holds a space (gzrun's "<pid>.<hex>-<round>"); the reason goes last.
  std::ostringstream os;
  os << "v1 " << m.round << ' ' << m.run_id << ' ' << m.rank << ' ' << m.world_size << ' ' << m.node_rank
     << ' ' << m.num_nodes << ' ' << m.why;
  return os.str();
}

RoundMove decode_round_move(const std::string& text) {
  std::istringstream is(text);
  std::string version;
  RoundMove m;
  is >> version >> m.round >> m.run_id >> m.rank >> m.world_size >> m.node_rank >> m.num_nodes;
  if (!is || version != "v1" || m.run_id.empty() || m.world_size < 1 || m.rank < 0 ||
      m.rank >= m.world_size || m.num_nodes < 1 || m.node_rank < 0 || m.node_rank >= m.num_nodes)
    GZ_THROW(Error, "not a round move from gzrun: '", text.substr(0, 200), "'");
  std::getline(is >> std::ws, m.why);
  return m;
}

RoundFollower::RoundFollower(std::shared_ptr<Store> base, std::string run_id, WorldInfo world)
    : base_(std::move(base)), run_id_(std::move(run_id)), world_(std::move(world)) {
  if (!base_) GZ_THROW(InvalidArgument, "RoundFollower: no store");
  run_ = std::make_shared<PrefixStore>(run_prefix(run_id_), base_);
}

std::optional<RoundMove> RoundFollower::poll() {
  std::shared_ptr<Store> run;
  int rank = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    run = run_;
    rank = world_.rank;
  }
  const std::string key = round_move_key(rank);
  if (!run->check({key})) return std::nullopt;
  return decode_round_move(to_string(run->get(key)));
}

std::shared_ptr<Store> RoundFollower::follow(RoundMove& m, Deadline deadline) {
  for (;;) {
    auto run = std::make_shared<PrefixStore>(run_prefix(m.run_id), base_);
    WorldInfo w;
    std::string old_run;
    bool accepts = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      w = world_;
      old_run = run_id_;
      accepts = accepts_;
    }
    GZ_LOG(info, "rank ", w.rank, " of run ", old_run, " continues as rank ", m.rank, " of ", m.world_size,
           " in run ", m.run_id, " (round ", m.round, ")");
    w.rank = m.rank;
    w.world_size = m.world_size;
    w.node_rank = m.node_rank;
    w.num_nodes = m.num_nodes;
    // Announced before meeting: gzrun may move the job again while this rank waits here.
    if (accepts) announce(*run, m.rank);
    // A move out of this run while its ranks meet (a node lost or admitted meanwhile) is followed
    // at once: the ranks it no longer has would never arrive.
    std::optional<RoundMove> next;
    const std::string next_key = round_move_key(m.rank);
    const bool met = meet(*run, w, deadline, "run " + m.run_id, [&] {
      if (!run->check({next_key})) return false;
      next = decode_round_move(to_string(run->get(next_key)));
      return true;
    });
    {
      std::lock_guard<std::mutex> lock(mu_);
      run_id_ = m.run_id;
      world_ = w;
      run_ = run;
    }
    if (met) return run;
    m = *next;
  }
}

void RoundFollower::accept(bool on, Deadline deadline) {
  std::shared_ptr<Store> run;
  int rank = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    accepts_ = on;
    run = run_;
    rank = world_.rank;
  }
  if (on) return announce(*run, rank);
  const std::string key = round_accepts_key(rank);
  auto pause = std::chrono::milliseconds(5);
  // Claimed: gzrun is joining the next round with this worker in it. Its release, its commit
  // ("moving": the notice follows) or this worker's deadline decides; at the deadline the
  // withdrawal takes the key back from gzrun by compare-and-set, so exactly one side wins.
  for (;;) {
    // Withdrawn now or before; or never accepted (a missing key returns the expectation, "1").
    const std::string now = cas(*run, key, kAccepted, kWithdrawn);
    if (now == kMoving) throw moved_while_withdrawing(rank);
    if (now != kClaimed) return;
    if (deadline.expired()) {
      const std::string taken = cas(*run, key, kClaimed, kWithdrawn);  // gzrun then finds "0"
      if (taken == kMoving) throw moved_while_withdrawing(rank);
      if (taken == kWithdrawn) return;
      continue;  // released at this moment: withdraw as usual
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(100));
  }
}

MovedError RoundFollower::moved_while_withdrawing(int rank) {
  // gzrun writes the notice right after committing: a short wait shows where it moved this worker.
  // The error stays a MovedError whatever the store answers meanwhile.
  std::optional<RoundMove> m;
  try {
    for (Deadline d = Deadline::after(std::chrono::seconds(2)); !(m = poll()) && !d.expired();)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  } catch (const std::exception&) {
    m.reset();
  }
  const std::string where = m ? " to round " + std::to_string(m->round) + " as rank " +
                                    std::to_string(m->rank) + " of " + std::to_string(m->world_size) + " (" +
                                    m->why + ")"
                              : " to its next round";
  return MovedError(
      detail::concat("rank ", rank, " of run ", run_id(), ": gzrun moved this worker", where,
                     " while it withdrew from moves; it cannot follow the move now and stops here"));
}

std::string round_accepts_key(int rank) { return kAcceptsPrefix + std::to_string(rank); }

std::string RoundFollower::run_id() const {
  std::lock_guard<std::mutex> lock(mu_);
  return run_id_;
}

int RoundFollower::rank() const {
  std::lock_guard<std::mutex> lock(mu_);
  return world_.rank;
}

}  // namespace gz
