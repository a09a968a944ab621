// One job's communicator across in-place recoveries (gzrun --recovery in-place): when a rank is
// lost, the survivors abort their communicator and meet its replacement in the next generation,
// each generation under its own store prefix, with unchanged ranks and size.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "gz/comm/factory.h"
#include "gz/store/round_move.h"

namespace gz::comm {

/// @brief The communicators of one group, generation after generation.
///
/// Generation g's members meet under the store prefix "g<g>". Each rank claims its slot in a
/// generation ("slots/<g>/<rank>", one store add) before it joins; a slot already claimed means
/// that this rank's predecessor (a process now lost) joined g, so the rank tries g + 1. A fresh
/// process (the first start or a replacement) therefore joins the lowest generation its rank has
/// not joined yet, and survivors the one after their own: they meet there without any other
/// coordination. Ranks and size change only when a mover (set_mover) places this process in
/// another group: the launcher moved the job to a new round (a node lost or admitted). With a
/// mover, a generation's fate is settled once ("fate/<g>", one compare-and-set): "formed" by a
/// member that saw every slot claimed, or "abandoned" by a member that leaves it for the new
/// round after claiming its slot; then the others wait for their own move, not for it.
class Generations {
 public:
  /// @brief This process's place after the launcher moved the job: rank, size and the new
  /// group's store (its generations start again at 0).
  struct Placement {
    int rank = 0;
    int size = 1;
    std::shared_ptr<Store> store;
  };
  /// @brief The launcher's moves of this process, asked while a generation's members are
  /// awaited: `pending` says whether one is there (a store check, no waiting), `follow` follows
  /// it (collective in the new run) and returns the placement.
  struct Mover {
    std::function<bool()> pending;
    std::function<Placement()> follow;
  };

  /// @brief `base.store` is the group's store; every member passes the same one, and each
  /// generation's communicator is built from `base` on a prefix of it.
  explicit Generations(CommOptions base);

  /// @brief Collective: the first communicator of this process (see the class comment).
  CommPtr join();
  /// @brief Collective with the other survivors and the replacements: aborts `old` (peers still
  /// in its ops get gz::Aborted naming `why`), then joins the next generation. Returns the new
  /// communicator; throws when the members do not meet within the options' timeout.
  CommPtr rejoin(const CommPtr& old, const std::string& why);
  /// @brief The generation of the last communicator returned (-1 before join()).
  int generation() const { return generation_; }
  /// @brief Set before join(): where to look for a move while members are awaited.
  void set_mover(Mover mover) { mover_ = std::move(mover); }

 private:
  CommPtr join_from(int first);
  /// @brief True when every rank claimed its slot in generation g; false when the mover placed
  /// this process elsewhere (base_ is the new group then). Throws TimeoutError at the timeout.
  bool await_members(int g);
  /// @brief True when the mover placed this process elsewhere (base_ is the new group then).
  bool moved();
  /// @brief Make `p` this process's group (its generations start again at 0).
  void adopt(Placement p);
  /// @brief Settle generation g's fate as `fate` unless it is settled already; returns it.
  std::string settle(int g, const std::string& fate);

  CommOptions base_;
  Mover mover_;
  int generation_ = -1;
};

/// @brief A mover that follows the launcher's moves of the job (RoundFollower): the group's
/// store in the new run is `group` under the run's keys (as gz::init builds it in the first).
Generations::Mover follow_moves(std::shared_ptr<RoundFollower> follower, const std::string& group,
                                Duration timeout);

}  // namespace gz::comm
