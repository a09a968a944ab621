// What every op carries with it: its own deadline and tag (as Gloo's algorithm options structs do).
#pragma once

#include <optional>

#include "gz/core/deadline.h"

namespace gz::comm {

/// @brief Per-op options: a deadline and a tag that belong to this op alone.
///
/// Nothing here changes the communicator. A composed op (the hierarchical backend, a DDP bucket
/// hook) passes what is left of its own deadline to the ops it runs instead of overwriting their
/// communicator's timeout, so one caller's deadline never leaks into another's op.
struct OpOptions {
  /// @brief Time the op may take, counted from when it is issued; zero means the communicator's
  /// default timeout.
  Duration timeout{0};
  /// @brief Absolute deadline; when set it wins over `timeout`.
  std::optional<Deadline> deadline;
  /// @brief Point-to-point matching tag: a recv takes the sends of its peer with the same tag, in
  /// order. Collectives are matched by their sequence number and ignore it.
  int tag = 0;

  /// @brief Options whose deadline is `d` (what is left of a caller's deadline).
  static OpOptions until(Deadline d) {
    OpOptions o;
    o.deadline = d;
    return o;
  }
  /// @brief Options with a timeout of `t` from when the op is issued.
  static OpOptions within(Duration t) {
    OpOptions o;
    o.timeout = t;
    return o;
  }
  /// @brief Options with point-to-point tag `t`.
  static OpOptions tagged(int t) {
    OpOptions o;
    o.tag = t;
    return o;
  }
  /// @brief The absolute deadline of an op issued now, given the communicator's default timeout.
  Deadline resolve(Duration default_timeout) const {
    if (deadline) return *deadline;
    return Deadline::after(timeout.count() > 0 ? timeout : default_timeout);
  }
};

}  // namespace gz::comm
