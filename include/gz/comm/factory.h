// Creating communicators by backend name. The only place that knows every backend.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "gz/comm/communicator.h"
#include "gz/store/store.h"

namespace gz::comm {

/// @brief How to build a communicator for one rank.
struct CommOptions {
  /// @brief "auto" (shm inside a node; hierarchical shm + gloo/mpi across nodes), "shm", "gloo",
  /// "mpi", "nccl". GZ_BACKEND overrides "auto" when set.
  std::string backend = "auto";
  int rank = 0;
  int size = 1;
  /// @brief Rendezvous store shared by all ranks (already namespaced for this group).
  std::shared_ptr<Store> store;
  Duration timeout = default_timeout();
  /// @brief Identifies the machine for grouping ranks into nodes; empty = GZ_NODE_ID, else
  /// the hostname. Ranks with equal node ids share memory.
  std::string node_id;
  /// @brief The group's name in flight-recorder dumps; the same on every rank. Empty = "comm<n>"
  /// for the n-th communicator built on this store.
  std::string name;
  /// @brief Network interface / address for TCP transports (empty = GZ_SOCKET_IFNAME or GZ_IFACE, else loopback/hostname).
  std::string iface;
};

/// @brief Build and connect a communicator; collective over all `size` ranks.
CommPtr create_communicator(const CommOptions& options);

/// @brief Names of the backends compiled into this build ("shm", "gloo", ...).
std::vector<std::string> available_backends();

}  // namespace gz::comm
