"""hvd.elastic.run / TorchState over gzrun restarts. argv: STEPS KILL_AT [KILL_RANK [nodes]].

Trains a small model in Horovod mode (SGD with momentum: the optimizer state matters), one commit
per step; each step's data depends only on the step and the rank, so a resumed run must end with the
same parameters as an uninterrupted one. KILL_AT > 0: rank KILL_RANK (1) SIGKILLs itself right after
that step's update, before its commit, in the first attempt (GZ_RESTART_COUNT 0) only; unless it
writes its node's files itself, it first waits until the writer committed the step before (so the
race between that commit and gzrun stopping the survivor is not part of the test). Prints
"RAN <rank> <step>" per step and rank 0 "FINAL <hash of the parameters>".
"nodes": every rank keeps its commits in a folder of its own (GZ_ELASTIC_DIR/rank-N), as if each
were a node, and after the restart the killed rank's folder is gone (its node was lost).
"""
import hashlib
import os
import shutil
import signal
import sys
import time

import torch

import guozhuang.torch as hvd

steps, kill_at = int(sys.argv[1]), int(sys.argv[2])
kill_rank = int(sys.argv[3]) if len(sys.argv) > 3 else 1
hvd.init()
nodes = len(sys.argv) > 4 and sys.argv[4] == "nodes"
if nodes:
    own = os.path.join(os.environ["GZ_ELASTIC_DIR"], f"rank-{hvd.rank()}")
    if hvd.rank() == kill_rank and os.environ.get("GZ_RESTART_COUNT", "0") != "0":
        shutil.rmtree(own, ignore_errors=True)
    os.environ["GZ_ELASTIC_DIR"] = own
torch.manual_seed(1 + hvd.rank())  # different initial weights per rank: the sync must fix that
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                               named_parameters=model.named_parameters())
state = hvd.elastic.TorchState(model, opt, step=0)


def die(state):
    files = state._files
    if not files.writer:
        d = files.dir if not nodes else files.dir.replace(f"rank-{hvd.rank()}", f"rank-{1 - hvd.rank()}")
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(d, f"commit-{kill_at - 1}.pt")) and time.monotonic() < deadline:
            time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGKILL)


@hvd.elastic.run
def train(state):
    while state.step < steps:
        g = torch.Generator().manual_seed(1000 * state.step + hvd.rank())
        x = torch.randn(16, 8, generator=g)
        opt.zero_grad()
        ((model(x) - x.sum(1, keepdim=True)) ** 2).mean().backward()
        opt.step()
        state.step += 1
        print(f"RAN {hvd.rank()} {state.step}", flush=True)
        if state.step == kill_at and hvd.rank() == kill_rank and os.environ.get("GZ_RESTART_COUNT", "0") == "0":
            die(state)
        state.commit()


train(state)
if hvd.rank() == 0:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    print("FINAL", h.hexdigest(), flush=True)
