#!/usr/bin/python3
"""PyTorch DDP (gloo) baseline for `gz-bench train`: the same two models and synthetic inputs.

Run with Debian's interpreter, which has torch 1.13:  /usr/bin/python3 bench/ddp_bench.py \
    --model cnn --nproc 2 --batch 32 --steps 50 --warmup 5 --threads 1
Spawns --nproc processes (torch.multiprocessing) on one node; prints samples/s (total over ranks)
on rank 0 as a RESULT line in the format gz-bench uses.

Across hosts (one process per host, started by the caller on each): --env reads RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT from the environment instead of spawning, e.g. on host i of 2:
    RANK=i WORLD_SIZE=2 MASTER_ADDR=10.77.0.1 MASTER_PORT=29600 /usr/bin/python3 bench/ddp_bench.py \
        --env --model bert-small --batch 8 --steps 10 --warmup 2
--model bert-base: the same encoder at BERT-base size (12 layers, hidden 768, 12 heads, FFN 3072),
matching `gz-bench train --model bert-base`.
--sparse-embedding: the token embedding is nn.Embedding(sparse=True), so DDP all-reduces only the
rows of this step's tokens (ProcessGroupGloo's sparse all-reduce), the advantage gz's row-sparse
exchange has; the averaged sparse gradient is made dense before AdamW (which refuses sparse
gradients), so the update is the dense one, as in gz.

Guozhuang from Python (build/python on PYTHONPATH): --backend gz runs the same DDP on our "gz"
backend; --hook noop registers a DDP comm hook that returns each bucket untouched (no communication:
the ceiling of any backend); --mode horovod trains with guozhuang.torch's DistributedOptimizer
instead of DDP (Horovod's API over our Horovod-mode core).
"""
import argparse
import datetime
import math
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


class Cnn(nn.Module):
    """conv 1->32 3x3 p1, ReLU, maxpool 2, conv 32->64 3x3 p1, ReLU, maxpool 2, 3136->128, ReLU, 128->10."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class EncoderLayer(nn.Module):
    """Post-LayerNorm transformer block: self-attention, then GELU feed-forward."""

    def __init__(self, hidden, heads, ffn, dropout):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.ffn_in = nn.Linear(hidden, ffn)
        self.ffn_out = nn.Linear(ffn, hidden)
        self.norm1 = nn.LayerNorm(hidden, eps=1e-12)
        self.norm2 = nn.LayerNorm(hidden, eps=1e-12)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, key_bias):
        n, t, h = x.shape
        d = h // self.heads
        q, k, v = self.qkv(x).view(n, t, 3, self.heads, d).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d) + key_bias
        ctx = (self.drop(scores.softmax(-1)) @ v).transpose(1, 2).reshape(n, t, h)
        y = self.norm1(x + self.drop(self.out(ctx)))
        return self.norm2(y + self.drop(self.ffn_out(F.gelu(self.ffn_in(y)))))


class BertSmall(nn.Module):
    """BERT-style encoder classifier: vocab 30522, hidden 256, 4 layers, 4 heads, FFN 1024."""

    def __init__(self, seq=128, vocab=30522, hidden=256, layers=4, heads=4, ffn=1024, classes=2, dropout=0.1,
                 sparse=False):
        super().__init__()
        self.tokens = nn.Embedding(vocab, hidden, padding_idx=0, sparse=sparse)
        self.positions = nn.Embedding(seq, hidden)
        self.norm = nn.LayerNorm(hidden, eps=1e-12)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList([EncoderLayer(hidden, heads, ffn, dropout) for _ in range(layers)])
        self.pooler = nn.Linear(hidden, hidden)
        self.classifier = nn.Linear(hidden, classes)

    def forward(self, ids):
        keep = ids.ne(0)
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1])).unsqueeze(0)
        x = self.drop(self.norm(x))
        key_bias = torch.zeros(keep.shape).masked_fill(~keep, -1e9).view(ids.shape[0], 1, 1, ids.shape[1])
        for block in self.blocks:
            x = block(x, key_bias)
        w = keep.to(x.dtype).unsqueeze(-1)
        pooled = torch.tanh(self.pooler((x * w).sum(1) / w.sum(1).clamp_min(1.0)))
        return self.classifier(self.drop(pooled))


BERT_SIZES = {"bert-small": dict(hidden=256, layers=4, heads=4, ffn=1024),
              "bert-base": dict(hidden=768, layers=12, heads=12, ffn=3072)}


def run(rank, args, port):
    torch.set_num_threads(args.threads)
    torch.manual_seed(42)
    world = args.nproc
    hvd = None
    if args.backend == "gz" or args.mode == "horovod":
        import guozhuang  # noqa: F401  (registers "gz")
    if world > 1 and args.mode == "horovod":
        import guozhuang.torch as hvd
        if not args.env:
            os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                              LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        hvd.init()
    elif world > 1:
        # A bounded timeout: a stuck run fails instead of leaving a worker spinning.
        init = "env://" if args.env else f"tcp://127.0.0.1:{port}"
        dist.init_process_group(args.backend, init_method=init, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=300))
    if args.model == "cnn":
        model = Cnn()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x = torch.randn(args.batch, 1, 28, 28)
        y = torch.randint(0, 10, (args.batch,))
    else:
        model = BertSmall(seq=args.seq, sparse=args.sparse_embedding, **BERT_SIZES[args.model])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randint(1, 30522, (args.batch, args.seq))
        y = torch.randint(0, 2, (args.batch,))
    model.train()
    net = model
    if hvd is not None:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    elif world > 1:
        net = nn.parallel.DistributedDataParallel(model)
        if args.hook == "noop":
            def noop(state, bucket):  # no communication: each bucket comes back as it is
                fut = torch.futures.Future()
                fut.set_result(bucket.buffer())
                return fut
            net.register_comm_hook(None, noop)

    sparse = [model.tokens.weight] if args.sparse_embedding and args.model != "cnn" else []

    def step():
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        for p in sparse:  # the averaged rows, densified for AdamW: the same update as the dense path
            if p.grad is not None and p.grad.is_sparse:
                p.grad = p.grad.to_dense()
        opt.step()
        for p in sparse:  # DDP expects a sparse gradient again next step
            p.grad = None

    for _ in range(args.warmup):
        step()
    if hvd is not None:
        hvd.barrier()
    elif world > 1:
        dist.barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    secs = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    if hvd is not None:
        secs = hvd.allreduce(secs, op=hvd.Max)
    elif world > 1:
        dist.all_reduce(secs, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
    secs = secs.item()
    if rank == 0:
        samples = args.batch * world * args.steps
        backend = "none" if world == 1 else ("gz" if hvd is not None else args.backend)
        print(f"ddp_bench.py: torch {torch.__version__} model={args.model} ranks={world} batch={args.batch} "
              f"threads={args.threads} steps={args.steps} backend={backend} hook={args.hook} "
              f"sparse_embedding={args.sparse_embedding}")
        print(f"RESULT impl=pytorch model={args.model} mode={args.mode} backend={backend} hook={args.hook} ranks={world} "
              f"samples_per_s={samples / secs:.2f} step_ms={1000.0 * secs / args.steps:.3f}", flush=True)
    if hvd is not None:
        hvd.barrier()
        sys.stdout.flush()
        os._exit(0)
    if world > 1:
        # Skip gloo's teardown: about one run in six hung there (after the result was printed) with
        # Debian's torch 1.13, and the benchmark script would then wait for its timeout.
        dist.barrier()
        sys.stdout.flush()
        os._exit(0)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["cnn", "bert-small", "bert-base"], default="cnn")
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--batch", type=int, default=32, help="samples per rank")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--sparse-embedding", action="store_true",
                   help="bert: nn.Embedding(sparse=True) for the tokens (rows on the wire), densified before AdamW")
    p.add_argument("--backend", choices=["gloo", "gz"], default="gloo", help="torch.distributed backend for DDP")
    p.add_argument("--hook", choices=["none", "noop"], default="none",
                   help="noop: a DDP comm hook that returns the bucket untouched (the no-communication ceiling)")
    p.add_argument("--mode", choices=["ddp", "horovod"], default="ddp",
                   help="horovod: guozhuang.torch.DistributedOptimizer instead of DDP")
    p.add_argument("--env", action="store_true",
                   help="one rank of a multi-host job: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment")
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    if args.env:
        args.nproc = int(os.environ["WORLD_SIZE"])
        run(int(os.environ["RANK"]), args, 0)
    elif args.nproc == 1:
        run(0, args, 0)
    else:
        mp.spawn(run, args=(args, free_port()), nprocs=args.nproc, join=True)


if __name__ == "__main__":
    main()
