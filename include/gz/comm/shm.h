// Shared-memory backend for ranks on one machine (ours): POSIX shm, chunked and pipelined.
#pragma once

#include <memory>
#include <string>

#include "gz/comm/communicator.h"
#include "gz/store/store.h"

namespace gz::comm {

/// @brief Knobs of the shm backend. Zero means "auto" (environment GZ_SHM_* or built-in default).
struct ShmOptions {
  Duration timeout = default_timeout();
  /// @brief Pipeline chunk size in bytes; tests set it small to cover multi-chunk paths.
  size_t chunk_bytes = 0;
  /// @brief Spin this long before blocking in the kernel (futex) while waiting for peers.
  int spin_us = -1;
};

/// @brief Create the shm communicator of `rank` among `size` ranks on this machine. Collective:
/// every rank calls it with the same store (already namespaced for this group).
CommPtr create_shm_communicator(int rank, int size, std::shared_ptr<Store> store,
                                const ShmOptions& options = {});

}  // namespace gz::comm
