#!/usr/bin/python3
"""A/B throughput of PyTorch's DDP in Python on one shared machine: Gloo, "gz", the
no-communication ceiling (DDP on "gz" with a comm hook that returns each bucket untouched) and
guozhuang.torch's Horovod mode, all in the same two processes, interleaved in short blocks of steps
so that the machine's slow phases (other jobs) hit every configuration alike.

    flock /work/.bench.lock gzrun --nproc-per-node 2 /usr/bin/python3 bench/python_ab_bench.py \
        --model cnn --batch 64 --rounds 20 --block 10
(PYTHONPATH=build/python.) Each configuration has its own copy of the model (same initial weights)
and optimizer and runs `block` steps per round, in a rotating order; the time of a block is the
slowest rank's. Rank 0 prints samples/s per configuration (total over the ranks), per-round ratios
and their medians, and RESULT lines.
"""
import argparse
import copy
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ddp_bench  # noqa: E402  (the models of gz-bench train)
import guozhuang  # noqa: E402,F401
import guozhuang.torch as hvd  # noqa: E402


def noop_hook(state, bucket):
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["cnn", "bert-small"], default="cnn")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--block", type=int, default=10, help="steps per configuration per round")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--configs", default="gloo,gz,ceiling,horovod")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    gz = dist.new_group(backend="gz")
    hvd.init()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(42)
    if args.model == "cnn":
        base = ddp_bench.Cnn()
        make_opt = lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9)  # noqa: E731
        x = torch.randn(args.batch, 1, 28, 28)
        y = torch.randint(0, 10, (args.batch,))
    else:
        base = ddp_bench.BertSmall(seq=args.seq, **ddp_bench.BERT_SIZES["bert-small"])
        make_opt = lambda ps: torch.optim.AdamW(ps, lr=1e-4)  # noqa: E731
        x = torch.randint(1, 30522, (args.batch, args.seq))
        y = torch.randint(0, 2, (args.batch,))
    names = args.configs.split(",")
    runs = {}
    for name in names:
        model = copy.deepcopy(base).train()
        if name == "horovod":
            opt = hvd.DistributedOptimizer(make_opt(model.parameters()), named_parameters=model.named_parameters())
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            net = model
        else:
            net = DDP(model, process_group=None if name == "gloo" else gz)
            if name == "ceiling":
                net.register_comm_hook(None, noop_hook)
            opt = make_opt(model.parameters())
        runs[name] = (net, opt)

    def step(name):
        net, opt = runs[name]
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()

    for name in names:
        for _ in range(args.warmup):
            step(name)
    times = {n: [] for n in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]  # rotate: no config always runs first
        for name in order:
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(args.block):
                step(name)
            dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)
            times[name].append(dt.item())
    if rank == 0:
        samples = args.batch * world * args.block
        rate = {n: [samples / t for t in times[n]] for n in names}
        print(f"python_ab_bench: torch {torch.__version__} model={args.model} ranks={world} batch={args.batch} "
              f"rounds={args.rounds} block={args.block} gz engine={guozhuang.comm_backend(gz)} "
              f"load={os.getloadavg()[0]:.2f}")
        for n in names:
            total = samples * args.rounds / sum(times[n])
            print(f"RESULT impl=pytorch model={args.model} config={n} ranks={world} samples_per_s={total:.2f} "
                  f"median_block={statistics.median(rate[n]):.2f}")

        def ratio(a, b):
            per = [x / y for x, y in zip(rate[a], rate[b])]
            tot = sum(times[b]) / sum(times[a])
            return f"{a}/{b}: total {tot:.3f}, per-round median {statistics.median(per):.3f} " \
                   f"[{min(per):.3f} .. {max(per):.3f}]"

        for a, b in (("gz", "ceiling"), ("gz", "gloo"), ("gloo", "ceiling"), ("horovod", "gz")):
            if a in rate and b in rate:
                print(ratio(a, b))
        sys.stdout.flush()
    hvd.barrier()
    os._exit(0)  # skip Gloo's teardown (see ddp_bench.py)


if __name__ == "__main__":
    main()
