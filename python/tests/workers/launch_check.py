"""One all-reduce through torch.distributed ("gz" or "gloo", argv[1]) or guozhuang.torch ("hvd").
Every rank prints "LAUNCH OK rank=<r> world=<w> sum=<s>"."""
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
    if mode == "gz":
        import guozhuang  # noqa: F401
    dist.init_process_group(mode)  # env:// from the launcher, nothing else
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    s = t.item()
    dist.destroy_process_group()
print(f"LAUNCH OK rank={rank} world={world} sum={s:g}", flush=True)
