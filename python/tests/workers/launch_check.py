"""One all-reduce through torch.distributed ("gz" or "gloo", argv[1]), guozhuang.torch ("hvd"), or
"gz" on Guozhuang's own rendezvous store ("gz-store": init_process_group(store=...), no torch
TCPStore). Every rank prints "LAUNCH OK rank=<r> world=<w> sum=<s>"."""
import sys

import torch

mode = sys.argv[1]
if mode == "hvd":
    import guozhuang.torch as hvd
    hvd.init()
    rank, world = hvd.rank(), hvd.size()
    s = hvd.allreduce(torch.tensor([float(rank + 1)]), op=hvd.Sum).item()
else:
    import torch.distributed as dist
    if mode.startswith("gz"):
        import guozhuang
    if mode == "gz-store":
        store, rank, world = guozhuang.rendezvous_store()
        dist.init_process_group("gz", store=store, rank=rank, world_size=world)
    else:
        dist.init_process_group(mode)  # env:// from the launcher, nothing else
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    s = t.item()
    dist.destroy_process_group()
print(f"LAUNCH OK rank={rank} world={world} sum={s:g}", flush=True)
