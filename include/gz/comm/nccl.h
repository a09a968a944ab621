// NCCL backend seam: GPU collectives on device pointers. Declared always, defined only in builds
// configured with -DGZ_WITH_NCCL=ON on a CUDA machine (GZ_HAVE_NCCL); the CPU build never needs
// CUDA. create_communicator("nccl") reports a clear InvalidArgument where it is not built.
#pragma once

#include <memory>

#include "gz/comm/communicator.h"
#include "gz/store/store.h"

namespace gz::comm {

/// @brief Create the NCCL communicator of `rank` among `size` ranks on the current CUDA device.
/// Rank 0 publishes the ncclUniqueId through `store`; buffers passed to ops are device pointers.
/// Ops run on a private stream and are polled against the timeout; on timeout or abort() the
/// NCCL communicator is aborted (ncclCommAbort) and cannot be used again.
CommPtr create_nccl_communicator(int rank, int size, std::shared_ptr<Store> store, Duration timeout);

}  // namespace gz::comm
