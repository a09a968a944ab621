"""Guozhuang for PyTorch: ``import guozhuang`` registers the torch.distributed backend "gz".

    import torch.distributed as dist
    import guozhuang  # noqa: F401  (registers "gz")
    dist.init_process_group("gz")   # env:// as usual: MASTER_ADDR/PORT, RANK, WORLD_SIZE

CPU tensors only. The ranks rendezvous through the store torch.distributed created, and every op
carries the group's timeout (``init_process_group(timeout=...)``) as its own deadline. Which of
Guozhuang's engines moves the data: GZ_BACKEND (auto = shared memory inside a node, shared memory +
Gloo across nodes; or shm, gloo, mpi, hier).
"""

import os
from datetime import timedelta

import torch
import torch.distributed as _dist

from . import _C
from ._C import ProcessGroupGz, available_backends

__all__ = ["ProcessGroupGz", "available_backends", "create_process_group", "comm_backend", "abort"]
__version__ = "0.1.0"


def create_process_group(store, rank, size, timeout):
    """torch.distributed's creator for backend "gz" (store, rank, world size, timeout)."""
    if isinstance(timeout, timedelta):
        ms = int(timeout.total_seconds() * 1000)
    else:
        ms = int(timeout * 1000) if timeout else 0
    return ProcessGroupGz(store, rank, size, timedelta(milliseconds=ms),
                          os.environ.get("GZ_TORCH_BACKEND", "auto"))


def _group(group):
    if group is None:
        group = _dist.distributed_c10d._get_default_group()
    return group


def comm_backend(group=None):
    """The Guozhuang engine under a "gz" group: "shm", "gloo", "hier(shm+gloo)", ..."""
    return _group(group).comm_backend


def abort(group=None, reason="aborted by the user"):
    """Fail every queued and running op of a "gz" group, and every later one."""
    _group(group).abort(reason)


if "GZ" not in _dist.Backend._plugins and not hasattr(_dist.Backend, "GZ"):
    _dist.Backend.register_backend("gz", create_process_group)
