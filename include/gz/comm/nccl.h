// NCCL backend: GPU collectives on device pointers. Declared always, defined only in builds
// configured with -DGZ_WITH_NCCL=ON on a machine with the CUDA toolkit and NCCL (GZ_HAVE_NCCL); the
// CPU build never needs CUDA. create_communicator("nccl") reports a clear InvalidArgument where it
// is not built. No CUDA type appears here: streams travel as void* (a cudaStream_t).
#pragma once

#include <memory>

#include "gz/comm/communicator.h"
#include "gz/store/store.h"

namespace gz::comm {

/// @brief How to build one rank's NCCL communicator.
struct NcclOptions {
  /// @brief Deadline of init and of every op; on expiry the communicator is aborted.
  Duration timeout = default_timeout();
  /// @brief CUDA device of this rank. -1 = choose: LOCAL_RANK (gzrun, torchrun), else
  /// OMPI_COMM_WORLD_LOCAL_RANK (mpirun), else rank % device count; a process that sees exactly
  /// one device (CUDA_VISIBLE_DEVICES per rank) uses it. See choose_cuda_device().
  int device = -1;
  /// @brief The caller's CUDA stream (cudaStream_t; nullptr = the legacy default stream). Each op
  /// starts after the work queued on it so far and queues a wait for the op's end on it.
  void* stream = nullptr;
};

/// @brief Create the NCCL communicator of `rank` among `size` ranks; collective over all ranks.
///
/// Rank 0 publishes the ncclUniqueId through `store` (one key per communicator a rank creates on
/// that store); the others read it within the timeout. The NCCL communicator is non-blocking
/// (ncclCommInitRankConfig, blocking = 0), so init and every op are polled against their deadline.
/// Buffers passed to ops are device pointers of the chosen device. Each op runs on a private
/// stream ordered after the caller's stream (event record + wait), and returns when its end
/// event has completed. On timeout, on an NCCL error, or on abort() the NCCL communicator is
/// aborted (ncclCommAbort): the op fails with TimeoutError / PeerError / Aborted and every later
/// op with Aborted. send/recv match by (peer, tag), in order per tag, like the other backends.
CommPtr create_nccl_communicator(int rank, int size, std::shared_ptr<Store> store, const NcclOptions& options);
/// @brief Same with default options and the given timeout.
CommPtr create_nccl_communicator(int rank, int size, std::shared_ptr<Store> store, Duration timeout);

/// @brief Set the caller's CUDA stream (cudaStream_t, nullptr = legacy default stream) of an NCCL
/// communicator, for the ops issued after this call. Throws InvalidArgument for other backends.
void set_nccl_stream(Communicator& comm, void* stream);

/// @brief The CUDA device an NCCL communicator runs on; InvalidArgument for other backends.
int nccl_device(const Communicator& comm);

}  // namespace gz::comm
