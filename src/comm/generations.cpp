// Generations of one group for in-place recovery: a slot per rank and generation in the store
// decides where a fresh process joins (see gz/comm/generations.h).
#include "gz/comm/generations.h"

#include "gz/core/error.h"
#include "gz/core/log.h"
#include "gz/store/prefix_store.h"

namespace gz::comm {
namespace {
// A bound on the walk over generations a rank's predecessors joined (each a past recovery).
constexpr int kMaxGenerations = 100000;
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
  const std::string rank = std::to_string(base_.rank);
  for (int g = first; g < first + kMaxGenerations; ++g) {
    // 1 = the slot is ours; more = a lost predecessor of this rank joined g: its peers left it.
    if (base_.store->add("slots/" + std::to_string(g) + "/" + rank, 1) != 1) continue;
    CommOptions o = base_;
    o.store = std::make_shared<PrefixStore>("g" + std::to_string(g), base_.store);  // PrefixStore adds the /
    if (o.name.empty() && g > 0) o.name = "gen" + std::to_string(g);  // generation 0: as without
    if (g > 0) GZ_LOG(info, "rank ", base_.rank, ": joining generation ", g, " of the group");
    CommPtr c = create_communicator(o);
    generation_ = g;
    return c;
  }
  GZ_THROW(Error, "Generations: rank ", base_.rank, " found no free slot in ", kMaxGenerations,
           " generations from ", first);
}

}  // namespace gz::comm
