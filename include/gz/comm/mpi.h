// MPI backend (OpenMPI or any MPI-3 library): ranks launched by mpirun. Compiled only when CMake
// found MPI (GZ_HAVE_MPI).
#pragma once

#include <memory>

#include "gz/comm/communicator.h"

namespace gz::comm {

/// @brief Knobs of the MPI backend.
struct MpiOptions {
  /// @brief Per-op deadline. MPI collectives cannot be cancelled: ops are issued non-blocking
  /// (MPI_I*) and polled; past the deadline the op throws gz::TimeoutError and the communicator
  /// refuses further ops (the abandoned request may still write the caller's buffer).
  Duration timeout = default_timeout();
};

/// @brief Communicator over MPI_COMM_WORLD. Calls MPI_Init_thread once if MPI is not initialised
/// yet (and MPI_Finalize at exit). `rank` and `size` must match the MPI world (InvalidArgument
/// otherwise): they are the caller's view of the job, checked against what mpirun says.
CommPtr create_mpi_communicator(int rank, int size, const MpiOptions& options = {});

/// @brief True when this process was started by mpirun/mpiexec (OpenMPI or PMI variables).
bool launched_by_mpirun();

}  // namespace gz::comm
