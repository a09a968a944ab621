// Horovod mode's coordination (Horovod's controller): which tensors every rank has ready, decided
// each cycle by one allgather of ready bitmaps over the name-sorted tensors, so ranks producing
// gradients in different orders neither deadlock nor mix tensors. Runs on the progress thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gz/comm/communicator.h"

namespace gz::horovod {

/// @brief What every rank published in one cycle: a ready flag per tensor and a stall flag.
class CycleReport {
 public:
  CycleReport(size_t tensors, int world) : n_(tensors), world_(world), all_((tensors + 1) * world) {}
  bool has(int rank, size_t tensor) const { return all_[rank * (n_ + 1) + tensor] != 0; }
  /// @brief Ranks that have `tensor` ready.
  int count(size_t tensor) const;
  bool everywhere(size_t tensor) const { return count(tensor) == world_; }
  /// @brief Some rank raised its stall flag (see StallInspector).
  bool any_stall() const;
  /// @brief "1, 3": the ranks that lack `tensor`.
  std::string missing_ranks(size_t tensor) const;
  int world() const { return world_; }

 private:
  friend class Negotiator;
  size_t n_;
  int world_;
  std::vector<uint8_t> all_;  // rank-major: n tensor flags, then the stall flag
};

/// @brief The cycles' exchange over a group.
class Negotiator {
 public:
  Negotiator(comm::Communicator& group, size_t tensors)
      : group_(group), msg_(tensors + 1), report_(tensors, group.size()) {}
  /// @brief Collective: publish `ready` (a flag per tensor) and `stall`; returns every rank's.
  const CycleReport& exchange(const std::vector<uint8_t>& ready, bool stall);
  /// @brief Tensors not `done` that every rank has, in index (name) order: the agreed group.
  static std::vector<size_t> agreed(const CycleReport& report, const std::vector<uint8_t>& done);

 private:
  comm::Communicator& group_;
  std::vector<uint8_t> msg_;
  CycleReport report_;
};

}  // namespace gz::horovod
