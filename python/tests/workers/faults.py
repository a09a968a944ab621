"""Failure behaviour of the "gz" backend. argv: MODE TIMEOUT_S. Rank 0 prints
"RAISED <seconds> <message>" when its op failed as expected, "NO ERROR" otherwise.

  stall    rank 1 stops calling collectives (sleeps): rank 0's all_reduce must fail by the group's timeout
  wait     as stall, but rank 0 waits on an async op with Work.wait(timeout=1 s)
  kill     rank 1 kills itself (SIGKILL) after a successful all_reduce: rank 0's next op must fail
  ddp      as kill, inside DDP's backward (the reducer's future must fail, not hang)
  abort    as stall, with two async ops queued; guozhuang.abort() must fail both futures at once
           (the second never ran: its future fails when the queue drops it)
  teardown no failure: 30 times, async ops on temporary tensors, then the group is destroyed while
           they finish (their last reference goes on the progress thread, which then needs the
           interpreter lock); prints "RAISED 0 teardown ok" when all 30 ended
"""
import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import guozhuang  # noqa: F401

mode, timeout_s = sys.argv[1], float(sys.argv[2])
dist.init_process_group("gz", timeout=datetime.timedelta(seconds=timeout_s))
if mode == "teardown":
    for i in range(30):
        g = dist.new_group(backend="gz")
        for _ in range(4):
            dist.all_reduce(torch.ones(1 << 14), group=g, async_op=True)  # nobody keeps tensor or work
        dist.destroy_process_group(g)
    if dist.get_rank() == 0:
        print("RAISED 0 teardown ok", flush=True)
    os._exit(0)
rank = dist.get_rank()
t = torch.ones(1 << 16)
dist.all_reduce(t)  # everyone is there once
assert t[0].item() == dist.get_world_size()
if mode == "ddp":
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, 256))
dist.barrier()

if rank == 1:
    if mode in ("kill", "ddp"):
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(timeout_s + 8)  # stall: the peer must give up without us
    os._exit(0)

t0 = time.monotonic()
try:
    if mode == "abort":
        running = dist.all_reduce(t, async_op=True).get_future()
        queued = dist.all_reduce(torch.ones(4), async_op=True).get_future()
        time.sleep(0.3)
        guozhuang.abort(reason="test abort")
        failed = 0
        for fut in (running, queued):
            try:
                fut.wait()
            except RuntimeError as e:
                failed += 1
                last = e
        if failed == 2:
            raise last
    elif mode == "wait":
        work = dist.all_reduce(t, async_op=True)
        work.wait(timeout=datetime.timedelta(seconds=1))
    elif mode == "ddp":
        time.sleep(0.5)  # rank 1 is gone
        model(torch.randn(8, 256)).sum().backward()
    else:
        if mode == "kill":
            time.sleep(0.5)
        dist.all_reduce(t)
    print("NO ERROR", flush=True)
except RuntimeError as e:
    print(f"RAISED {time.monotonic() - t0:.3f} {' '.join(str(e).split())[:600]}", flush=True)
os._exit(0)  # the group is broken; skip its teardown
