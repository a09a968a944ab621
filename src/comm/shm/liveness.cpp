#include "comm/shm/liveness.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>
#include <set>

#include "gz/core/error.h"

namespace gz::comm::shm {

// Every live RankLock of this process, so a forked child can close its copies of their
// descriptors. The mutex is held across fork() (prepare/parent/child handlers) so the child never
// sees the set half-updated.
struct RankLockRegistry {
  static std::mutex& mu() {
    static auto* m = new std::mutex;  // leaked: fork handlers may run during static destruction
    return *m;
  }
  static std::set<RankLock*>& locks() {
    static auto* s = new std::set<RankLock*>;
    return *s;
  }
  static void install_fork_handlers() {
    static std::once_flag once;
    std::call_once(once, [] {
      pthread_atfork([] { mu().lock(); }, [] { mu().unlock(); },
                     [] {
                       // The child shares the parent's open file descriptions: closing its copy
                       // leaves the parent's lock in place, and the parent's death releases it.
                       for (RankLock* l : locks()) {
                         if (l->fd_ >= 0) close(l->fd_);
                         l->fd_ = -1;
                       }
                       mu().unlock();
                     });
    });
  }
};

namespace {

struct flock byte_of(int rank, short type) {
  struct flock fl {};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = rank;
  fl.l_len = 1;
  fl.l_pid = 0;  // required by the OFD commands
  return fl;
}

}  // namespace

RankLock::RankLock(const std::string& segment_name, int rank) {
  RankLockRegistry::install_fork_handlers();
  // Registered before the descriptor exists, so no fork in between leaves a child holding it.
  std::lock_guard<std::mutex> lock(RankLockRegistry::mu());
  // O_CLOEXEC: an exec'd child (a tool the rank starts) must not inherit the lock either.
  const int fd = shm_open(segment_name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) throw SystemError("shm: cannot open " + segment_name + " for the liveness lock", errno);
  struct flock fl = byte_of(rank, F_WRLCK);
  if (fcntl(fd, F_OFD_SETLK, &fl) != 0) {
    const int err = errno;
    close(fd);
    if (err == EAGAIN || err == EACCES)
      GZ_THROW(InvalidArgument, "shm: rank ", rank, " of segment ", segment_name,
               " is already held by another communicator (two processes with the same rank?)");
    throw SystemError("shm: cannot lock byte " + std::to_string(rank) + " of " + segment_name, err);
  }
  fd_ = fd;
  RankLockRegistry::locks().insert(this);
}

RankLock::~RankLock() {
  std::lock_guard<std::mutex> lock(RankLockRegistry::mu());
  RankLockRegistry::locks().erase(this);
  if (fd_ >= 0) close(fd_);  // releases the lock: peers see this rank as gone
}

bool RankLock::peer_holds(int peer) const {
  if (fd_ < 0) return true;  // a forked child's copy: it has no say about its parent's group
  struct flock fl = byte_of(peer, F_WRLCK);
  if (fcntl(fd_, F_OFD_GETLK, &fl) != 0) return true;
  return fl.l_type != F_UNLCK;
}

}  // namespace gz::comm::shm
