"""c10d sequence numbers of the "gz" backend. argv: MODE. Rank 0 prints "SEQ OK" when all held.

  count   the group's sequence number counts the collectives issued on it (async ones at issue),
          not point-to-point ops, and is the same on every rank afterwards
  detail  TORCH_DISTRIBUTED_DEBUG=DETAIL (set by the caller): object collectives on a subgroup.
          torch 2.x wraps every new group in c10d's debug wrapper, which asks the backend for its
          sequence number (it failed with "Backend gz does not yet support sequence numbers");
          torch 1.13 wraps gloo/nccl groups only, so there this mode runs but guards nothing.
"""
import sys

import torch
import torch.distributed as dist

import guozhuang  # noqa: F401

mode = sys.argv[1]
dist.init_process_group("gz")
rank, world = dist.get_rank(), dist.get_world_size()
sub = dist.new_group(backend="gz")


def backend(group):
    # torch 2.x: the c10d Backend behind the ProcessGroup dispatcher (whose own sequence number
    # methods answer for gloo/nccl/ucc only); torch 1.13: the group is the backend.
    return group._get_backend(torch.device("cpu")) if hasattr(group, "_get_backend") else group


def seq(group):
    return backend(group)._get_sequence_number_for_group()


def same_on_all_ranks(value, what):
    got = [None] * world
    dist.all_gather_object(got, value)  # on the default group: sub's count stays as it is
    assert got == [value] * world, f"{what} differs between ranks: {got}"


if mode == "count":
    backend(sub)._set_sequence_number_for_group()  # what torch's wrappers call first: must not throw
    n0 = seq(sub)
    t = torch.ones(8)
    dist.all_reduce(t, group=sub)
    assert seq(sub) == n0 + 1, (n0, seq(sub))
    dist.barrier(group=sub)
    work = dist.broadcast(t, src=0, group=sub, async_op=True)
    assert seq(sub) == n0 + 3, (n0, seq(sub))  # counted when issued, before it completed
    work.wait()
    if rank < 2:  # point-to-point: only two ranks take part, so it must not count
        if rank == 0:
            dist.send(t, dst=1, group=sub)
        else:
            dist.recv(t, src=0, group=sub)
    assert seq(sub) == n0 + 3, (n0, seq(sub))
    same_on_all_ranks(seq(sub), "the sequence number")
elif mode == "detail":
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank}, group=sub)
    assert objs == [{"rank": r} for r in range(world)], objs
    out = [None] * world if rank == 0 else None
    dist.gather_object(("from", rank), out, dst=0, group=sub)
    if rank == 0:
        assert out == [("from", r) for r in range(world)], out
else:
    sys.exit(f"unknown mode {mode}")
dist.barrier()
if rank == 0:
    print("SEQ OK", flush=True)
