"""Horovod's DistributedOptimizer, broadcast_parameters, broadcast_optimizer_state and join over
Guozhuang's Horovod-mode core (gz::DistributedOptimizer: gradients averaged by name as backward
produces them, fused, with a replayed schedule after the first step).

Join (uneven inputs): every synchronize() ends with one small exchange of who is still active. A
rank that ran out of data calls join(); it then takes part in every step of the others with zero
gradients (the average still divides by the world size, as in Horovod) until every rank has joined.
"""
import contextlib
import io
import weakref

import torch

from .. import _C
from .compression import Compression, NoneCompressor
from .functions import Average, Sum, allgather_async, broadcast_async_, broadcast_object, synchronize

_last_optimizer = None  # weakref to the newest DistributedOptimizer: the one join() keeps stepping
_optimizers = []  # weakrefs to every DistributedOptimizer, in creation order (_rebuild_cores)


def _join_exchange(active, joining):
    """(ranks still active, highest rank that joined in this round or -1): one allgather."""
    mine = torch.tensor([[1 if active else 0, _C.hvd_rank() if joining else -1]], dtype=torch.int64)
    everyone = synchronize(allgather_async(mine))
    return int(everyone[:, 0].sum()), int(everyone[:, 1].max())


class _DistributedOptimizer(torch.optim.Optimizer):
    """Methods mixed into a copy of the wrapped optimizer's class (as Horovod does)."""

    def _gz_setup(self, named_parameters, compression, backward_passes_per_step, op):
        params = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
            if any(not isinstance(pair, tuple) or len(pair) != 2 for pair in named):
                raise ValueError("named_parameters should be a sequence of (name, parameter) tuples, usually "
                                 "model.named_parameters()")
            names = [n for n, _ in named]
            dups = sorted({n for n in names if names.count(n) > 1})
            if dups:
                raise ValueError(f"parameter names in named_parameters must be unique; duplicates: {dups}")
            by_id = {id(p): n for n, p in named}
            unnamed = [i for i, p in enumerate(params) if id(p) not in by_id]
            if unnamed:
                raise ValueError(f"named_parameters was given, but {len(unnamed)} of the optimizer's parameters "
                                 f"are not in it (e.g. parameter #{unnamed[0]})")
            named = [(by_id[id(p)], p) for p in params]
        else:
            named = [(f"allreduce.noname.{i}", p) for i, p in enumerate(params)]
        for n, p in named:
            if p.device.type != "cpu":
                raise ValueError(f"guozhuang.torch.DistributedOptimizer: parameter {n} is on {p.device}; "
                                 "CPU parameters only")
        if op not in (Average, Sum):
            raise NotImplementedError(f"guozhuang.torch.DistributedOptimizer: op {op!r} is not supported "
                                      "(Average or Sum)")
        wire = getattr(compression, "wire", None)
        if wire is None:
            raise NotImplementedError("guozhuang.torch.DistributedOptimizer: custom compressors are not supported; "
                                      "use Compression.none, Compression.fp16 or Compression.bf16")
        self._gz_op = op
        self._gz_should_sync = True
        self._gz_core_args = ([(n, p) for n, p in named if p.requires_grad], wire, int(backward_passes_per_step))
        self._gz_core = _C._GradientAverager(*self._gz_core_args)
        global _last_optimizer
        _last_optimizer = weakref.ref(self)
        _optimizers.append(_last_optimizer)

    def synchronize(self):
        """Wait until every gradient of this step is averaged over the ranks."""
        self._gz_core.synchronize()
        if self._gz_op == Sum:
            world = _C.hvd_size()
            with torch.no_grad():
                for group in self.param_groups:
                    for p in group["params"]:
                        if p.grad is not None:
                            p.grad.mul_(world)
        _join_exchange(active=True, joining=False)

    @contextlib.contextmanager
    def skip_synchronize(self):
        """step() inside this block does not synchronize (call synchronize() yourself before it)."""
        self._gz_should_sync = False
        try:
            yield
        finally:
            self._gz_should_sync = True

    def step(self, closure=None):
        if self._gz_should_sync:
            self.synchronize()
        return super(self.__class__, self).step(closure)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,  # noqa: N802
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0, num_groups=0,
                         groups=None, sparse_as_dense=False, process_set=None):
    """Wrap `optimizer` so that step() first averages the gradients over all ranks.

    Gradients are submitted by name as backward produces them and averaged in the background, fused
    into few all-reduces (the core's own grouping: num_groups/groups are accepted and ignored;
    gradient_predivide_factor only changes rounding in Horovod and is ignored too). CPU parameters.
    Collective: every rank wraps the same parameters under the same names.
    """
    if not _C.hvd_is_initialized():
        raise RuntimeError("guozhuang.torch: call hvd.init() before DistributedOptimizer")
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               {k: v for k, v in _DistributedOptimizer.__dict__.items() if k not in ("__dict__", "__weakref__")})
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)
    wrapped._gz_setup(named_parameters, compression, backward_passes_per_step, op)
    return wrapped


def _rebuild_cores():
    """After the default group was replaced (in-place recovery): every live DistributedOptimizer
    averages on the new group. Collective, in creation order: a replacement process builds its
    optimizers in that order before hvd.elastic.run. Gradients are dropped, as a fresh process has
    none."""
    live = [o for o in (r() for r in _optimizers) if o is not None]
    _optimizers[:] = [weakref.ref(o) for o in live]
    for o in live:  # the old cores' hooks go before the new ones are installed
        o._gz_core = None
    for o in live:
        o._gz_core = _C._GradientAverager(*o._gz_core_args)
        for group in o.param_groups:
            for p in group["params"]:
                p.grad = None


def join(device=-1):
    """This rank has no more data: keep taking part (with zero gradients) in the other ranks' steps
    until every rank has called join(). Returns the rank that joined last."""
    opt = _last_optimizer() if _last_optimizer is not None else None
    joining = True
    while True:
        if opt is not None:
            opt._gz_core.submit_zeros()
            opt._gz_core.synchronize()
        active, last = _join_exchange(active=False, joining=joining)
        if joining:
            last_seen = last
        else:
            last_seen = max(last_seen, last)
        joining = False
        if active == 0:
            return last_seen


def broadcast_parameters(params, root_rank):
    """Make every rank's parameters (a state_dict, or (name, tensor) pairs such as
    model.named_parameters()) equal to root_rank's, in place."""
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, list) or hasattr(params, "__iter__"):
        items = list(params)
        if any(not isinstance(pair, tuple) or len(pair) != 2 for pair in items):
            raise ValueError("broadcast_parameters: expected a dict or (name, tensor) pairs")
    else:
        raise ValueError(f"broadcast_parameters: invalid params of type {type(params).__name__}")
    handles = []
    for _, p in items:
        if p is None:
            continue
        t = p.data if isinstance(p, torch.nn.Parameter) else p
        handles.append(broadcast_async_(t, root_rank))
    for h in handles:
        synchronize(h)


def broadcast_optimizer_state(optimizer, root_rank):
    """Make every rank's optimizer state (per-parameter state and hyper-parameters) equal to
    root_rank's. The state travels as torch.save bytes and is loaded with load_state_dict()."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("broadcast_optimizer_state does not support LBFGS (as in Horovod)")
    payload = None
    if _C.hvd_rank() == root_rank:
        buf = io.BytesIO()
        torch.save(optimizer.state_dict(), buf)
        payload = buf.getvalue()
    payload = broadcast_object(payload, root_rank)
    if _C.hvd_rank() != root_rank:
        # On the CPU first: root's tensors may name a GPU this rank does not use (or have);
        # load_state_dict() moves each state tensor to its parameter's device.
        optimizer.load_state_dict(torch.load(io.BytesIO(payload), map_location="cpu"))


__all__ = ["DistributedOptimizer", "join", "broadcast_parameters", "broadcast_optimizer_state", "Compression",
           "NoneCompressor"]
