// Generations of one group for in-place recovery: a slot per rank and generation in the store
// decides where a fresh process joins (see gz/comm/generations.h).
#include "gz/comm/generations.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "gz/comm/flight_dump.h"
#include "gz/core/error.h"
#include "gz/core/log.h"
#include "gz/store/prefix_store.h"

namespace gz::comm {
namespace {
// A bound on the walk over generations a rank's predecessors joined (each a past recovery).
constexpr int kMaxGenerations = 100000;
// A generation's fate (Generations::settle).
const std::string kFormed = "formed", kAbandoned = "abandoned";
}  // namespace

Generations::Generations(CommOptions base) : base_(std::move(base)) {
  if (!base_.store) GZ_THROW(InvalidArgument, "Generations: no store");
  if (base_.rank < 0 || base_.rank >= base_.size)
    GZ_THROW(InvalidArgument, "Generations: rank ", base_.rank, " outside a group of ", base_.size);
}

CommPtr Generations::join() {
  if (generation_ >= 0) GZ_THROW(Error, "Generations::join: already joined generation ", generation_);
  return join_from(0);
}

CommPtr Generations::rejoin(const CommPtr& old, const std::string& why) {
  // Peers blocked in the old group's ops learn at once (closed connections, poisoned segment)
  // instead of at their deadline, and come here too.
  if (old && !old->aborted()) old->abort(why);
  return join_from(generation_ + 1);
}

CommPtr Generations::join_from(int first) {
  for (int moves = 0;; ++moves) {
    // A move already written is followed before claiming anything here: a rank that claimed a
    // slot and then left for the new round could complete this generation for peers that would
    // then wait in it for ranks that never come.
    if (moved()) {
      first = 0;
      continue;
    }
    const std::string rank = std::to_string(base_.rank);
    int g = first;
    // 1 = the slot is ours; more = a lost predecessor of this rank joined g: its peers left it.
    while (base_.store->add("slots/" + std::to_string(g) + "/" + rank, 1) != 1)
      if (++g >= first + kMaxGenerations)
        GZ_THROW(Error, "Generations: rank ", base_.rank, " found no free slot in ", kMaxGenerations,
                 " generations from ", first);
    // One counter per generation: waiting members ask one key, not every rank's slot.
    const std::string gen = std::to_string(g);
    if (base_.store->add("joined/" + gen, 1) == base_.size)
      base_.store->set("complete/" + gen, to_bytes("1"));
    if (!await_members(g)) {
      first = 0;  // placed in another group: its generations start at 0
      if (moves >= kMaxGenerations) GZ_THROW(Error, "Generations: moved ", moves, " times without joining");
      continue;
    }
    CommOptions o = base_;
    o.store = std::make_shared<PrefixStore>("g" + std::to_string(g), base_.store);  // PrefixStore adds the /
    if (o.name.empty() && g > 0) o.name = "gen" + std::to_string(g);  // generation 0: as without
    if (g > 0) GZ_LOG(info, "rank ", base_.rank, ": joining generation ", g, " of the group");
    CommPtr c = create_communicator(o);
    generation_ = g;
    return c;
  }
}

bool Generations::moved() {
  if (!mover_.pending || !mover_.pending()) return false;
  adopt(mover_.follow());
  return true;
}

void Generations::adopt(Placement p) {
  if (!p.store || p.rank < 0 || p.rank >= p.size)
    GZ_THROW(Error, "Generations: invalid placement (rank ", p.rank, " of ", p.size, ")");
  base_.rank = p.rank;
  base_.size = p.size;
  base_.store = std::move(p.store);
  generation_ = -1;
}

std::string Generations::settle(int g, const std::string& fate) {
  // An empty expectation matches a missing key only: the first word stays.
  return to_string(base_.store->compare_set("fate/" + std::to_string(g), {}, to_bytes(fate)));
}

bool Generations::await_members(int g) {
  const std::string complete = "complete/" + std::to_string(g);
  const Deadline deadline = Deadline::after(base_.timeout);
  auto pause = std::chrono::milliseconds(2);
  bool abandoned = false;
  for (;;) {
    // A move first: the launcher ended this round, whoever is still awaited in it. This rank
    // holds a slot here (it may have completed the generation): it leaves unless its peers
    // formed the generation already (then it joins, and its group's next op or the move
    // watcher brings it back here, to the move), and the abandoned generation is not formed.
    // Once the fate is known to be "abandoned" it is not asked again: only the move is awaited.
    if (mover_.pending && mover_.pending() && (abandoned || settle(g, kAbandoned) == kAbandoned)) {
      adopt(mover_.follow());
      return false;
    }
    if (!abandoned && base_.store->check({complete})) {
      if (!mover_.pending || settle(g, kFormed) == kFormed) return true;
      abandoned = true;  // a member left for the new round: this rank's own move will come
    }
    if (deadline.expired()) {
      if (abandoned)
        GZ_THROW(TimeoutError, "rank ", base_.rank, ": generation ", g,
                 " of the group was abandoned by a rank ",
                 "that moved to the launcher's new round, and this rank's own move did not come within ",
                 format_duration(base_.timeout));
      std::string missing;
      for (int r = 0; r < base_.size; ++r)
        if (!base_.store->check({"slots/" + std::to_string(g) + "/" + std::to_string(r)}))
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      GZ_THROW(TimeoutError, "rank ", base_.rank, ": generation ", g, " of the group: rank(s) ", missing,
               " did not join within ", format_duration(base_.timeout),
               " (lost and neither replaced nor moved to a new round by the launcher)");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(100));
  }
}

Generations::Mover follow_moves(std::shared_ptr<RoundFollower> follower, const std::string& group,
                                Duration timeout) {
  Generations::Mover mover;
  mover.pending = [follower] { return follower->poll().has_value(); };
  mover.follow = [follower, group, timeout]() -> Generations::Placement {
    std::optional<RoundMove> m = follower->poll();
    if (!m) GZ_THROW(Error, "Generations: the launcher's move of rank ", follower->rank(), " is gone");
    auto run = follower->follow(*m, Deadline::after(timeout));
    // The new run's rank from here on, in this process's log lines and in its flight-recorder
    // dumps (named and placed where gzrun's verdict and `gzrun --status` look for them).
    set_log_rank(m->rank);
    set_flight_dump_identity({m->run_id, m->rank, m->world_size, m->node_rank});
    return Generations::Placement{m->rank, m->world_size, std::make_shared<PrefixStore>(group, run)};
  };
  return mover;
}

}  // namespace gz::comm
