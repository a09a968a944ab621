"""Horovod's elastic API shape over gzrun's restarts: a script written for ``hvd.elastic.run`` and
``hvd.elastic.TorchState`` runs unchanged::

    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...
            state.commit()

    train(state)

What differs from Horovod: by default a failed collective is not retried in the same process. gzrun
restarts the workers (``--max-restarts``); ``commit()`` keeps the committed state in host memory and in a
node-local file under /dev/shm (it outlives the process), and ``run`` starts by restoring the newest
commit that any rank's node holds, sent to every rank from the lowest rank that has it, so a rank
whose node was lost gets it over the network. One rank per node writes (the state is the same on
every rank). The files belong to one job (GZ_RUN_ID without its restart count, as the C++ snapshots
say it; else TORCHELASTIC_RUN_ID or GZ_ELASTIC_RUN_ID): a new job never restores an old job's
state. With none of them set, commits stay in memory only. GZ_ELASTIC_DIR overrides /dev/shm.

Under ``gzrun --recovery in-place`` (GZ_RECOVERY=in_place) it is Horovod's shape: gzrun replaces only
the lost worker, and on a lost peer (HorovodInternalError) the survivors keep their processes: they
regroup with the replacement (_in_place.py), the newest commit any rank holds (a survivor's memory,
else a node's file) is restored and synced to every rank, and ``func`` runs again. In an elastic job
(--nnodes MIN:MAX) a lost or returning node moves the survivors to gzrun's next round instead: they
continue with a new hvd.rank() and hvd.size(), and the reset callbacks adapt the script to them.
"""
import copy
import io
import os
import stat
import sys
import time

import torch

from .. import _C
from . import _in_place
from .functions import allgather_object, barrier, broadcast_object
from .optimizer import broadcast_optimizer_state, broadcast_parameters

_KEEP = 2  # commits kept per rank: the newest is whole even if a write is cut short
_NOTHING = -2  # what a rank holds with no state to offer: a fresh process whose node has no file


def _job_id():
    """The job across its restarts, as the C++ snapshots name it: gzrun's GZ_RUN_ID without its
    "-<GZ_RESTART_COUNT>" suffix, else torchrun's TORCHELASTIC_RUN_ID (not its default "none"),
    else GZ_ELASTIC_RUN_ID; None (commits in memory only) when none is set."""
    run, restart = os.environ.get("GZ_RUN_ID", ""), os.environ.get("GZ_RESTART_COUNT", "")
    if run and restart and run.endswith("-" + restart):
        run = run[:-len(restart) - 1]
    job = run or os.environ.get("TORCHELASTIC_RUN_ID", "").replace("none", "") or os.environ.get("GZ_ELASTIC_RUN_ID")
    if not job:
        return None
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in job).lstrip(".")  # one path component


def _private_dir(path):
    """Create `path` (0700) or accept it only if it is ours, a real folder and closed to others."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise RuntimeError(f"guozhuang elastic: {path} is not a private folder of this user "
                           "(a symlink, another owner or writable by others): refusing to use it")
    return path


class _NodeFiles:
    """This job's committed states on this node: commit-<n>.pt, written atomically by one rank per
    node folder (the state is the same on every rank), the newest _KEEP kept."""

    def __init__(self, job):
        base = os.environ.get("GZ_ELASTIC_DIR", "/dev/shm")
        _private_dir(os.path.join(base, f"gz-elastic-{os.getuid()}"))
        self.dir = _private_dir(os.path.join(base, f"gz-elastic-{os.getuid()}", job))
        self.writer = False

    def claim(self, round_):
        """The first rank of this round to claim the folder writes to it; it also removes the temp
        files of writers killed in earlier rounds (nobody else writes here in this round). An
        in-place recovery is a round of its own: the writer may be the worker that was lost."""
        self.writer = False
        try:
            os.close(os.open(os.path.join(self.dir, f"writer-{round_}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            return
        self.writer = True
        for name in os.listdir(self.dir):
            if name.startswith(".") or (name.startswith("writer-") and name != f"writer-{round_}"):
                os.unlink(os.path.join(self.dir, name))

    def _commits(self):
        out = []
        for name in os.listdir(self.dir):
            if name.startswith("commit-") and name.endswith(".pt") and name[7:-3].isdigit():
                out.append(int(name[7:-3]))
        return out

    def newest(self):
        return max(self._commits(), default=-1)

    def write(self, commit, payload):
        name = os.path.join(self.dir, f"commit-{commit}.pt")
        tmp = os.path.join(self.dir, f".commit-{commit}.tmp.{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                f.write(payload)
            os.replace(tmp, name)
        except OSError as e:  # e.g. a full /dev/shm: train on, without files (a warning says so)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            self.writer = False
            print(f"guozhuang elastic: rank {_C.hvd_rank()}: writing {name} failed ({e}); commits stay in "
                  "memory only (a restart will start from the beginning)", flush=True)
            return
        for c in self._commits():
            if c <= commit - _KEEP:
                os.unlink(os.path.join(self.dir, f"commit-{c}.pt"))

    def read(self, commit):
        with open(os.path.join(self.dir, f"commit-{commit}.pt"), "rb") as f:
            return f.read()

    def remove(self):
        """The job finished: its folder goes (called by one rank per folder, after a barrier)."""
        for name in os.listdir(self.dir):
            os.unlink(os.path.join(self.dir, name))
        os.rmdir(self.dir)


class State:
    """What a job commits and restores. Subclasses say what save/restore/sync mean."""

    def __init__(self):
        self._reset_callbacks = []
        self._commits = 0
        self._synced = False  # this process holds a synced state in memory (a survivor's)
        self._recoveries = 0  # in-place regroups of the job so far (agreed at each _resume)
        self._attempts = 0  # in-place recovery attempts since the last commit
        job = _job_id()
        self._files = _NodeFiles(job) if job else None

    def register_reset_callbacks(self, callbacks):
        """Called after the state was restored at a restart or an in-place recovery, on the world
        as it is now (hvd.size() may have changed): rescale the learning rate, rebuild samplers."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Save the state (memory, and the node's file when run by gzrun): a restart resumes here."""
        self.save()
        self._attempts = 0  # training went on: a later loss is a new recovery
        if self._files is not None and self._files.writer:
            buf = io.BytesIO()
            torch.save({"commit": self._commits, "world": _C.hvd_size(), "state": self._payload()}, buf)
            self._files.write(self._commits, buf.getvalue())
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

    def _held(self):
        """The newest commit this rank can offer: in memory (a survivor's; -1 = the state synced at
        the start, before any commit) or in its node's file, whichever is newer."""
        memory = self._commits - 1 if self._synced else _NOTHING
        disk = self._files.newest() if self._files is not None else -1
        return max(memory, disk if disk >= 0 else _NOTHING)

    def _resume(self):
        """At the start of run() and after an in-place regroup: restore the newest commit any rank
        holds, then make every rank equal. Whether a commit was restored (on_reset was called)."""
        held = allgather_object((self._held(), self._recoveries, _round()))
        best = max(h for h, _, _ in held)
        self._recoveries = max(r for _, r, _ in held)
        if self._files is not None:
            # Agreed, not this rank's environment: a survivor moved to a new round keeps the
            # GZ_RESTART_COUNT it started with, while a fresh worker beside it has the new one.
            rnd = max(n for _, _, n in held)
            self._files.claim(str(rnd) if self._recoveries == 0 else f"{rnd}.{self._recoveries}")
        if best == _NOTHING:
            self.sync(0)  # a fresh start: rank 0's initial state everywhere, as in Horovod
            self.save()
            self._synced = True
            return False
        root = [h for h, _, _ in held].index(best)
        error, source = broadcast_object(self._restore_as_root(best) if _C.hvd_rank() == root else None, root)
        if error:  # the others must not wait in sync() for a root that failed
            raise RuntimeError("guozhuang elastic: " + error)
        self.sync(root)
        self.save()
        self._synced = True
        self._commits = best + 1
        if best < 0:
            return False
        if _C.hvd_rank() == 0:
            print(f"guozhuang elastic: restored commit {best} (from rank {root}'s {source})", flush=True)
        self.on_reset()
        return True

    def _restore_as_root(self, best):
        """(error or None, where commit `best` came from): this rank's memory or its node's file."""
        if self._synced and self._commits - 1 == best:
            self.restore()
            return None, "memory"
        try:
            snap = torch.load(io.BytesIO(self._files.read(best)), map_location="cpu", weights_only=False)
            self._load_payload(snap["state"])
            if snap["world"] != _C.hvd_size():
                print(f"guozhuang elastic: commit {best} was taken by {snap['world']} ranks, now "
                      f"{_C.hvd_size()}", flush=True)
        except Exception as e:  # noqa: BLE001 -- told to every rank, then raised
            return f"rank {_C.hvd_rank()} could not restore commit {best} from {self._files.dir}: {e}", None
        return None, "node"

    def _recover_in_place(self, why):
        """One attempt: regroup with the replacement(s), restore and sync the newest commit. After
        a node was lost or admitted the rank and size are new: the restore and the reset callbacks
        (where scripts rescale the learning rate, re-shard their data) run on the new world."""
        self._attempts += 1
        rank = _C.hvd_rank()
        if self._attempts > _in_place.ATTEMPTS:
            raise RuntimeError(f"guozhuang elastic: rank {rank}: in-place recovery failed {_in_place.ATTEMPTS} "
                               f"times without a commit in between; giving up (last: {why})")
        print(f"guozhuang elastic: rank {rank}: {why}; recovering in place (attempt {self._attempts})",
              flush=True)
        t0 = time.monotonic()
        self._recoveries += 1
        _in_place.regroup(why)
        met = time.monotonic() - t0  # mostly the replacement's start: Python, torch, hvd.init()
        if not self._resume():
            self.on_reset()
        if _C.hvd_rank() == 0:  # the new rank 0 after a move
            at = self._commits - 1
            print(f"guozhuang elastic: recovered in place at commit {at}{' (none yet)' if at < 0 else ''} in "
                  f"{time.monotonic() - t0:.2f} s (regrouped in {met:.2f} s)", flush=True)

    def _finish(self):
        if self._files is not None:
            barrier()  # nobody still reads the folder
            if self._files.writer:
                self._files.remove()


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


def _round():
    """The launcher round this process was started in (gzrun's GZ_RESTART_COUNT)."""
    try:
        return int(os.environ.get("GZ_RESTART_COUNT", "0"))
    except ValueError:
        return 0


def _withdraw_from_moves():
    """Say no to gzrun's moves as elastic.run ends. A MovedError (gzrun moved this rank meanwhile:
    exiting as if the job had ended would leave the new round waiting for it) goes through; any
    other failure (the store gone after training, a timeout) is a warning."""
    try:
        _in_place.accept_moves(False)
    except _in_place.MovedError:
        raise
    except RuntimeError as e:
        print(f"guozhuang elastic: cannot withdraw from gzrun's moves: {e}", file=sys.stderr, flush=True)


def run(func):
    """Decorator: ``func(state, ...)`` runs after the newest committed state (if any) was restored
    and synced to every rank; when it returns, this rank's committed files are removed. Under
    GZ_RECOVERY=in_place a lost peer (HorovodInternalError) is recovered from in place and ``func``
    runs again (at most _in_place.ATTEMPTS times without a commit in between)."""

    def wrapper(state, *args, **kwargs):
        if _in_place.enabled():
            _in_place.check()
            _in_place.accept_moves(True)  # recoverable from here: gzrun may move this rank
        try:
            why = None
            while True:
                try:
                    if why is None:
                        state._resume()
                    else:
                        state._recover_in_place(why)
                    result = func(state, *args, **kwargs)
                    break
                except _in_place.HorovodInternalError as e:
                    if not _in_place.enabled():
                        raise
                    why = str(e)
        finally:
            if _in_place.enabled():
                _withdraw_from_moves()
        state._finish()
        return result

    wrapper.__name__ = getattr(func, "__name__", "wrapper")
    wrapper.__doc__ = func.__doc__
    return wrapper


__all__ = ["State", "ObjectState", "TorchState", "run"]
