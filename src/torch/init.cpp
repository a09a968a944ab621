// gz::init(options): rendezvous + create_communicator. Kept apart from process_group.cpp so
// programs that adopt their own communicator do not link the rendezvous and backend factory.
#include <memory>

#include "gz/comm/factory.h"
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
  auto group = comm::create_communicator(co);
  init(group, rdzv->world.local_rank, rdzv->world.local_world_size);
  std::lock_guard<std::mutex> lock(detail::pg_state().mu);
  detail::pg_state().keep_alive = rdzv;
}

}  // namespace gz
