"""DDP on "gz" and guozhuang.torch's DistributedOptimizer against DDP on Gloo, same model, same
data, same steps: parameters must agree after every step. Then Horovod's join, broadcast_parameters
and broadcast_optimizer_state. Rank 0 prints "TRAIN OK" or the first disagreements; exit 1 on any.
"""
import copy
import datetime
import sys
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import guozhuang  # noqa: F401
import guozhuang.torch as hvd

warnings.filterwarnings("ignore")
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))  # the reference
hvd.init()
gz = dist.new_group(backend="gz")
rank, world = dist.get_rank(), dist.get_world_size()
assert (hvd.rank(), hvd.size()) == (rank, world)
failures = []


class Net(nn.Module):
    def __init__(self, unused=False):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3)
        self.fc1 = nn.Linear(8 * 26 * 26, 64)
        if unused:
            self.unused = nn.Linear(3, 3)  # never used: find_unused_parameters
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(F.relu(self.conv(x)).flatten(1))))


def batches(n, seed=0):
    g = torch.Generator().manual_seed(seed * 100 + rank)
    return [(torch.randn(16, 1, 28, 28, generator=g), torch.randint(0, 10, (16,), generator=g)) for _ in range(n)]


def compare(name, a, b, rtol=1e-5, atol=1e-6):
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        if not torch.allclose(p, q, rtol=rtol, atol=atol):
            failures.append(f"{name}: {n} differs by {(p - q).abs().max().item():.3g}")
            return


def train_step(model, opt, x, y):
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()


torch.manual_seed(0)
base = Net()
torch.manual_seed(0)
base_unused = Net(unused=True)
for label, kw, hook in [("default", {}, None), ("grad-as-bucket-view", {"gradient_as_bucket_view": True}, None),
                        ("unused-params", {"find_unused_parameters": True}, None),
                        ("small-buckets", {"bucket_cap_mb": 0.05}, None),
                        ("fp16-hook", {}, default_hooks.fp16_compress_hook)]:
    src = base_unused if kw.get("find_unused_parameters") else base
    ref, ours = copy.deepcopy(src), copy.deepcopy(src)
    before = guozhuang._C._shared_bucket_bytes()
    ddp_ref = DDP(ref, **kw)
    if guozhuang._C._shared_bucket_bytes() != before:
        failures.append(f"DDP {label}: a gloo group's buckets went to shared memory")
    ddp_gz = DDP(ours, process_group=gz, **kw)
    # The Reducer's buckets (the gradients, but tiny buckets, which take the latency path anyway)
    # live in the gz group's shared buffers.
    param_bytes = sum(p.numel() * p.element_size() for p in ours.parameters())
    if guozhuang._C._shared_bucket_bytes() - before < param_bytes - 16384:
        failures.append(f"DDP {label}: {guozhuang._C._shared_bucket_bytes() - before} bytes of buckets in shared "
                        f"memory, expected about the {param_bytes} bytes of parameters")
    if hook is not None:
        ddp_ref.register_comm_hook(None, hook)
        ddp_gz.register_comm_hook(gz, hook)
    o_ref = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    o_gz = torch.optim.SGD(ours.parameters(), lr=0.05, momentum=0.9)
    for step, (x, y) in enumerate(batches(4)):
        train_step(ddp_ref, o_ref, x, y)
        train_step(ddp_gz, o_gz, x, y)
        compare(f"DDP {label} step {step}", ddp_gz.module, ddp_ref.module, rtol=1e-3 if hook else 1e-5,
                atol=1e-4 if hook else 1e-6)

# sparse gradients (nn.Embedding(sparse=True)): DDP all-reduces them as sparse tensors
torch.manual_seed(5)
emb = nn.Sequential(nn.EmbeddingBag(50, 8, mode="sum", sparse=True), nn.Linear(8, 2))
ref, ours = copy.deepcopy(emb), copy.deepcopy(emb)
ddp_ref, ddp_gz = DDP(ref), DDP(ours, process_group=gz)
o_ref, o_gz = torch.optim.SGD(ref.parameters(), lr=0.1), torch.optim.SGD(ours.parameters(), lr=0.1)
g = torch.Generator().manual_seed(rank)
for step in range(3):
    ids, y = torch.randint(0, 50, (6, 4), generator=g), torch.randint(0, 2, (6,), generator=g)
    train_step(ddp_ref, o_ref, ids, y)
    train_step(ddp_gz, o_gz, ids, y)
    compare(f"DDP sparse embedding step {step}", ours, ref)

# no_sync(): gradients accumulate locally, the next synchronised backward averages them all
ref, ours = copy.deepcopy(base), copy.deepcopy(base)
ddp_ref, ddp_gz = DDP(ref), DDP(ours, process_group=gz)
for model in (ddp_ref, ddp_gz):
    (x1, y1), (x2, y2) = batches(2, seed=3)
    with model.no_sync():
        F.cross_entropy(model(x1), y1).backward()
    F.cross_entropy(model(x2), y2).backward()
for (n, p), (_, q) in zip(ref.named_parameters(), ours.named_parameters()):
    if p.grad is not None and not torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-7):
        failures.append(f"DDP no_sync: grad of {n} differs")

# Horovod mode: the same training as DDP on gloo
for label, compression, tol in [("none", hvd.Compression.none, 1e-5), ("fp16", hvd.Compression.fp16, 2e-3)]:
    ref, ours = copy.deepcopy(base_unused), copy.deepcopy(base_unused)
    ddp_ref = DDP(ref, find_unused_parameters=True)
    o_ref = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    used = [(n, p) for n, p in ours.named_parameters() if not n.startswith("unused")]
    o_hvd = hvd.DistributedOptimizer(torch.optim.SGD([p for _, p in used], lr=0.05, momentum=0.9),
                                     named_parameters=used, compression=compression)
    for step, (x, y) in enumerate(batches(4, seed=1)):
        train_step(ddp_ref, o_ref, x, y)
        train_step(ours, o_hvd, x, y)
        compare(f"Horovod {label} step {step}", ours, ddp_ref.module, rtol=tol, atol=tol)

# join: rank r has 2 + r batches; the others step with zero gradients until everyone joined
model = copy.deepcopy(base)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), named_parameters=model.named_parameters())
for x, y in batches(2 + rank, seed=2):
    train_step(model, opt, x, y)
last = hvd.join()
if last != world - 1:
    failures.append(f"join returned {last}, expected {world - 1} (the rank with the most batches)")
hvd.broadcast_parameters(model.state_dict(), root_rank=last)
everyone = hvd.allgather(torch.cat([p.detach().reshape(-1) for p in model.parameters()]).unsqueeze(0))
if not all(torch.equal(everyone[0], everyone[r]) for r in range(world)):
    failures.append("join + broadcast_parameters: parameters differ across ranks")

# broadcast_optimizer_state: rank 0's Adam moments reach the others
model = copy.deepcopy(base)
adam = torch.optim.Adam(model.parameters(), lr=1e-3)
if rank == 0:
    train_step(model, adam, *batches(1, seed=4)[0])
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(adam, root_rank=0)
moments = torch.cat([adam.state[p]["exp_avg"].reshape(-1) for p in model.parameters() if p in adam.state])
everyone = hvd.allgather(moments.unsqueeze(0))
if moments.numel() == 0 or not all(torch.equal(everyone[0], everyone[r]) for r in range(world)):
    failures.append("broadcast_optimizer_state: Adam state differs across ranks")

# Horovod's tensor API against torch's on gloo
x = torch.arange(6, dtype=torch.float32) * (rank + 1)
want = x.clone()
dist.all_reduce(want)
if not torch.allclose(hvd.allreduce(x, op=hvd.Sum), want) or not torch.allclose(hvd.allreduce(x), want / world):
    failures.append("hvd.allreduce differs from gloo's all_reduce")
h = hvd.allreduce_async_(x.clone(), op=hvd.Max)
got = hvd.synchronize(h)
if not torch.equal(got, torch.arange(6, dtype=torch.float32) * world):
    failures.append("hvd.allreduce_async_ Max")
if not torch.equal(hvd.broadcast(torch.tensor([rank]), root_rank=world - 1), torch.tensor([world - 1])):
    failures.append("hvd.broadcast")
xg = torch.ones(rank + 1, 2, requires_grad=True)
g = hvd.allgather(xg)
g.sum().backward()
if g.shape[0] != world * (world + 1) // 2 or not torch.allclose(xg.grad, torch.full_like(xg, float(world))):
    failures.append(f"hvd.allgather shape {tuple(g.shape)} / gradient {xg.grad.flatten().tolist()}")

everyone = [None] * world
dist.all_gather_object(everyone, failures)
if rank == 0:
    merged = [f"rank {r}: {f}" for r, fs in enumerate(everyone) for f in fs]
    print("\n".join(merged[:30]) if merged else "TRAIN OK", flush=True)
sys.exit(1 if any(everyone) else 0)
