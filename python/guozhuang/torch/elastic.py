"""Horovod's elastic API shape over gzrun's restarts: a script written for ``hvd.elastic.run`` and
``hvd.elastic.TorchState`` runs unchanged::

    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...
            state.commit()

    train(state)

What differs from Horovod: a failed collective is not retried in the same process. gzrun restarts
the workers (``--max-restarts``); ``commit()`` keeps the committed state in host memory and in a
node-local file under /dev/shm (it outlives the process), and ``run`` starts by restoring the newest
commit that any rank's node holds, sent to every rank from the lowest rank that has it, so a rank
whose node was lost gets it over the network. The files belong to one gzrun job (GZ_RUN_ID without
its round): a new job never restores an old job's state. Without gzrun (no GZ_RUN_ID, and no
GZ_ELASTIC_RUN_ID set by hand) commits stay in memory only. GZ_ELASTIC_DIR overrides /dev/shm.
"""
import copy
import io
import os
import stat

import torch

from .. import _C
from .functions import allgather_object, broadcast_object
from .optimizer import broadcast_optimizer_state, broadcast_parameters

_KEEP = 2  # commits kept per rank: the newest is whole even if a write is cut short


def _job_id():
    explicit = os.environ.get("GZ_ELASTIC_RUN_ID")
    if explicit:
        return explicit
    run = os.environ.get("GZ_RUN_ID", "")  # "<job>-<round>": the job part is the same every round
    return run.rsplit("-", 1)[0] if "-" in run else None


def _private_dir(path):
    """Create `path` (0700) or accept it only if it is ours, a real folder and closed to others."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise RuntimeError(f"guozhuang elastic: {path} is not a private folder of this user "
                           "(a symlink, another owner or writable by others): refusing to use it")
    return path


class _NodeFiles:
    """This job's committed states on this node: commit-<n>.rank-<r>.pt, written atomically."""

    def __init__(self, job):
        base = os.environ.get("GZ_ELASTIC_DIR", "/dev/shm")
        _private_dir(os.path.join(base, f"gz-elastic-{os.getuid()}"))
        self.dir = _private_dir(os.path.join(base, f"gz-elastic-{os.getuid()}", job))

    def _entries(self):
        out = []
        for name in os.listdir(self.dir):
            parts = name.split(".")
            if len(parts) == 3 and parts[0].startswith("commit-") and parts[1].startswith("rank-") and parts[2] == "pt":
                try:
                    out.append((int(parts[0][7:]), int(parts[1][5:]), name))
                except ValueError:
                    pass
        return out

    def newest(self):
        return max((c for c, _, _ in self._entries()), default=-1)

    def write(self, commit, rank, payload):
        name = f"commit-{commit}.rank-{rank}.pt"
        tmp = os.path.join(self.dir, f".{name}.tmp.{os.getpid()}")  # one writer per name: no clash
        with open(tmp, "wb") as f:
            f.write(payload)
        os.replace(tmp, os.path.join(self.dir, name))
        for c, r, old in self._entries():
            if r == rank and c <= commit - _KEEP:
                os.unlink(os.path.join(self.dir, old))

    def read(self, commit):
        for c, _, name in sorted(self._entries(), key=lambda e: e[1]):
            if c == commit:
                with open(os.path.join(self.dir, name), "rb") as f:
                    return f.read()
        return None

    def remove_rank(self, rank):
        for _, r, name in self._entries():
            if r == rank:
                os.unlink(os.path.join(self.dir, name))
        try:
            os.rmdir(self.dir)  # the last rank of the node to finish removes the folder
        except OSError:
            pass


class State:
    """What a job commits and restores. Subclasses say what save/restore/sync mean."""

    def __init__(self):
        self._reset_callbacks = []
        self._commits = 0
        job = _job_id()
        self._files = _NodeFiles(job) if job else None

    def register_reset_callbacks(self, callbacks):
        """Called after the state was restored at a restart (e.g. to rescale the learning rate)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Save the state (memory, and the node's file when run by gzrun): a restart resumes here."""
        self.save()
        if self._files is not None:
            buf = io.BytesIO()
            torch.save({"commit": self._commits, "world": _C.hvd_size(), "state": self._payload()}, buf)
            self._files.write(self._commits, _C.hvd_rank(), buf.getvalue())
        self._commits += 1

    def check_host_updates(self):
        """Horovod's host-change check: gzrun restarts the workers instead, so nothing to do."""

    def save(self):
        raise NotImplementedError

    def restore(self):
        raise NotImplementedError

    def sync(self, root_rank=0):
        raise NotImplementedError

    def _payload(self):
        raise NotImplementedError

    def _load_payload(self, payload):
        raise NotImplementedError

    def _resume(self):
        """At the start of run(): restore the newest commit any node holds, then make every rank equal."""
        newest = self._files.newest() if self._files is not None else -1
        held = allgather_object(newest)
        best = max(held)
        if best < 0:
            self.sync(0)  # a fresh start: rank 0's initial state everywhere, as in Horovod
            return
        root = held.index(best)
        if _C.hvd_rank() == root:
            snap = torch.load(io.BytesIO(self._files.read(best)), weights_only=False)  # our own private file
            self._load_payload(snap["state"])
            if snap["world"] != _C.hvd_size():
                print(f"guozhuang elastic: commit {best} was taken by {snap['world']} ranks, now {_C.hvd_size()}",
                      flush=True)
        self.sync(root)
        self.save()
        self._commits = best + 1
        if _C.hvd_rank() == 0:
            print(f"guozhuang elastic: restored commit {best} (from rank {root}'s node)", flush=True)
        self.on_reset()

    def _finish(self):
        if self._files is not None:
            self._files.remove_rank(_C.hvd_rank())


class ObjectState(State):
    """Picklable attributes (``state.epoch``, ``state.batch``, ...), committed and synced as values."""

    def __init__(self, **kwargs):
        self._names = list(kwargs)
        for name, value in kwargs.items():
            setattr(self, name, value)
        self._saved = {}
        super().__init__()
        self.save()

    def save(self):
        self._saved = {n: copy.deepcopy(getattr(self, n)) for n in self._names}

    def restore(self):
        for name, value in self._saved.items():
            setattr(self, name, copy.deepcopy(value))

    def sync(self, root_rank=0):
        values = broadcast_object({n: getattr(self, n) for n in self._names}, root_rank)
        for name, value in values.items():
            setattr(self, name, value)

    def _payload(self):
        return {"objects": self._saved}

    def _load_payload(self, payload):
        self._saved = payload["objects"]
        ObjectState.restore(self)


class TorchState(ObjectState):
    """A model and an optimizer (either may be None) plus picklable attributes."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        self.model, self.optimizer = model, optimizer
        self._model_saved = self._optimizer_saved = None
        super().__init__(**kwargs)

    def save(self):
        super().save()
        if self.model is not None:
            self._model_saved = copy.deepcopy(self.model.state_dict())
        if self.optimizer is not None:
            self._optimizer_saved = copy.deepcopy(self.optimizer.state_dict())

    def restore(self):
        super().restore()
        if self.model is not None and self._model_saved is not None:
            self.model.load_state_dict(self._model_saved)
        if self.optimizer is not None and self._optimizer_saved is not None:
            self.optimizer.load_state_dict(self._optimizer_saved)

    def sync(self, root_rank=0):
        super().sync(root_rank)
        if self.model is not None:
            broadcast_parameters(self.model.state_dict(), root_rank)
        if self.optimizer is not None:
            broadcast_optimizer_state(self.optimizer, root_rank)

    def _payload(self):
        return {"objects": self._saved, "model": self._model_saved, "optimizer": self._optimizer_saved}

    def _load_payload(self, payload):
        self._saved = payload["objects"]
        self._model_saved, self._optimizer_saved = payload["model"], payload["optimizer"]
        TorchState.restore(self)


def run(func):
    """Decorator: ``func(state, ...)`` runs after the newest committed state (if any) was restored
    and synced to every rank; when it returns, this rank's committed files are removed."""

    def wrapper(state, *args, **kwargs):
        state._resume()
        result = func(state, *args, **kwargs)
        state._finish()
        return result

    wrapper.__name__ = getattr(func, "__name__", "wrapper")
    wrapper.__doc__ = func.__doc__
    return wrapper


__all__ = ["State", "ObjectState", "TorchState", "run"]
