// gz::init(options): rendezvous + create_communicator. Kept apart from process_group.cpp so
// programs that adopt their own communicator do not link the rendezvous and backend factory.
#include <memory>
#include <mutex>

#include "gz/comm/factory.h"
#include "gz/comm/generations.h"
#include "gz/core/env.h"
#include "gz/core/error.h"
#include "gz/store/prefix_store.h"
#include "gz/store/rendezvous.h"
#include "gz/torch/process_group.h"
#include "process_group_state.h"

namespace gz {

void init(const ProcessGroupOptions& options) {
  if (is_initialized()) GZ_THROW(Error, "gz::init: already initialized");
  InitOptions io;
  io.init_method = options.init_method;
  io.rank = options.rank;
  io.world_size = options.world_size;
  io.timeout = options.timeout;
  auto rdzv = std::make_shared<Rendezvous>(rendezvous(io));
  comm::CommOptions co;
  co.backend = options.backend;
  co.rank = rdzv->world.rank;
  co.size = rdzv->world.world_size;
  co.store = std::make_shared<PrefixStore>("gz_default_group", rdzv->store);
  co.timeout = options.timeout;
  std::shared_ptr<comm::Generations> gens;
  if (options.regroupable || Env::from_process().get("GZ_RECOVERY", "") == "in_place")
    gens = std::make_shared<comm::Generations>(co);
  auto group = gens ? gens->join() : comm::create_communicator(co);
  init(group, rdzv->world.local_rank, rdzv->world.local_world_size);
  std::lock_guard<std::mutex> lock(detail::pg_state().mu);
  detail::pg_state().keep_alive = rdzv;
  detail::pg_state().generations = std::move(gens);
}

bool can_regroup() {
  std::lock_guard<std::mutex> lock(detail::pg_state().mu);
  return detail::pg_state().group && detail::pg_state().generations;
}

comm::CommPtr regroup(const std::string& why) {
  // One regroup at a time: two would claim two slots of one rank (Generations is not shared-safe).
  static std::mutex one_at_a_time;
  std::lock_guard<std::mutex> serial(one_at_a_time);
  auto& st = detail::pg_state();
  std::shared_ptr<comm::Generations> gens;
  comm::CommPtr old;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    gens = st.generations;
    old = st.group;
  }
  if (!gens || !old)
    GZ_THROW(Error,
             "gz::regroup: the default group cannot be replaced (init() builds a replaceable one "
             "under gzrun --recovery in-place, or with ProcessGroupOptions::regroupable)");
  // The rendezvous takes as long as the replacements need to start: not under the lock.
  comm::CommPtr fresh = gens->rejoin(old, why);
  std::lock_guard<std::mutex> lock(st.mu);
  st.group = fresh;
  return fresh;
}

}  // namespace gz
