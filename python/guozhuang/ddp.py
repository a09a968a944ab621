"""PyTorch's own DDP on "gz", zero-copy: the Reducer's gradient buckets in shared memory.

torch's Reducer allocates its buckets itself; our shm engine all-reduces memory from
Communicator::alloc_buffer() straight between the ranks' copies. ``import guozhuang`` replaces
torch.distributed.Reducer (which DDP instantiates) by a subclass that, for a "gz" process group
only, opens a shared-bucket scope around the constructor and _rebuild_buckets(): the tensors they
allocate (the buckets, identical on every rank) come from the group's alloc_buffer(). Other groups
and everything else are untouched. GZ_DDP_SHARED_BUCKETS=0 turns it off.
"""
import contextlib
import os

import torch.distributed as dist

from . import _C

# Buckets at or below this size take the shm engine's one-step latency path, never the zero-copy one.
MIN_BYTES = 16 * 1024
_TorchReducer = dist.Reducer


def _gz_backend(process_group):
    from . import ProcessGroupGz, _backend_of
    if isinstance(process_group, ProcessGroupGz):
        return process_group
    try:
        return _backend_of(process_group)
    except (ValueError, RuntimeError, TypeError):
        return None


@contextlib.contextmanager
def shared_buckets(process_group):
    """CPU tensors of at least MIN_BYTES allocated on this thread in the block come from the "gz"
    group's shared buffers. Collective: every rank must allocate the same sizes in the same order."""
    backend = _gz_backend(process_group) if process_group is not None else None
    if backend is None:
        yield
        return
    _C._bucket_scope_enter(backend, MIN_BYTES)
    try:
        yield
    finally:
        _C._bucket_scope_exit()


class Reducer(_TorchReducer):
    """torch.distributed.Reducer whose buckets live in the group's shared buffers on "gz"."""

    def __init__(self, params, bucket_indices, per_bucket_size_limits, process_group, *args, **kwargs):
        with shared_buckets(process_group):
            super().__init__(params, bucket_indices, per_bucket_size_limits, process_group, *args, **kwargs)
        self._gz_group = process_group

    def _rebuild_buckets(self):
        with shared_buckets(self._gz_group):
            return super()._rebuild_buckets()


def install():
    if os.environ.get("GZ_DDP_SHARED_BUCKETS", "1") != "0" and dist.Reducer is _TorchReducer:
        dist.Reducer = Reducer
