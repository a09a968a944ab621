// Peer liveness for the shm backend: a lock held for as long as a rank's communicator lives.
#pragma once

#include <string>

namespace gz::comm::shm {

/// @brief This rank's proof of life to its group, and the test of a peer's.
///
/// Every rank opens the group's segment once more (its own open file description) and holds an
/// exclusive OFD lock (fcntl F_OFD_SETLK) on byte `rank` of it. The kernel drops the lock when the
/// description's last descriptor closes: when the process dies by any means (SIGKILL included;
/// before it is reaped) or the rank closes its communicator. A peer is gone when F_OFD_GETLK
/// finds its byte free. Unlike kill(pid, 0), this cannot be fooled by a recycled pid, and it holds
/// across PID namespaces that share /dev/shm: the lock belongs to the open file, not to a number.
///
/// fork() would copy the descriptor into the child and keep a dead parent's lock alive for the
/// child's lifetime (a data-loader worker, say), so children close their copies (pthread_atfork).
class RankLock {
 public:
  /// @brief Open `segment_name` (a /dev/shm name, before it is unlinked) and lock byte `rank`.
  /// Throws gz::InvalidArgument when someone else holds that byte (two processes claim one rank).
  RankLock(const std::string& segment_name, int rank);
  ~RankLock();
  RankLock(const RankLock&) = delete;
  RankLock& operator=(const RankLock&) = delete;

  /// @brief Whether another open file description holds `peer`'s byte, i.e. the peer's
  /// communicator is still open. True when it cannot tell (a wait's deadline still bounds it).
  bool peer_holds(int peer) const;

 private:
  friend struct RankLockRegistry;
  int fd_ = -1;
};

}  // namespace gz::comm::shm
