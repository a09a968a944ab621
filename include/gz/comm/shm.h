// Shared-memory backend for ranks on one machine (ours): POSIX shm, chunked and pipelined.
#pragma once

#include <memory>
#include <string>

#include "gz/comm/communicator.h"
#include "gz/store/store.h"

namespace gz::comm {

/// @brief Knobs of the shm backend. Zero means "auto" (environment GZ_SHM_* or built-in default).
///
/// Environment: GZ_SHM_CHUNK_BYTES (pipeline slot, default 512 KiB; rank 0's value wins),
/// GZ_SHM_SPIN_US (spin before futex, default 50), GZ_SHM_SMALL_BYTES (all-reduce messages up to
/// this size take the one-step latency path, default 16 KiB; rank 0's value wins),
/// GZ_SHM_STREAM_BYTES (outputs at least this big are written with non-temporal stores, 16 MiB),
/// GZ_SHM_ZERO_COPY=0 (alloc_buffer returns ordinary memory: every all-reduce stages through slots).
/// The segment (/dev/shm/gz-shm-<id>) holds 3 slots per rank plus small point-to-point channels;
/// its name is unlinked as soon as every rank has mapped it, so nothing is left after a crash.
struct ShmOptions {
  Duration timeout = default_timeout();
  /// @brief Pipeline chunk size in bytes; tests set it small to cover multi-chunk paths.
  size_t chunk_bytes = 0;
  /// @brief Spin this long before blocking in the kernel (futex) while waiting for peers.
  int spin_us = -1;
  /// @brief alloc_buffer() maps every rank's block into every rank (one /dev/shm object per rank
  /// and call), so their all-reduces skip the slots. Off here or on any rank: ordinary memory.
  bool zero_copy = true;
};

/// @brief Create the shm communicator of `rank` among `size` ranks on this machine. Collective:
/// every rank calls it with the same store (already namespaced for this group).
CommPtr create_shm_communicator(int rank, int size, std::shared_ptr<Store> store,
                                const ShmOptions& options = {});

}  // namespace gz::comm
