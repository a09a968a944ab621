// The process-wide default group of the LibTorch front ends (Horovod-style gz::init()).
// Everything else in gz/torch takes an explicit comm::CommPtr; nullptr means this default group.
#pragma once

#include <string>

#include "gz/comm/communicator.h"
#include "gz/core/deadline.h"

namespace gz {

/// @brief How gz::init() builds the default group.
struct ProcessGroupOptions {
  /// @brief Communicator backend: "auto", "shm", "gloo", "mpi", "nccl" (see comm::CommOptions).
  std::string backend = "auto";
  /// @brief "" / "env://" (launcher variables: gzrun, torchrun, mpirun, srun), "tcp://host:port",
  /// "file:///path".
  std::string init_method;
  int rank = -1;        ///< required with tcp:// and file:// unless the environment has it
  int world_size = -1;  ///< likewise
  Duration timeout = default_timeout();
  /// @brief Build the group so that regroup() can replace it (in-place recovery). Also on when
  /// the environment has GZ_RECOVERY=in_place (gzrun --recovery in-place).
  bool regroupable = false;
};

/// @brief Rendezvous (from the environment or init_method), then build the default group.
/// Throws gz::Error when already initialized.
void init(const ProcessGroupOptions& options = {});
/// @brief Adopt an existing communicator as the default group (custom setups, tests).
/// local_rank/local_size default to rank/size.
void init(comm::CommPtr group, int local_rank = -1, int local_size = -1);
/// @brief In-place recovery: abort the default group (peers still in its ops get gz::Aborted
/// naming `why`) and replace it by its next generation, with the same ranks and size, which the
/// other survivors and the launcher's replacements of the lost processes join (collective over
/// them; gz/comm/generations.h); or, when gzrun moved an elastic job to a new round (see
/// accept_moves()), by that round's group, with the rank and size gzrun gave this process. Returns the new
/// default group. Throws gz::Error unless init() built the group regroupable, and gz::TimeoutError when the
/// members do not meet in time.
comm::CommPtr regroup(const std::string& why);
/// @brief Whether regroup() can replace the default group.
bool can_regroup();
/// @brief Elastic jobs under gzrun --recovery in-place: whether this process adopts a new rank
/// and world size now, when gzrun moves the job to a new round (a node lost or admitted) and
/// regroup() returns a group of another shape. gzrun moves a node's workers only while each of
/// them said yes, and stops and restarts them otherwise. The Trainer says yes while it trains.
/// accept_moves(false) blocks while gzrun holds a claim on this worker (it is joining the next
/// round with it), at most ProcessGroupOptions::timeout (GZ_TIMEOUT_S): it returns once gzrun
/// released the claim, or at that deadline, having taken it back (gzrun then restarts the
/// workers instead); it throws gz::MovedError when gzrun committed the move first (this worker
/// must fail, not exit as if the job had ended), and the store's errors (gz::Error) when the
/// store fails. Returns false (and does nothing) when the default group does not follow moves.
bool accept_moves(bool on);
/// @brief Drop the default group and the rendezvous store. Safe to call when not initialized.
void shutdown();
/// @brief Whether init() succeeded and shutdown() was not called since.
bool is_initialized();
/// @brief Rank in the default group; throws gz::Error before init().
int rank();
/// @brief Size of the default group; throws gz::Error before init().
int size();
/// @brief Rank among the processes of this node; throws gz::Error before init().
int local_rank();
/// @brief Number of processes on this node; throws gz::Error before init().
int local_size();
/// @brief rank() == 0.
bool is_main_process();
/// @brief The default group; throws gz::Error before init().
comm::CommPtr default_group();
/// @brief `group` itself, or the default group when it is null.
comm::CommPtr resolve_group(const comm::CommPtr& group);

}  // namespace gz
