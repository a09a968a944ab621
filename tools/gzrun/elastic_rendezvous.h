// Elastic membership (`gzrun --nnodes MIN:MAX`): the nodes of each round are decided in the store,
// node ranks are assigned there, and nodes that come later are admitted at the next round.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "job_monitor.h"
#include "joiners.h"
#include "options.h"
#include "round_info.h"

namespace gz {
class Store;
}

namespace gz::launcher {

/// @brief The rendezvous of an elastic job, in the store every gzrun of the job shares.
///
/// Keys (all under "gzrun/"; r is a round number):
///   gzrun/seq                 counter: each gzrun takes one number when it first joins
///   gzrun/round               the round now being formed or run (absent = 0)
///   gzrun/round<r>/joined     "seq:host:id;" appended by every gzrun that wants to run in r
///   gzrun/round<r>/members    the members of r, sorted by seq (node rank = position); written
///                             once, with compare_set, by whichever gzrun first sees r complete
///   gzrun/round<r>/restarts   failure restarts used before r (written by the nodes moving to r)
///   gzrun/ended               "done|..." or "failed|reason": the job is over, waiting nodes leave
///
/// Run ids (GZ_RUN_ID, the workers' key prefix) are "<launch_id() of round 0's node 0>-<r>".
///
///   gzrun/waiting/<seq>       counter each waiting gzrun adds 1 to on every poll (joiners.h)
///
/// A round r is complete when gzrun/round is r and either MAX live nodes joined it, or at least
/// MIN did and the join window passed since the observer first saw MIN. Live: the joiner's beat
/// was seen to move within the lease (joiners.h), so a node that gave up or was killed while
/// waiting is never made a member, nor counted as waiting. Nodes that joined after the members
/// were written are not in them: they join r+1 and wait there, which the running round's monitors
/// notice (JobMonitor, admit record) so that every node moves to r+1 together.
class ElasticRendezvous {
 public:
  using Cancelled = std::function<bool()>;
  /// @brief `store`: a client whose every operation is bounded (the heartbeat timeout); it must
  /// outlive this object. `me`: "host:id" (gzrun's launch_id() last), naming this node in the store.
  ElasticRendezvous(const LaunchOptions& options, Store& store, std::string me);

  /// @brief Join the first round that still takes nodes and wait until it starts. Returns this
  /// node's place, or job_done when the job finished meanwhile. Throws gz::TimeoutError (the round
  /// did not reach MIN nodes within --rdzv-timeout, naming how many came), gz::Aborted (cancelled),
  /// gz::Error (the job ended: its reason).
  RoundInfo join(const Cancelled& cancelled);
  /// @brief After round `r` ended with `f` (a failure, or admit): move the job to round r+1 and
  /// record its restart count (f counts unless it is admit). Idempotent across nodes.
  void advance(const RoundInfo& r, const JobFailure& f);
  /// @brief Why the job cannot go on after `f` ended round `r` (a lost node leaves fewer than MIN,
  /// counting live nodes already waiting: up to the lease is spent seeing them beat), or "" when it
  /// can.
  std::string cannot_continue(const RoundInfo& r, const JobFailure& f);
  /// @brief Record that the job is over (first call wins), so waiting nodes leave: exit 0 when
  /// `success`, else with `reason`. Store errors are ignored (the job ends anyway).
  void end_job(const std::string& reason, bool success);

 private:
  /// @brief Value of key, "" when missing: one round trip.
  std::string peek(const std::string& key);
  int current_round();
  void append_me(int round);
  /// @brief Write round r's members (first writer wins) from its joined list.
  void close_round(int round, const std::vector<std::string>& joined);
  /// @brief This node's place in round q, whose members (value and parsed) include it at `node_rank`.
  RoundInfo placed(int q, const std::string& members, const std::vector<std::string>& list, int node_rank);
  /// @brief When this gzrun first saw MIN live nodes in a round (the join window runs from there).
  struct JoinWindow {
    bool open = false;
    std::chrono::steady_clock::time_point start{};
  };
  /// @brief Round q is being formed: count its live joiners (`joined`) and close it when complete
  /// (MAX live, or MIN live for the join window). Returns true when it closed.
  bool try_close(int q, JoinerBeats& beats, JoinWindow& window, int& joined);

  const LaunchOptions& o_;
  Store& s_;
  std::string me_;
  long long seq_ = -1;
  std::string entry_;  ///< "seq:me"
  std::string job_;
};

}  // namespace gz::launcher
