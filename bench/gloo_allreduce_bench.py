#!/usr/bin/python3
"""PyTorch ProcessGroupGloo all-reduce, timed like `gz-bench collectives` (the baseline row of
bench/run_multihost_bench.sh).

One process per rank, started by hand on every host (torchrun-style variables RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT). Per size: 5 warm-up all-reduces, then enough for about 0.25 s (every
rank agrees on the count), timed between barriers; the time is the slowest rank's mean per op,
as gz-bench reports it. Rank 0 prints one line per size:
    RESULT impl=torch-gloo op=allreduce dtype=f32 ranks=2 size_bytes=4096 time_us=123.4
Run with Debian's interpreter, which has torch 1.13:
    RANK=0 WORLD_SIZE=2 MASTER_ADDR=10.77.0.1 MASTER_PORT=29700 /usr/bin/python3 \
        bench/gloo_allreduce_bench.py --sizes 4K,64K,1M,16M
"""
import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist


def parse_size(s):
    mul = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1].upper(), 1)
    return int(float(s[:-1] if mul > 1 else s) * mul)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="4K,64K,1M,16M", help="comma list of byte sizes (K/M/G suffixes)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--seconds", type=float, default=0.25, help="timed seconds per size (about)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    for size in (parse_size(s) for s in args.sizes.split(",")):
        t = torch.ones(size // 4, dtype=torch.float32)
        dist.all_reduce(t)  # correctness once, as gz-bench checks once per size
        if t[0].item() != world or t[-1].item() != world:
            raise SystemExit(f"WRONG RESULT: torch gloo all-reduce of {size} bytes gave {t[0].item()}")
        t.zero_()
        for _ in range(args.warmup):
            dist.all_reduce(t)
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        one = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(one, op=dist.ReduceOp.MAX)
        iters = int(min(2000, max(5, args.seconds / max(one.item(), 1e-7))))
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        secs = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(secs, op=dist.ReduceOp.MAX)
        if rank == 0:
            print(f"RESULT impl=torch-gloo op=allreduce dtype=f32 ranks={world} size_bytes={size} "
                  f"time_us={secs.item() / iters * 1e6:.2f} iters={iters}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
