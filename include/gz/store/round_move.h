// A launcher's notice to a live worker that the job moved to a new round with the worker in it
// (gzrun --recovery in-place, elastic jobs: a node was lost or admitted). gzrun writes it into
// the old round's run keys; the worker's group follows it instead of the process restarting.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "gz/core/error.h"
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
/// Values: "1" accepted, "0" withdrawn, "claimed" (claim_round_moves: gzrun joins the next round
/// with this worker in it), "moving" (commit_round_moves: the move notice follows, for good).
/// Both sides change it by compare-and-set only:
///   worker: "" -> "1", "0" -> "1" (accept(true)); "1" -> "0", and at its deadline
///           "claimed" -> "0" (accept(false));
///   gzrun:  "1" -> "claimed" (claim), "claimed" -> "1" (release), "claimed" -> "moving" (commit).
/// So a claimed worker that withdraws at its deadline and gzrun committing the move cannot both
/// win: a worker that finds "moving" throws gz::MovedError, and gzrun, finding "0", stops this
/// node's workers (the restart path) instead of writing notices.
std::string round_accepts_key(int rank);
/// @brief gzrun's half of the handshake, before it joins the next round: claims the accepts keys
/// of `ranks` in `run` (a run's keys), all or none. False when one of them does not accept now
/// (withdrew, never accepted): those claimed are released again. A claimed worker's withdrawal
/// (RoundFollower::accept(false)) waits for the release or the commit, or until its deadline.
bool claim_round_moves(Store& run, const std::vector<int>& ranks);
/// @brief Whether the worker of `rank` accepts moves now (and is not claimed): one store check.
bool round_accepts(Store& run, int rank);
/// @brief Gives the claims of `ranks` back (the move did not happen); a worker waiting to
/// withdraw then does.
void release_round_moves(Store& run, const std::vector<int>& ranks);
/// @brief gzrun's last step before it writes the notices: turns each claim of `ranks` into
/// "moving" (final: a withdrawing worker then throws gz::MovedError). False when one of them
/// withdrew at its deadline meanwhile ("0"): gzrun must not write notices then and stops the
/// node's workers; the others are committed all the same (they fail if they withdraw).
/// Repeating it changes nothing (a key found "moving" counts as committed).
bool commit_round_moves(Store& run, const std::vector<int>& ranks);
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
  /// run's keys (round_accepts_key) and in every run it follows into. accept(false) while gzrun
  /// holds a claim on this worker (claim_round_moves) waits, until `deadline` at most, for the
  /// claim's outcome: released, it withdraws; committed ("moving"), it throws gz::MovedError
  /// naming the move (it cannot follow it now and must not exit as if the job had ended); at
  /// the deadline it takes the key back ("claimed" -> "0") and returns withdrawn, unless gzrun
  /// committed first (gz::MovedError then). Store failures throw as the store's calls do.
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

  /// @brief The error of a withdrawal that found this worker committed to a move; names the
  /// move once gzrun wrote it (a short wait).
  MovedError moved_while_withdrawing(int rank);
};

}  // namespace gz
