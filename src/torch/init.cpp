// gz::init(options): rendezvous + create_communicator. Kept apart from process_group.cpp so
// programs that adopt their own communicator do not link the rendezvous and backend factory.
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "gz/comm/factory.h"
#include "gz/comm/generations.h"
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

// Aborts the default group when gzrun moved the job to a new round without this worker seeing a
// failure (a node admitted, or a stopped node that gzrun's heartbeats found before any op's
// deadline): the step fails at once and the Trainer's in-place recovery follows the move.
class MoveWatcher {
 public:
  explicit MoveWatcher(std::shared_ptr<RoundFollower> follower)
      : follower_(std::move(follower)), thread_([this] { run(); }) {}
  ~MoveWatcher() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    // Twice a second: an admission or a stopped node waits this long at most (one store
    // request per worker and poll: light enough for a job's store).
    while (!cv_.wait_for(lock, std::chrono::milliseconds(500), [this] { return stop_; })) {
      lock.unlock();
      check();
      lock.lock();
    }
  }
  void check() {
    // The group first, then the move: a group taken after the move was followed belongs to the
    // new run, whose key poll() then reads (no move), so a new group is never aborted by mistake.
    comm::CommPtr group;
    {
      std::lock_guard<std::mutex> lock(detail::pg_state().mu);
      group = detail::pg_state().group;
    }
    if (!group || group->aborted()) return;
    try {
      if (std::optional<RoundMove> m = follower_->poll())
        group->abort("gzrun moved the job to round " + std::to_string(m->round) + " (" + m->why + ")");
    } catch (const std::exception&) {
      // The store is unreachable or the notice unreadable: the group's own ops report a lost job.
    }
  }

  std::shared_ptr<RoundFollower> follower_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

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
  if (follower) detail::pg_state().watcher = std::make_shared<MoveWatcher>(follower);
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
  comm::CommPtr fresh = gens->rejoin(old, why);
  if (fresh->rank() != old->rank()) set_log_rank(fresh->rank());  // moved to a new round
  std::lock_guard<std::mutex> lock(st.mu);
  st.group = fresh;
  return fresh;
}

}  // namespace gz
