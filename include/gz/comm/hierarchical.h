// Hierarchical communicator: composes a node-local communicator (shm) with inter-node ones
// (gloo or mpi). An algorithm over backends, kept apart from the backends themselves.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gz/comm/communicator.h"
#include "gz/store/store.h"

namespace gz::comm {

/// @brief Where every rank lives. Nodes are numbered by first appearance in rank order, so
/// node 0 holds rank 0; a node's ranks are its "local ranks" 0..n-1 in ascending global rank.
struct NodeLayout {
  std::vector<int> node_of_rank;                 ///< node index of every global rank
  std::vector<std::vector<int>> ranks_of_node;  ///< global ranks of every node, ascending

  /// @brief Layout from one label per rank (node ids, hostnames, ...).
  static NodeLayout from_labels(const std::vector<std::string>& labels);
  int num_nodes() const { return static_cast<int>(ranks_of_node.size()); }
  /// @brief True when every node has the same number of ranks.
  bool uniform() const;
};

/// @brief Builds one backend communicator: (rank, size, store namespaced for it).
using CommMaker = std::function<CommPtr(int rank, int size, std::shared_ptr<Store> store)>;

/// @brief How the inter-node communicators of a hierarchical one are built.
struct InterMaker {
  CommMaker make;
  /// @brief Its backend's name ("gloo", "mpi"), for backend(); empty = taken from the flat one.
  std::string backend;
  /// @brief True when `make` can build a communicator over any subset of ranks from a store
  /// namespaced for it (Gloo): rails and new_group then connect only their members. False when
  /// sub-groups must be split from one over all ranks (MPI).
  bool any_group = false;
  /// @brief With any_group: also build the communicator over all ranks that point-to-point needs.
  /// Without it each rank connects to its node and its rail only, and send/recv across nodes
  /// throw InvalidArgument. With Gloo (make_flat) its pairs are connected on first use, so it
  /// costs nothing until a rank sends to or receives from another node.
  bool flat = true;
  /// @brief Builds that communicator over all ranks when set (else `make`): it only carries
  /// point-to-point and new_group, so a backend may skip what only collectives need.
  CommMaker make_flat;
};

/// @brief Create the hierarchical communicator of `rank`. Collective over all ranks.
///
/// Builds, under prefixes of `store`: the local communicator of this rank's node with
/// `make_local`, a flat communicator over all ranks with `make_inter`, and from the flat one the
/// "rails" (ranks with the same local rank on every node; only rail 0 = node leaders when nodes
/// have different rank counts). allreduce on uniform layouts: local reduce-scatter, per-rail
/// all-reduce of each shard, local all-gather; otherwise local reduce, leaders' all-reduce,
/// local broadcast. send/recv and new_group use the flat communicator.
CommPtr create_hierarchical_communicator(int rank, const NodeLayout& layout, std::shared_ptr<Store> store,
                                         const CommMaker& make_local, const CommMaker& make_inter,
                                         Duration timeout);
/// @brief As above, with the inter-node maker's capabilities (see InterMaker::any_group).
CommPtr create_hierarchical_communicator(int rank, const NodeLayout& layout, std::shared_ptr<Store> store,
                                         const CommMaker& make_local, const InterMaker& inter, Duration timeout);

}  // namespace gz::comm
