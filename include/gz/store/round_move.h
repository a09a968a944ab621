// A launcher's notice to a live worker that the job moved to a new round with the worker in it
// (gzrun --recovery in-place, elastic jobs: a node was lost or admitted). gzrun writes it into
// the old round's run keys; the worker's group follows it instead of the process restarting.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "gz/store/rendezvous.h"
#include "gz/store/store.h"

namespace gz {

/// @brief Where a worker that keeps its process continues: the new round's run and its place.
struct RoundMove {
  int round = 0;
  std::string run_id;  ///< the new round's GZ_RUN_ID (its keys: run_prefix(run_id))
  int rank = 0;
  int world_size = 1;
  int node_rank = 0;
  int num_nodes = 1;
  /// @brief Why the job moved (the failure or admission that ended the old round).
  std::string why;
};

/// @brief The key, among the old round's run keys, of the move of the worker that was `rank`.
std::string round_move_key(int rank);
/// @brief The key, among a run's keys, by which the worker of `rank` says it follows moves now
/// (RoundFollower::accept): gzrun moves a node's workers only when each of them set it.
/// Values: "1" accepted, "0" withdrawn, "claimed" (claim_round_moves: a move notice follows, or
/// release_round_moves sets "1" again). Both sides change it by compare-and-set only.
std::string round_accepts_key(int rank);
/// @brief gzrun's half of the handshake, before it joins the next round: claims the accepts keys
/// of `ranks` in `run` (a run's keys), all or none. False when one of them does not accept now
/// (withdrew, never accepted): those claimed are released again. A claimed worker cannot
/// withdraw (RoundFollower::accept(false) waits) until its notice is written or it is released.
bool claim_round_moves(Store& run, const std::vector<int>& ranks);
/// @brief Whether the worker of `rank` accepts moves now (and is not claimed): one store check.
bool round_accepts(Store& run, int rank);
/// @brief Gives the claims of `ranks` back (the move did not happen); a worker waiting to
/// withdraw then does.
void release_round_moves(Store& run, const std::vector<int>& ranks);
/// @brief One line; decode_round_move() reads it back.
std::string encode_round_move(const RoundMove& m);
/// @brief Throws gz::Error naming the text when it is not a move.
RoundMove decode_round_move(const std::string& text);

/// @brief A worker's view of the rounds it lives through: its current run and rank, the move
/// out of it when the launcher wrote one, and the rendezvous of the next run. Thread-safe (a
/// watcher thread polls while the training thread regroups).
class RoundFollower {
 public:
  /// @brief `base`: the job's store; `world`: this worker's place in run `run_id`.
  RoundFollower(std::shared_ptr<Store> base, std::string run_id, WorldInfo world);
  /// @brief The move out of the current run, if the launcher wrote one (one store check).
  std::optional<RoundMove> poll();
  /// @brief Make `m` (from poll()) the current run and meet its other ranks there (collective
  /// with them, and with the new round's fresh processes, which meet in gz::rendezvous()); a
  /// move out of that run while they meet is followed in turn, and `m` is then that move.
  /// Returns the final run's store.
  /// Throws gz::TimeoutError when they do not meet by `deadline` (the current run stays the one
  /// it left: a retry's poll() finds the same move, and meet() counts this rank once).
  std::shared_ptr<Store> follow(RoundMove& m, Deadline deadline);
  /// @brief Whether this worker can adopt a new rank and world now; announced in the current
  /// run's keys (round_accepts_key) and in every run it follows into. Withdrawing while gzrun
  /// holds a claim on this worker (claim_round_moves) waits until `deadline` for its outcome:
  /// released, it withdraws; moved, it throws gz::Error naming the move (the worker cannot
  /// follow it now and must not exit as if the job had ended); neither, gz::TimeoutError.
  void accept(bool on, Deadline deadline);
  /// @brief The current run's id and this worker's rank in it.
  std::string run_id() const;
  int rank() const;

 private:
  std::shared_ptr<Store> base_;
  mutable std::mutex mu_;
  std::string run_id_;
  WorldInfo world_;
  std::shared_ptr<Store> run_;
  bool accepts_ = false;
};

}  // namespace gz
