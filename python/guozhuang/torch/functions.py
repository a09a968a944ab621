"""Horovod's tensor collectives over the default group: allreduce, allgather, broadcast (each also
_async, and in place with a trailing underscore), synchronize/poll, objects, barrier.

Asynchronous ops run in issue order on the group's progress thread; a handle's synchronize() waits
up to the op's own deadline (GZ_TIMEOUT_S) and raises the op's failure as a RuntimeError.
"""
import io
import pickle

import torch

from .. import _C
from .compression import Compression

# Reduce ops, as Horovod names them.
Average = "avg"
Sum = "sum"
Min = "min"
Max = "max"
Product = "prod"
Adasum = "adasum"

_REDUCIBLE = {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32,
              torch.int64}


class Handle:
    """An asynchronous op: pass it to synchronize() (or poll())."""

    __slots__ = ("_native", "_finish", "_result", "_done")

    def __init__(self, native, finish=None):
        self._native = native
        self._finish = finish
        self._result = None
        self._done = False

    def wait(self):
        if not self._done:
            out = self._native.wait()
            self._result = self._finish(out) if self._finish else out
            self._done = True
        return self._result


def synchronize(handle):
    """Wait for an asynchronous op; returns its output tensor. Raises its failure (RuntimeError)."""
    return handle.wait()


def poll(handle):
    """Whether an asynchronous op has finished (never blocks)."""
    return handle._done or handle._native.done()


def _check_cpu(tensor, what):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"guozhuang.torch.{what}: expected a tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        raise ValueError(f"guozhuang.torch.{what}: CPU tensors only, got one on {tensor.device}")


def _resolve_op(average, op, what):
    if average is not None:
        if op is not None:
            raise ValueError(f"guozhuang.torch.{what}: pass either average= or op=, not both")
        return Average if average else Sum
    op = Average if op is None else op
    if op == Adasum:
        raise NotImplementedError(f"guozhuang.torch.{what}: Adasum is not supported; use Average or Sum")
    if op not in (Average, Sum, Min, Max, Product):
        raise ValueError(f"guozhuang.torch.{what}: unknown op {op!r} (Average, Sum, Min, Max, Product)")
    return op


def _in_place(tensor, run):
    """Run `run(buf)` on a contiguous buffer of `tensor`; the handle copies back when buf is a copy."""
    buf = tensor if tensor.is_contiguous() else tensor.contiguous()

    def finish(out):
        if out.data_ptr() != tensor.data_ptr():
            with torch.no_grad():
                tensor.copy_(out)
        return tensor

    return Handle(run(buf), finish)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=None):
    """In place: `tensor` becomes the reduction over ranks once the handle is synchronized."""
    _check_cpu(tensor, "allreduce")
    op = _resolve_op(average, op, "allreduce")
    if tensor.dtype not in _REDUCIBLE:
        raise TypeError(f"guozhuang.torch.allreduce: unsupported dtype {tensor.dtype} "
                        f"(supported: {', '.join(sorted(str(d) for d in _REDUCIBLE))})")
    with torch.no_grad():
        if prescale_factor != 1.0:
            tensor.mul_(prescale_factor)

        def run(buf):
            return _C.hvd_allreduce_async(buf.detach(), op)

        handle = _in_place(tensor, run)
    if postscale_factor != 1.0:
        inner = handle._finish

        def finish(out):
            t = inner(out)
            with torch.no_grad():
                t.mul_(postscale_factor)
            return t

        handle._finish = finish
    return handle


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=None):
    """Out of place: the handle's result is a new tensor holding the reduction."""
    return allreduce_async_(tensor.detach().clone(), average, name, op, prescale_factor, postscale_factor)


class _AllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, op, prescale, postscale):
        ctx.op, ctx.prescale, ctx.postscale = op, prescale, postscale
        return synchronize(allreduce_async(tensor, op=op, prescale_factor=prescale, postscale_factor=postscale))

    @staticmethod
    def backward(ctx, grad):
        # The gradient of a sum (or average) over ranks is the same reduction of the gradients.
        return synchronize(allreduce_async(grad, op=ctx.op, prescale_factor=ctx.prescale,
                                           postscale_factor=ctx.postscale)), None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=None):
    """A new tensor: the reduction (default: average) of `tensor` over ranks. Differentiable for
    Average and Sum."""
    op = _resolve_op(average, op, "allreduce")
    sent, ctx = compression.compress(tensor)
    if sent.requires_grad and op in (Average, Sum):
        out = _AllreduceFn.apply(sent, op, prescale_factor, postscale_factor)
    else:
        out = synchronize(allreduce_async(sent, op=op, prescale_factor=prescale_factor,
                                          postscale_factor=postscale_factor))
    return compression.decompress(out, ctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=None):
    """In place, synchronously; returns `tensor`."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor))


def _as_bytes(tensor):
    """A contiguous uint8 view of any tensor's data (broadcast moves bytes, whatever the dtype)."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def broadcast_async_(tensor, root_rank, name=None, process_set=None):
    """In place: every rank's `tensor` becomes root_rank's once the handle is synchronized."""
    _check_cpu(tensor, "broadcast")
    buf = _as_bytes(tensor)

    def finish(out):
        if out.data_ptr() != tensor.data_ptr():
            with torch.no_grad():
                tensor.copy_(out.view(tensor.dtype).view(tensor.shape))
        return tensor

    return Handle(_C.hvd_broadcast_async(buf, int(root_rank)), finish)


def broadcast_async(tensor, root_rank, name=None, process_set=None):
    """Out of place: the handle's result is a new tensor equal to root_rank's."""
    return broadcast_async_(tensor.detach().clone(), root_rank, name)


class _BroadcastFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank):
        ctx.root_rank = root_rank
        return synchronize(broadcast_async(tensor, root_rank))

    @staticmethod
    def backward(ctx, grad):
        # Every rank's output came from the root: the root's input gets the sum of the gradients.
        summed = synchronize(allreduce_async(grad, op=Sum))
        if _C.hvd_rank() != ctx.root_rank:
            summed = summed * 0
        return summed, None


def broadcast(tensor, root_rank, name=None, process_set=None):
    """A new tensor equal to root_rank's `tensor`. Differentiable."""
    if tensor.requires_grad:
        return _BroadcastFn.apply(tensor, root_rank)
    return synchronize(broadcast_async(tensor, root_rank, name))


def broadcast_(tensor, root_rank, name=None, process_set=None):
    """In place, synchronously; returns `tensor`."""
    return synchronize(broadcast_async_(tensor, root_rank, name))


def allgather_async(tensor, name=None, process_set=None):
    """Every rank's `tensor` concatenated along dim 0 (ranks may differ in dim 0 only)."""
    _check_cpu(tensor, "allgather")
    t = tensor.detach()
    if t.dim() == 0:
        t = t.reshape(1)
    if t.dtype in _REDUCIBLE:
        return Handle(_C.hvd_allgather_async(t.contiguous()))
    # Other dtypes travel as bytes: rows of row_bytes each.
    shape = t.shape
    rows = _as_bytes(t).reshape(shape[0], -1) if shape[0] > 0 else torch.empty(0, 1, dtype=torch.uint8)

    def finish(out):
        return out.reshape(-1).view(tensor.dtype).reshape(-1, *shape[1:])

    return Handle(_C.hvd_allgather_async(rows.contiguous()), finish)


class _AllgatherFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor):
        ctx.rows = tensor.shape[0] if tensor.dim() else 1
        out = synchronize(allgather_async(tensor))
        counts = synchronize(allgather_async(torch.tensor([ctx.rows], dtype=torch.int64)))
        ctx.offset = int(counts[: _C.hvd_rank()].sum())
        return out

    @staticmethod
    def backward(ctx, grad):
        # Every rank's output holds this rank's rows: their gradient is the sum over ranks.
        summed = synchronize(allreduce_async(grad, op=Sum))
        return summed.narrow(0, ctx.offset, ctx.rows)


def allgather(tensor, name=None, process_set=None):
    """A new tensor: every rank's `tensor` concatenated along dim 0. Differentiable."""
    if tensor.requires_grad:
        return _AllgatherFn.apply(tensor)
    return synchronize(allgather_async(tensor, name))


def _object_to_tensor(obj):
    buf = io.BytesIO()
    pickle.dump(obj, buf)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def broadcast_object(obj, root_rank=0, name=None, process_set=None):
    """root_rank's picklable object, on every rank."""
    payload = _object_to_tensor(obj) if _C.hvd_rank() == root_rank else torch.empty(0, dtype=torch.uint8)
    size = broadcast_(torch.tensor([payload.numel()], dtype=torch.int64), root_rank)
    if _C.hvd_rank() != root_rank:
        payload = torch.empty(int(size.item()), dtype=torch.uint8)
    broadcast_(payload, root_rank)
    return pickle.loads(payload.numpy().tobytes())


def allgather_object(obj, name=None, process_set=None):
    """Every rank's picklable object, as a list in rank order."""
    payload = _object_to_tensor(obj)
    sizes = allgather(torch.tensor([payload.numel()], dtype=torch.int64))
    data = allgather(payload)
    out, off = [], 0
    for n in sizes.tolist():
        out.append(pickle.loads(data[off:off + n].numpy().tobytes()))
        off += n
    return out


def barrier(process_set=None):
    """Every rank waits for every other."""
    _C.hvd_barrier()


def alltoall(tensor, splits=None, name=None, process_set=None):
    raise NotImplementedError("guozhuang.torch.alltoall is not supported; use torch.distributed.all_to_all on a "
                              "\"gz\" process group")
