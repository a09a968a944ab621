// Sending a snapshot in chunks, each its own op with its own deadline, so a payload of gigabytes
// over a slow link is not one op under one op's timeout: broadcast to the ranks whose node lost
// it, or point-to-point (a ZeRO rank's shard to its buddy on another node, and back on restore).
#pragma once

#include <cstddef>
#include <string>

#include "gz/comm/communicator.h"

namespace gz::train {

/// @brief Default chunk of the transfers below: 32 MiB, a fraction of a second at 1 Gbit/s.
constexpr size_t kSnapshotChunkBytes = size_t{32} << 20;
/// @brief The point-to-point tag of snapshot transfers (no other op of the group uses it).
constexpr int kSnapshotTag = 0x534e;  // "SN"

/// @brief Collective: every rank's `bytes` becomes root's. The size goes first, then the bytes in
/// chunks of at most `chunk_bytes`, each a broadcast with the group's op timeout of its own: a
/// payload may take as long as the link needs, while no chunk may stall longer than one timeout.
void broadcast_bytes(comm::Communicator& group, std::string& bytes, int root,
                     size_t chunk_bytes = kSnapshotChunkBytes);

/// @brief Point-to-point to `to`: the size, then the bytes in chunks, each a send with the group's
/// op timeout (tag kSnapshotTag). recv_bytes() on `to` receives them.
void send_bytes(comm::Communicator& group, const std::string& bytes, int to,
                size_t chunk_bytes = kSnapshotChunkBytes);
/// @brief What send_bytes() on `from` sent (the same `chunk_bytes`).
std::string recv_bytes(comm::Communicator& group, int from, size_t chunk_bytes = kSnapshotChunkBytes);

/// @brief Sends `*out` to `to` (none when null) and returns what `from` sent (empty when `from` <
/// 0), in the order `send_first` says. In a ring of such exchanges over nodes (node n sends to
/// n + 1 and receives from n - 1, or the reverse), even nodes sending first and odd ones receiving
/// first cannot deadlock, also with an odd number of nodes, even where a send waits for its
/// receiver (large payloads always do).
std::string exchange_bytes(comm::Communicator& group, const std::string* out, int to, int from,
                           bool send_first, size_t chunk_bytes = kSnapshotChunkBytes);

}  // namespace gz::train
