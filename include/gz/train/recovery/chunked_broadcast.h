// Sending a snapshot to the ranks whose node lost it: in chunks, each its own op with its own
// deadline, so a payload of gigabytes over a slow link is not one op under one op's timeout.
#pragma once

#include <cstddef>
#include <string>

#include "gz/comm/communicator.h"

namespace gz::train {

/// @brief Default chunk of broadcast_bytes(): 32 MiB, a fraction of a second at 1 Gbit/s.
constexpr size_t kSnapshotChunkBytes = size_t{32} << 20;

/// @brief Collective: every rank's `bytes` becomes root's. The size goes first, then the bytes in
/// chunks of at most `chunk_bytes`, each a broadcast with the group's op timeout of its own: a
/// payload may take as long as the link needs, while no chunk may stall longer than one timeout.
void broadcast_bytes(comm::Communicator& group, std::string& bytes, int root,
                     size_t chunk_bytes = kSnapshotChunkBytes);

}  // namespace gz::train
