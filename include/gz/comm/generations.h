// One job's communicator across in-place recoveries (gzrun --recovery in-place): when a rank is
// lost, the survivors abort their communicator and meet its replacement in the next generation,
// each generation under its own store prefix, with unchanged ranks and size.
#pragma once

#include <memory>
#include <string>

#include "gz/comm/factory.h"

namespace gz::comm {

/// @brief The communicators of one group, generation after generation.
///
/// Generation g's members meet under the store prefix "g<g>". Each rank claims its slot in a
/// generation ("slots/<g>/<rank>", one store add) before it joins; a slot already claimed means
/// that this rank's predecessor (a process now lost) joined g, so the rank tries g + 1. A fresh
/// process (the first start or a replacement) therefore joins the lowest generation its rank has
/// not joined yet, and survivors the one after their own: they meet there without any other
/// coordination. Ranks and size never change (a lost node is the launcher's restart path).
class Generations {
 public:
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

 private:
  CommPtr join_from(int first);

  CommOptions base_;
  int generation_ = -1;
};

}  // namespace gz::comm
