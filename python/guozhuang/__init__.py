"""Guozhuang for PyTorch.

``import guozhuang`` registers the torch.distributed backend "gz"::

    import torch.distributed as dist
    import guozhuang  # noqa: F401  (registers "gz")
    dist.init_process_group("gz")   # env:// as usual: under gzrun, torchrun, mpirun or srun

CPU tensors only. The ranks rendezvous through the store torch.distributed made (a PrefixStore over
its TCPStore or FileStore, or one passed as ``store=``), and every op carries the group's timeout
(``init_process_group(timeout=...)``) as its own deadline: a stopped peer is a RuntimeError naming
op, rank, peer and elapsed time, never a hang. Which of Guozhuang's engines moves the data:
GZ_BACKEND (auto = shared memory inside a node, shared memory + Gloo across nodes; or shm, gloo, mpi).

PyTorch's DDP on a "gz" group all-reduces its gradient buckets zero-copy: guozhuang places them in
shared memory every rank maps (guozhuang/ddp.py; GZ_DDP_SHARED_BUCKETS=0 turns that off).

Horovod's API over Guozhuang's Horovod-mode core: ``import guozhuang.torch as hvd``.
"""

import os
from datetime import timedelta

# Private names only: the package has a submodule `torch` (guozhuang.torch, Horovod's API), and
# importing it binds the package attribute `torch` -- which is this module's global `torch`. A
# global named after the real torch would then point at our submodule.
import torch as _torch  # loads libtorch before our extension
import torch.distributed as _dist

from . import _build_info


def _check_torch(built, running):
    """The extension links the LibTorch it was compiled against: another torch in this process would
    make it fail to load or crash later. Refuse with the remedy instead."""
    if running.split("+")[0] != built:
        raise ImportError(
            f"guozhuang was built against torch {built} but this Python imports torch {running} "
            f"(from {_torch.__file__}): rebuild it with this interpreter "
            "(pip install --no-build-isolation ./python, or scripts/build.sh)")


_check_torch(_build_info.TORCH_VERSION, _torch.__version__)
try:
    from . import _C
except ImportError as e:
    raise ImportError(f"guozhuang: its extension does not load ({e}); it was built for Python "
                      f"{_build_info.PYTHON_VERSION} and torch {_build_info.TORCH_VERSION}") from e
from ._C import ProcessGroupGz, available_backends  # noqa: E402

__all__ = ["ProcessGroupGz", "available_backends", "create_process_group", "comm_backend", "abort",
           "set_launcher_env", "rendezvous_store"]
__version__ = "0.1.0"


def _timeout_ms(timeout):
    if timeout is None:
        return 0
    if isinstance(timeout, timedelta):
        return int(timeout.total_seconds() * 1000)
    return int(float(timeout) * 1000)


def create_process_group(store, rank, size, timeout):
    """torch.distributed's creator for backend "gz": (store, group rank, group size, timeout)."""
    return ProcessGroupGz(store, rank, size, timedelta(milliseconds=_timeout_ms(timeout)), "auto")


def _backend_of(group):
    """Our ProcessGroupGz behind a torch group (torch 1.x: the group itself; 2.x: its CPU backend)."""
    if group is None:
        group = _dist.distributed_c10d._get_default_group()
    if isinstance(group, ProcessGroupGz):
        return group
    get = getattr(group, "_get_backend", None)
    if get is not None:
        backend = get(_torch.device("cpu"))
        if isinstance(backend, ProcessGroupGz):
            return backend
    raise ValueError(f"not a process group of backend \"gz\": {group!r}")


def comm_backend(group=None):
    """The Guozhuang engine under a "gz" group: "shm", "gloo", "hier(shm+gloo)", ..."""
    return _backend_of(group).comm_backend


def abort(group=None, reason="aborted by the user"):
    """Fail every queued and running op of a "gz" group (RuntimeError), and every later one."""
    _backend_of(group).abort(reason)


def rendezvous_store(init_method="env://", timeout=None):
    """(store, rank, world_size) by Guozhuang's rendezvous rules, for
    ``dist.init_process_group("gz", store=store, rank=rank, world_size=world_size)``: under gzrun
    the store gzrun hosts (torch then opens no TCPStore of its own), under torchrun one next to
    MASTER_PORT, under mpirun or srun one on MASTER_ADDR:MASTER_PORT, or tcp:// and file://."""
    return _C.rendezvous_store(init_method, timedelta(milliseconds=_timeout_ms(timeout)))


def set_launcher_env():
    """Give torch's env:// what it reads (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK) under
    launchers that name them differently (mpirun, srun, PMI). Variables already set are kept.
    Called on import; a lone process (no launcher) gets nothing."""
    try:
        env = _C.launcher_env()
    except RuntimeError:  # partial or inconsistent variables: leave them to whoever set them
        return
    if env.get("GZ_DETECTED_LAUNCHER") not in ("openmpi", "pmi", "slurm"):
        return
    env.pop("GZ_DETECTED_LAUNCHER")
    env.setdefault("MASTER_PORT", "29500")
    for k, v in env.items():
        os.environ.setdefault(k, v)


def _register():
    if "GZ" in _dist.Backend._plugins:
        return
    try:
        # torch >= 2.1 asks which devices a plugin serves.
        _dist.Backend.register_backend("gz", create_process_group, devices=["cpu"])
    except TypeError:
        _dist.Backend.register_backend("gz", create_process_group)


set_launcher_env()
_register()
from . import ddp as _ddp  # noqa: E402  (DDP's buckets in shared memory on "gz")

_ddp.install()
