// gz::init(options): rendezvous + create_communicator. Kept apart from process_group.cpp so
// programs that adopt their own communicator do not link the rendezvous and backend factory.
#include <cstdlib>
#include <memory>
#include <mutex>

#include "gz/comm/factory.h"
#include "gz/comm/generations.h"
#include "gz/comm/move_watcher.h"
#include "gz/core/env.h"
#include "gz/core/error.h"
#include "gz/core/log.h"
#include "gz/store/prefix_store.h"
#include "gz/store/rendezvous.h"
#include "gz/store/round_move.h"
#include "gz/torch/process_group.h"
#include "process_group_state.h"

namespace gz {

namespace {

constexpr const char* kGroupPrefix = "gz_default_group";  // the default group's keys in a run

// The watcher's thread at exit without gz::shutdown(): stopped here, within a bound (a store
// that does not answer is left to the exit). std::atexit orders this handler only against the
// statics built before it was registered (the first watch_moves(), in gz::init()): those, such
// as pg_state(), are destroyed after it; a static first built later is destroyed before it, so
// a thread left running past the bound must touch none of those (it touches its own state).
void stop_watcher_at_exit() {
  std::shared_ptr<void> watcher;
  {
    std::lock_guard<std::mutex> lock(detail::pg_state().mu);
    watcher = std::move(detail::pg_state().watcher);
  }
  if (watcher) static_cast<comm::MoveWatcher*>(watcher.get())->stop(Duration(1000));
}

// Aborts the default group when gzrun moved the job to a new round without this worker seeing a
// failure (a node admitted, or a stopped node that gzrun's heartbeats found before any op's
// deadline): the step fails at once and the Trainer's in-place recovery follows the move. Twice
// a second: an admission or a stopped node waits this long at most (one store request per
// worker and poll: light enough for a job's store).
std::shared_ptr<comm::MoveWatcher> watch_moves(std::shared_ptr<RoundFollower> follower) {
  static std::once_flag at_exit;
  std::call_once(at_exit, [] { std::atexit(stop_watcher_at_exit); });
  return std::make_shared<comm::MoveWatcher>(std::move(follower), [] {
    std::lock_guard<std::mutex> lock(detail::pg_state().mu);
    return detail::pg_state().group;
  });
}

// gzrun --recovery in-place of an elastic job: the group follows gzrun's moves to new rounds.
std::shared_ptr<RoundFollower> follow_rounds(comm::Generations& gens, const Rendezvous& rdzv, const Env& env,
                                             Duration timeout) {
  auto follower = std::make_shared<RoundFollower>(rdzv.base, env.get("GZ_RUN_ID", "0"), rdzv.world);
  gens.set_mover(comm::follow_moves(follower, kGroupPrefix, timeout));
  return follower;
}

}  // namespace

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
  co.store = std::make_shared<PrefixStore>(kGroupPrefix, rdzv->store);
  co.timeout = options.timeout;
  std::shared_ptr<comm::Generations> gens;
  const Env env = Env::from_process();
  if (options.regroupable || env.get("GZ_RECOVERY", "") == "in_place")
    gens = std::make_shared<comm::Generations>(co);
  // Elastic jobs under gzrun move their live workers to the next round (a node lost or admitted).
  const bool moves = gens && env.get("GZ_RECOVERY", "") == "in_place" && env.get("GZ_MIN_NODES") &&
                     rdzv->world.launcher == "gzrun";
  // The mover before the first join: a node lost while this process starts moves it too.
  std::shared_ptr<RoundFollower> follower =
      moves ? follow_rounds(*gens, *rdzv, env, options.timeout) : nullptr;
  auto group = gens ? gens->join() : comm::create_communicator(co);
  init(group, rdzv->world.local_rank, rdzv->world.local_world_size);
  std::lock_guard<std::mutex> lock(detail::pg_state().mu);
  detail::pg_state().keep_alive = rdzv;
  detail::pg_state().generations = std::move(gens);
  detail::pg_state().follower = follower;
  detail::pg_state().move_timeout = options.timeout;
  if (follower) detail::pg_state().watcher = watch_moves(follower);
}

bool accept_moves(bool on) {
  std::shared_ptr<RoundFollower> follower;
  Duration timeout;
  {
    std::lock_guard<std::mutex> lock(detail::pg_state().mu);
    follower = detail::pg_state().follower;
    timeout = detail::pg_state().move_timeout;
  }
  if (!follower) return false;
  follower->accept(on, Deadline::after(timeout));
  return true;
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
  // A move to a new round sets the log rank and the flight recorder's identity (follow_moves).
  comm::CommPtr fresh = gens->rejoin(old, why);
  std::lock_guard<std::mutex> lock(st.mu);
  st.group = fresh;
  return fresh;
}

}  // namespace gz
