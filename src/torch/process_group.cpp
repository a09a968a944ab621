#include "gz/torch/process_group.h"

#include <mutex>

#include "gz/core/error.h"
#include "process_group_state.h"

namespace gz {

namespace detail {
ProcessGroupState& pg_state() {
  static ProcessGroupState state;
  return state;
}
}  // namespace detail

using detail::pg_state;

void init(comm::CommPtr group, int local_rank, int local_size) {
  if (!group) GZ_THROW(InvalidArgument, "gz::init: null communicator");
  auto& st = pg_state();
  std::lock_guard<std::mutex> lock(st.mu);
  if (st.group) GZ_THROW(Error, "gz::init: already initialized (rank ", st.group->rank(), " of ", st.group->size(), ")");
  st.group = std::move(group);
  st.local_rank = local_rank >= 0 ? local_rank : st.group->rank();
  st.local_size = local_size >= 0 ? local_size : st.group->size();
}

void shutdown() {
  auto& st = pg_state();
  std::shared_ptr<void> watcher;  // stopped outside the lock: its thread takes `mu`
  std::lock_guard<std::mutex> lock(st.mu);
  watcher = std::move(st.watcher);
  st.group.reset();
  st.keep_alive.reset();
  st.generations.reset();
  st.follower.reset();
  st.local_rank = 0;
  st.local_size = 1;
}

bool is_initialized() {
  auto& st = pg_state();
  std::lock_guard<std::mutex> lock(st.mu);
  return st.group != nullptr;
}

comm::CommPtr default_group() {
  auto& st = pg_state();
  std::lock_guard<std::mutex> lock(st.mu);
  if (!st.group) GZ_THROW(Error, "gz: the default process group is not initialized; call gz::init() first "
                                 "(or pass an explicit group)");
  return st.group;
}

comm::CommPtr resolve_group(const comm::CommPtr& group) { return group ? group : default_group(); }

int rank() { return default_group()->rank(); }
int size() { return default_group()->size(); }
bool is_main_process() { return rank() == 0; }

int local_rank() {
  default_group();
  std::lock_guard<std::mutex> lock(pg_state().mu);
  return pg_state().local_rank;
}

int local_size() {
  default_group();
  std::lock_guard<std::mutex> lock(pg_state().mu);
  return pg_state().local_size;
}

}  // namespace gz
