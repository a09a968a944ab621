// The move watcher's thread owns what it touches (State) so that a stop bounded in time, at exit
// without gz::shutdown() too, can leave it in a store request that does not return.
#include "gz/comm/move_watcher.h"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace gz::comm {

struct MoveWatcher::State {
  std::shared_ptr<RoundFollower> follower;
  std::function<CommPtr()> current_group;
  Duration period;
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false, ended = false;
  bool released = false;  // an earlier stop() joined or detached the thread
  std::thread thread;

  bool stopping() {
    std::lock_guard<std::mutex> lock(mu);
    return stop;
  }

  void check() {
    // The group first, then the move: a group taken after the move was followed belongs to the
    // new run, whose key poll() then reads (no move), so a new group is never aborted by mistake.
    // Held weakly while the store answers: a poll that outlives its stop keeps no group alive.
    std::weak_ptr<Communicator> weak = current_group();
    {
      CommPtr group = weak.lock();
      if (!group || group->aborted()) return;
    }
    std::optional<RoundMove> m;
    try {
      m = follower->poll();
    } catch (const std::exception&) {
      // The store is unreachable or the notice unreadable: the group's own ops report a lost job.
    }
    if (!m || stopping()) return;
    if (CommPtr group = weak.lock())
      group->abort("gzrun moved the job to round " + std::to_string(m->round) + " (" + m->why + ")");
  }

  void run() {
    std::unique_lock<std::mutex> lock(mu);
    while (!cv.wait_for(lock, period, [this] { return stop; })) {
      lock.unlock();
      check();
      lock.lock();
    }
    ended = true;
    cv.notify_all();
  }
};

MoveWatcher::MoveWatcher(std::shared_ptr<RoundFollower> follower, std::function<CommPtr()> current_group,
                         Duration period)
    : state_(std::make_shared<State>()) {
  state_->follower = std::move(follower);
  state_->current_group = std::move(current_group);
  state_->period = period;
  state_->thread = std::thread([s = state_] { s->run(); });
}

MoveWatcher::~MoveWatcher() { stop(Duration(2000)); }

bool MoveWatcher::stop(Duration bound) {
  std::unique_lock<std::mutex> lock(state_->mu);
  // Once joined or detached, at once: the destructor after a stop at exit that timed out must
  // not wait its whole bound again for a thread still in a hung store request.
  if (state_->released) return state_->ended;
  state_->stop = true;
  state_->cv.notify_all();
  const bool ended = state_->cv.wait_for(lock, bound, [this] { return state_->ended; });
  if (state_->released) return ended;  // a concurrent stop() took the thread meanwhile
  state_->released = true;
  lock.unlock();
  // Past the bound the thread is in a store request: it ends alone when that returns, holding
  // its State, and the process may exit before that.
  if (ended)
    state_->thread.join();
  else
    state_->thread.detach();
  return ended;
}

}  // namespace gz::comm
