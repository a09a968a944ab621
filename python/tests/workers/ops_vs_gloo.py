"""Every collective of the "gz" backend, for every dtype and reduce op, against Gloo's result on the
same inputs (one gloo group next to the gz default group), and against a local reference where Gloo
lacks the combination. Run under a launcher: rank 0 prints "OPS OK <cases> cases, <n> compared with
gloo" or the first mismatches; exit code 1 on any mismatch.
"""
import datetime
import sys
import warnings

import torch
import torch.distributed as dist

import guozhuang  # noqa: F401

warnings.filterwarnings("ignore")  # torch's deprecation notes for the private ops exercised here

dist.init_process_group("gz", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
R = dist.ReduceOp
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int16,
          torch.int32, torch.int64, torch.bool]
INTS = {torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64}
cases = compared = 0
failures = []


def data(r, dtype, n=37, salt=0):
    """Rank r's input: small integers (exact in every dtype; products stay in range)."""
    g = torch.Generator().manual_seed(1000 * r + salt)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    return torch.randint(1, 4, (n,), generator=g).to(dtype)


def reference(op, dtype, inputs):
    x = torch.stack([t.to(torch.float64) if dtype != torch.bool else t for t in inputs])
    if dtype == torch.bool:
        if op in (R.SUM, R.MAX, R.BOR):
            return x.any(0)
        if op in (R.PRODUCT, R.MIN, R.BAND):
            return x.all(0)
        return (x.sum(0) % 2).bool()  # BXOR
    if op in (R.BAND, R.BOR, R.BXOR):
        acc = inputs[0].clone()
        for t in inputs[1:]:
            acc = {R.BAND: torch.bitwise_and, R.BOR: torch.bitwise_or, R.BXOR: torch.bitwise_xor}[op](acc, t)
        return acc
    if op == R.SUM:
        out = x.sum(0)
    elif op == R.PRODUCT:
        out = x.prod(0)
    elif op == R.MIN:
        out = x.min(0).values
    elif op == R.MAX:
        out = x.max(0).values
    else:  # AVG: integers truncate, as our kernels do
        out = x.sum(0) / len(inputs)
        if dtype in INTS:
            out = out.trunc()
    return out.to(dtype)  # inputs are small: nothing overflows


def check(name, got, want, gloo_result=None):
    global cases, compared
    cases += 1
    if not torch.equal(got, want):
        failures.append(f"{name}: gz {got.tolist()[:8]} vs reference {want.tolist()[:8]}")
    if gloo_result is not None:
        compared += 1
        if not torch.equal(got, gloo_result):
            failures.append(f"{name}: gz {got.tolist()[:8]} vs gloo {gloo_result.tolist()[:8]}")


def on_gloo(fn):
    """fn(group) on the gloo group; None when gloo does not support it."""
    try:
        return fn(gloo)
    except (RuntimeError, ValueError):
        return None


OPS = [R.SUM, R.AVG, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR]
for dtype in DTYPES:
    inputs = [data(r, dtype) for r in range(world)]
    for op in OPS:
        floating = dtype.is_floating_point
        if op in (R.BAND, R.BOR, R.BXOR) and floating:
            continue
        if op == R.AVG and dtype == torch.bool:
            continue
        name = f"all_reduce {dtype} {op}"
        t = inputs[rank].clone()
        dist.all_reduce(t, op=op)
        g = on_gloo(lambda grp: (lambda u: (dist.all_reduce(u, op=op, group=grp), u)[1])(inputs[rank].clone()))
        check(name, t, reference(op, dtype, inputs), g)
        # reduce to the last rank
        if dtype != torch.bool or op != R.AVG:
            t = inputs[rank].clone()
            dist.reduce(t, dst=world - 1, op=op)
            g = on_gloo(lambda grp: (lambda u: (dist.reduce(u, dst=world - 1, op=op, group=grp), u)[1])(
                inputs[rank].clone()))
            if rank == world - 1:
                check(f"reduce {dtype} {op}", t, reference(op, dtype, inputs), g)
    # reduce_scatter: rank r gets the reduction of block r
    if dtype != torch.bool:
        blocks = [[data(r, dtype, 11, salt=b) for b in range(world)] for r in range(world)]
        for op in (R.SUM, R.MAX, R.MIN):
            out = torch.empty(11, dtype=dtype)
            dist.reduce_scatter(out, [b.clone() for b in blocks[rank]], op=op)
            check(f"reduce_scatter {dtype} {op}", out, reference(op, dtype, [blocks[r][rank] for r in range(world)]))
            flat_in = torch.cat(blocks[rank])
            out2 = torch.empty(11, dtype=dtype)
            dist._reduce_scatter_base(out2, flat_in, op=op)
            check(f"_reduce_scatter_base {dtype} {op}", out2, out)
    # data movement
    t = inputs[rank].clone()
    dist.broadcast(t, src=world - 1)
    g = on_gloo(lambda grp: (lambda u: (dist.broadcast(u, src=world - 1, group=grp), u)[1])(inputs[rank].clone()))
    check(f"broadcast {dtype}", t, inputs[world - 1], g)
    outs = [torch.empty_like(inputs[0]) for _ in range(world)]
    dist.all_gather(outs, inputs[rank])
    g_outs = on_gloo(lambda grp: (lambda o: (dist.all_gather(o, inputs[rank], group=grp), o)[1])(
        [torch.empty_like(inputs[0]) for _ in range(world)]))
    check(f"all_gather {dtype}", torch.stack(outs), torch.stack(inputs), torch.stack(g_outs) if g_outs else None)
    flat = torch.empty(world * inputs[0].numel(), dtype=dtype)
    dist._all_gather_base(flat, inputs[rank])
    check(f"_all_gather_base {dtype}", flat, torch.cat(inputs))
    coal = [[torch.empty(5, dtype=dtype), torch.empty(3, dtype=dtype)] for _ in range(world)]
    dist.all_gather_coalesced(coal, [inputs[rank][:5], inputs[rank][5:8]])
    g_coal = on_gloo(lambda grp: (lambda o: (dist.all_gather_coalesced(
        o, [inputs[rank][:5], inputs[rank][5:8]], group=grp), o)[1])(
        [[torch.empty(5, dtype=dtype), torch.empty(3, dtype=dtype)] for _ in range(world)]))
    check(f"all_gather_coalesced {dtype}", torch.stack([torch.cat(c) for c in coal]),
          torch.stack([t[:8] for t in inputs]), torch.stack([torch.cat(c) for c in g_coal]) if g_coal else None)
    gathered = [torch.empty_like(inputs[0]) for _ in range(world)] if rank == 0 else None
    dist.gather(inputs[rank], gathered, dst=0)
    g_gathered = on_gloo(lambda grp: (lambda o: (dist.gather(inputs[rank], o, dst=0, group=grp), o)[1])(
        [torch.empty_like(inputs[0]) for _ in range(world)] if rank == 0 else None))
    if rank == 0:
        check(f"gather {dtype}", torch.stack(gathered), torch.stack(inputs),
              torch.stack(g_gathered) if g_gathered else None)
    out = torch.empty_like(inputs[0])
    dist.scatter(out, [data(r, dtype, salt=7) for r in range(world)] if rank == 1 else None, src=1)
    g = on_gloo(lambda grp: (lambda u: (dist.scatter(
        u, [data(r, dtype, salt=7) for r in range(world)] if rank == 1 else None, src=1, group=grp), u)[1])(
        torch.empty_like(inputs[0])))
    check(f"scatter {dtype}", out, data(rank, dtype, salt=7), g)
    send = [data(rank, dtype, 4, salt=d) for d in range(world)]
    recv = [torch.empty(4, dtype=dtype) for _ in range(world)]
    dist.all_to_all(recv, send)
    g_recv = on_gloo(lambda grp: (lambda o: (dist.all_to_all(o, send, group=grp), o)[1])(
        [torch.empty(4, dtype=dtype) for _ in range(world)]))
    check(f"all_to_all {dtype}", torch.stack(recv), torch.stack([data(s, dtype, 4, salt=rank) for s in range(world)]),
          torch.stack(g_recv) if g_recv else None)
    # all_to_all_single with uneven splits: rank s sends s+d+1 rows to rank d
    in_splits = [rank + d + 1 for d in range(world)]
    out_splits = [s + rank + 1 for s in range(world)]
    src = torch.cat([data(rank, dtype, n, salt=10 + d) for d, n in enumerate(in_splits)]).reshape(-1, 1).repeat(1, 2)
    dst = torch.empty(sum(out_splits), 2, dtype=dtype)
    dist.all_to_all_single(dst, src, out_splits, in_splits)
    want = torch.cat([data(s, dtype, n, salt=10 + rank) for s, n in enumerate(out_splits)]).reshape(-1, 1).repeat(1, 2)
    check(f"all_to_all_single {dtype}", dst, want)
    # point to point: a ring, non-blocking both ways
    right, left = (rank + 1) % world, (rank - 1) % world
    got = torch.empty_like(inputs[0])
    reqs = [dist.isend(inputs[rank], right, tag=3), dist.irecv(got, left, tag=3)]
    for q in reqs:
        q.wait()
    check(f"isend/irecv ring {dtype}", got, inputs[left])
    if rank == 0:
        dist.send(inputs[0], 1)
    elif rank == 1:
        got = torch.empty_like(inputs[0])
        dist.recv(got, 0)
        check(f"send/recv {dtype}", got, inputs[0])

# batch_isend_irecv with every receive posted before its send, on both sides, and messages far
# bigger than any channel buffering: needs sends and receives to progress independently.
big = [torch.full((1 << 18,), float(rank * 10 + peer)) for peer in range(world)]
got = [torch.empty(1 << 18) for _ in range(world)]
ops = []
for peer in range(world):
    if peer != rank:
        ops += [dist.P2POp(dist.irecv, got[peer], peer), dist.P2POp(dist.isend, big[peer], peer)]
for req in dist.batch_isend_irecv(ops):
    req.wait()
for peer in range(world):
    if peer != rank:
        check(f"batch_isend_irecv from {peer}", got[peer], torch.full((1 << 18,), float(peer * 10 + rank)))

# all_reduce_coalesced, non-contiguous tensors, async work and futures, complex, sub-groups
ts = [data(rank, torch.float32, 5), data(rank, torch.float32, 9)]
dist.all_reduce_coalesced(ts)
g_ts = on_gloo(lambda grp: (lambda o: (dist.all_reduce_coalesced(o, group=grp), o)[1])(
    [data(rank, torch.float32, 5), data(rank, torch.float32, 9)]))
check("all_reduce_coalesced", torch.cat(ts),
      torch.cat([reference(R.SUM, torch.float32, [data(r, torch.float32, n) for r in range(world)]) for n in (5, 9)]),
      torch.cat(g_ts) if g_ts else None)
base = torch.stack([data(rank, torch.float32, 6, salt=s) for s in range(4)])
nc = base.t()  # non-contiguous
dist.all_reduce(nc)
check("all_reduce non-contiguous", nc, reference(R.SUM, torch.float32, [torch.stack(
    [data(r, torch.float32, 6, salt=s) for s in range(4)]) for r in range(world)]).t())
c = torch.complex(data(rank, torch.float32, 4), data(rank, torch.float32, 4, salt=5))
dist.all_reduce(c)
check("all_reduce complex64", c, sum(torch.complex(data(r, torch.float32, 4), data(r, torch.float32, 4, salt=5))
                                     for r in range(world)))
work = dist.all_reduce(data(rank, torch.float64, 1000), async_op=True)
fut = work.get_future().then(lambda f: f.value()[0] * 2)
work.wait()
check("async all_reduce + future.then", fut.wait(),
      reference(R.SUM, torch.float64, [data(r, torch.float64, 1000) for r in range(world)]) * 2)
def sparse_input(r):
    g = torch.Generator().manual_seed(77 + r)
    idx = torch.randint(0, 20, (2, 6), generator=g)
    return torch.sparse_coo_tensor(idx, torch.randint(1, 4, (6, 3), generator=g).float(), (20, 20, 3))


sp = sparse_input(rank)
dist.all_reduce(sp)
g_sp = on_gloo(lambda grp: (lambda u: (dist.all_reduce(u, group=grp), u)[1])(sparse_input(rank)))
check("all_reduce sparse", sp.to_dense(), sum(sparse_input(r).to_dense() for r in range(world)),
      g_sp.to_dense() if g_sp is not None else None)
premul = data(rank, torch.float32, 8)
dist.all_reduce(premul, op=dist._make_nccl_premul_sum(0.5))
check("all_reduce PREMUL_SUM 0.5", premul, reference(R.SUM, torch.float32, [data(r, torch.float32, 8) * 0.5
                                                                           for r in range(world)]))
sub_ranks = list(range(1, world)) if world > 2 else [0, 1]
sub = dist.new_group(sub_ranks)
if rank in sub_ranks:
    t = data(rank, torch.int64, 10)
    dist.all_reduce(t, group=sub)
    check("new_group all_reduce", t, reference(R.SUM, torch.int64, [data(r, torch.int64, 10) for r in sub_ranks]))
    assert guozhuang.comm_backend(sub) in ("shm", "gloo", "hier(shm+gloo)")
dist.barrier()

# clear errors for what the backend does not do
errors = 0
for bad in (lambda: dist.all_reduce(torch.ones(3), op=R.BAND),
            lambda: dist.recv(torch.empty(3)),
            lambda: dist.all_reduce(torch.ones(3, dtype=torch.complex64), op=R.MAX)):
    try:
        bad()
    except (RuntimeError, ValueError) as e:
        errors += 1
        if "gz backend" not in str(e) and "complex" not in str(e) and "not supported" not in str(e):
            failures.append(f"unclear error: {e}")
if errors != 3:
    failures.append(f"expected 3 errors for unsupported calls, got {errors}")
dist.barrier()

all_failures = [None] * world
dist.all_gather_object(all_failures, failures)
if rank == 0:
    merged = [f"rank {r}: {f}" for r, fs in enumerate(all_failures) for f in fs]
    if merged:
        print("\n".join(merged[:40]))
        print(f"OPS FAILED {len(merged)} of {cases} cases")
    else:
        print(f"OPS OK {cases} cases, {compared} compared with gloo")
dist.destroy_process_group()
sys.exit(1 if any(all_failures) else 0)
