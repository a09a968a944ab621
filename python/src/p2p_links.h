// Point-to-point for the "gz" process group: c10d's isend/irecv are independent asynchronous ops
// (batch_isend_irecv posts a receive before the matching send on both sides), so they cannot share
// the one in-order progress thread of the group's collectives. Every (peer, direction) gets a link:
// a two-rank communicator, created on first use through the group's store, driven by its own
// thread. Sends and receives to different peers and in opposite directions progress
// independently; messages from one rank to another stay in issue order (tags must match in order).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "gz/comm/communicator.h"
#include "gz/comm/work.h"
#include "gz/store/store.h"

namespace gz::python {

/// @brief The point-to-point links of one group member.
class P2PLinks {
 public:
  /// @brief Op body, run on the link's thread with the link's communicator (rank 0 = the sender).
  using Body = std::function<void(comm::Communicator&, const comm::OpOptions&)>;

  /// @brief `store`: the group's store (links meet under "gz_p2p/<src>-<dst>/"); `backend` and
  /// `timeout` as the group's communicator.
  P2PLinks(std::shared_ptr<Store> store, int rank, std::string backend, Duration timeout);
  /// @brief Aborts what is still queued or running and joins every link's thread.
  ~P2PLinks();
  P2PLinks(const P2PLinks&) = delete;
  P2PLinks& operator=(const P2PLinks&) = delete;

  /// @brief Queue `body` on the link to (sending) or from (receiving) `peer`. The Work finishes
  /// once body returned, with its error if it threw; a link whose communicator could not be
  /// created (the peer never came within the op's deadline) fails every op queued on it.
  comm::WorkPtr submit(int peer, bool sending, const comm::OpOptions& o, Body body);
  /// @brief Fail every queued and running op and every later one.
  void abort(const std::string& reason);

 private:
  struct Link;
  Link& link(int peer, bool sending);

  std::shared_ptr<Store> store_;
  int rank_;
  std::string backend_;
  Duration timeout_;
  std::mutex mu_;
  std::map<std::pair<int, bool>, std::unique_ptr<Link>> links_;
  std::string aborted_;  // guarded by mu_: non-empty once abort() was called
};

}  // namespace gz::python
