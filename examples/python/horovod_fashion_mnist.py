#!/usr/bin/python3
"""Horovod-style data parallelism on Guozhuang: Fashion-MNIST, CPU.

    gzrun --nproc-per-node 2 /usr/bin/python3 examples/python/horovod_fashion_mnist.py
    mpirun -np 2 python3 examples/python/horovod_fashion_mnist.py          (or torchrun / srun)

Horovod's PyTorch example shape; the only change from a Horovod script is the import line
(`import horovod.torch as hvd` -> `import guozhuang.torch as hvd`).
"""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

import guozhuang.torch as hvd
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


def metric_average(value, name):
    return hvd.allreduce(torch.tensor(value, dtype=torch.float64), name=name).item()


def test(model, loader, sampler):
    model.eval()
    correct = seen = 0
    with torch.no_grad():
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum().item()
            seen += y.numel()
    model.train()
    # Every rank saw an equal share (the sampler pads): the average of the ranks' accuracies.
    return 100.0 * metric_average(correct / seen, "accuracy")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--fp16-allreduce", action="store_true", help="gradients travel as float16")
    p.add_argument("--data", default=fashion_mnist_data.DEFAULT_DIR)
    p.add_argument("--limit-train", type=int, default=None, help="use only the first N training images")
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args()

    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    train_set = fashion_mnist_data.load("train", args.data, args.limit_train)
    test_set = fashion_mnist_data.load("t10k", args.data)
    train_sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank(), seed=args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    test_sampler = DistributedSampler(test_set, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
    test_loader = DataLoader(test_set, batch_size=256, sampler=test_sampler)

    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    # Every rank starts from rank 0's weights and optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)
    if hvd.rank() == 0:
        print(f"{hvd.size()} ranks ({hvd.comm_backend()}), {len(train_set)} training images, "
              f"batch {args.batch_size} per rank", flush=True)

    start = time.time()
    for epoch in range(1, args.epochs + 1):
        train_sampler.set_epoch(epoch)
        for step, (x, y) in enumerate(train_loader):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()  # waits for the averaged gradients, then steps
            if hvd.rank() == 0 and step % 200 == 0:
                print(f"epoch {epoch} step {step}/{len(train_loader)} loss {loss.item():.4f}", flush=True)
        accuracy = test(model, test_loader, test_sampler)
        if hvd.rank() == 0:
            print(f"epoch {epoch}: test accuracy {accuracy:.2f}% ({time.time() - start:.1f} s)", flush=True)
    if hvd.rank() == 0:
        print(f"TEST ACCURACY {accuracy:.2f}% after {args.epochs} epoch(s), {time.time() - start:.1f} s", flush=True)


if __name__ == "__main__":
    main()
