#!/usr/bin/python3
"""PyTorch DistributedDataParallel on Guozhuang's "gz" backend: Fashion-MNIST, CPU.

    gzrun --nproc-per-node 2 /usr/bin/python3 examples/python/ddp_fashion_mnist.py
    torchrun --nproc_per_node 2 examples/python/ddp_fashion_mnist.py      (or mpirun / srun)

A plain DDP script: the only Guozhuang line is `import guozhuang`, which registers the backend.
"""
import argparse
import datetime
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

import guozhuang  # noqa: F401  (registers the "gz" backend)
import fashion_mnist_data


class Net(nn.Module):
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


def evaluate(model, loader):
    """Test accuracy over every rank's shard (sums of correct and seen, all-reduced)."""
    model.eval()
    stats = torch.zeros(2, dtype=torch.float64)
    with torch.no_grad():
        for x, y in loader:
            stats[0] += (model(x).argmax(1) == y).sum()
            stats[1] += y.numel()
    dist.all_reduce(stats)
    model.train()
    return 100.0 * stats[0].item() / stats[1].item()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="gz", help="torch.distributed backend (gz, gloo)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--data", default=fashion_mnist_data.DEFAULT_DIR)
    p.add_argument("--limit-train", type=int, default=None, help="use only the first N training images")
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args()

    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)

    train_set = fashion_mnist_data.load("train", args.data, args.limit_train)
    test_set = fashion_mnist_data.load("t10k", args.data)
    train_sampler = DistributedSampler(train_set, shuffle=True, seed=args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    test_loader = DataLoader(test_set, batch_size=256, sampler=DistributedSampler(test_set, shuffle=False))

    model = DDP(Net())  # broadcasts rank 0's parameters; gradients are all-reduced during backward
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    if rank == 0:
        print(f"{world} ranks, backend {args.backend}"
              + (f" ({guozhuang.comm_backend()})" if args.backend == "gz" else "")
              + f", {len(train_set)} training images, batch {args.batch_size} per rank", flush=True)

    start = time.time()
    for epoch in range(1, args.epochs + 1):
        train_sampler.set_epoch(epoch)  # a different shuffle every epoch, the same on every rank
        for step, (x, y) in enumerate(train_loader):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            if rank == 0 and step % 200 == 0:
                print(f"epoch {epoch} step {step}/{len(train_loader)} loss {loss.item():.4f}", flush=True)
        accuracy = evaluate(model, test_loader)
        if rank == 0:
            print(f"epoch {epoch}: test accuracy {accuracy:.2f}% ({time.time() - start:.1f} s)", flush=True)
    if rank == 0:
        print(f"TEST ACCURACY {accuracy:.2f}% after {args.epochs} epoch(s), {time.time() - start:.1f} s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
