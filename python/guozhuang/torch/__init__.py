"""Horovod's PyTorch API over Guozhuang's Horovod-mode core: a Horovod script runs after changing
only its import line::

    import guozhuang.torch as hvd      # was: import horovod.torch as hvd
    hvd.init()                         # gzrun, torchrun, mpirun or srun environment
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

CPU tensors. The default group is built by the C++ core's gz::init() (same engines and variables as
the C++ API: GZ_BACKEND, GZ_TIMEOUT_S, ...). Not supported (they raise): Adasum, alltoall, process
sets other than the global one, custom compressors in DistributedOptimizer.
"""
import atexit
import os

from .. import _C
from .compression import BF16Compressor, Compression, Compressor, FP16Compressor, NoneCompressor
from .functions import (Adasum, Average, Max, Min, Product, Sum, allgather, allgather_async, allgather_object,
                        allreduce, allreduce_, allreduce_async, allreduce_async_, alltoall, barrier, broadcast,
                        broadcast_, broadcast_async, broadcast_async_, broadcast_object, poll, synchronize)
from .optimizer import DistributedOptimizer, broadcast_optimizer_state, broadcast_parameters, join
from . import elastic  # noqa: E402,F401  (hvd.elastic.run, hvd.elastic.TorchState)

# A lost peer (gz::PeerError, TimeoutError, Aborted); a RuntimeError. hvd.elastic.run recovers
# from it in place under gzrun --recovery in-place.
HorovodInternalError = _C.HorovodInternalError


def init(comm=None, process_sets=None):
    """Join the job: rendezvous from the launcher's environment (gzrun, torchrun, mpirun, srun; a lone
    process is a world of one). Calling it again does nothing."""
    if comm is not None:
        raise NotImplementedError("guozhuang.torch.init: the comm argument (an MPI communicator) is not supported")
    timeout = float(os.environ.get("GZ_TIMEOUT_S", "0") or 0)
    if _C.hvd_init(os.environ.get("GZ_BACKEND", "auto"), timeout):
        atexit.register(shutdown)


def shutdown():
    """Leave the job (the default group is destroyed)."""
    _C.hvd_shutdown()


def is_initialized():
    return _C.hvd_is_initialized()


def size():
    """Number of ranks."""
    return _C.hvd_size()


def rank():
    """This process's rank in [0, size())."""
    return _C.hvd_rank()


def local_size():
    """Number of ranks on this machine."""
    return _C.hvd_local_size()


def local_rank():
    """This process's rank among those of its machine."""
    return _C.hvd_local_rank()


def cross_size():
    """Number of machines (ranks per machine assumed equal)."""
    return size() // local_size()


def cross_rank():
    """This machine's index (ranks per machine assumed equal)."""
    return rank() // local_size()


def is_homogeneous():
    return True


def mpi_threads_supported():
    return False


def mpi_enabled():
    return False


def mpi_built():
    return False


def gloo_enabled():
    return "gloo" in _C.available_backends()


def gloo_built():
    return gloo_enabled()


def nccl_built():
    return 0


def cuda_built():
    return False


def rocm_built():
    return False


def comm_backend():
    """Guozhuang's engine under the default group: "shm", "gloo", "hier(shm+gloo)", ..."""
    return _C.hvd_comm_backend()


__all__ = [
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank", "cross_size", "cross_rank",
    "DistributedOptimizer", "broadcast_parameters", "broadcast_optimizer_state", "join", "allreduce", "allreduce_",
    "allreduce_async", "allreduce_async_", "allgather", "allgather_async", "broadcast", "broadcast_",
    "broadcast_async", "broadcast_async_", "synchronize", "poll", "broadcast_object", "allgather_object",
    "barrier", "alltoall", "Compression", "Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor",
    "Average", "Sum", "Min", "Max", "Product", "Adasum", "comm_backend", "HorovodInternalError",
]
