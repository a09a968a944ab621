"""hvd.elastic.run / TorchState under gzrun --recovery in-place. argv: STEPS KILL_AT WHERE [KILL_AGAIN].

A small model in Horovod mode (SGD with momentum: the optimizer state matters), one commit per step;
each step's data depends only on the step and the rank, so a recovered run must end with the
parameters of an uninterrupted one. Each step ends with an all-reduce of the loss (a metric, as
Horovod scripts log it) between the update and the commit. KILL_AT > 0: rank 1's first process
(GZ_REPLACEMENT 0) SIGKILLs itself in step KILL_AT: WHERE "after_update" right after its update (the
survivors fail in the metric's all-reduce with that step's update applied but not committed: they
must restore their last commit); "in_backward" before its backward (the survivors fail in the
gradients' all-reduce, their averaging in flight).
KILL_AGAIN > 0: the replacement dies the same way in step KILL_AGAIN (a second recovery).
The learning rate is Horovod's base rate times hvd.size(), set again by a reset callback (Horovod's
contract: register_reset_callbacks is where a script adapts to the world it now has); a reset prints
"RESET <rank> <size> <lr>".
Prints "PID <rank> <pid>" at the start, "RAN <rank> <step>" and "COMMIT <step> <rank> <size> <pid>"
per committed step, rank 0 "FINAL <hash of the parameters>" and every rank "PARAMS <rank> <hash>".
GZ_TEST_STEP_SLEEP (seconds, default 0): a pause after each commit, so that a job outlives a node's
loss and return (tests/launcher/multihost_elastic.sh pynode, where the kill comes from outside).
Rank 0 also prints "PSUM <step> <sum of |parameters|> <pid>" per commit; `elastic_in_place.py replay
WORLDS` (no hvd, one process: WORLDS = the world size of each step, comma-separated) trains the same
steps with the gradients averaged over each step's world and prints the PSUM lines the job should
have printed: a check that the averaging, the learning rate and the restore followed every move.
"""
import hashlib
import os
import signal
import sys
import time

import torch

BASE_LR = 0.05 / 3  # Horovod's convention: lr = base x hvd.size()


def make_model():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def step_loss(model, step, rank):
    """Step `step`'s (0-based) loss on `rank`'s data, which depends on nothing else."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, 8, generator=g)
    return ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()


def psum(model):
    return sum(float(p.detach().double().abs().sum()) for p in model.parameters())


def replay(worlds):
    """One process: step s averages the gradients of ranks 0..worlds[s]-1, as the job's group did."""
    torch.manual_seed(1)  # rank 0's initial weights: the job synced them from rank 0
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=BASE_LR * worlds[0], momentum=0.9)
    for step, n in enumerate(worlds):
        grads = [torch.zeros_like(p) for p in model.parameters()]
        for rank in range(n):
            model.zero_grad()
            step_loss(model, step, rank).backward()
            for g, p in zip(grads, model.parameters()):
                g += p.grad
        for g, p in zip(grads, model.parameters()):
            p.grad = g / n
        for group in opt.param_groups:
            group["lr"] = BASE_LR * n
        opt.step()
        print(f"PSUM {step + 1} {psum(model):.9g}", flush=True)


if sys.argv[1] == "replay":
    replay([int(n) for n in sys.argv[2].split(",")])
    sys.exit(0)

import guozhuang.torch as hvd  # noqa: E402 -- not needed (nor on the path) for a replay

steps, kill_at, where = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "after_update"
hvd.init()
print(f"PID {hvd.rank()} {os.getpid()}", flush=True)
if hvd.rank() == 1 and os.environ.get("GZ_REPLACEMENT", "0") == "1":
    kill_at = int(sys.argv[4]) if len(sys.argv) > 4 else 0
victim = hvd.rank() == 1 and os.environ.get("GZ_REPLACEMENT", "0") in ("0", "1") and kill_at > 0
torch.manual_seed(1 + hvd.rank())  # different initial weights per rank: the sync must fix that
pause = float(os.environ.get("GZ_TEST_STEP_SLEEP", "0"))
model = make_model()
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=BASE_LR * hvd.size(), momentum=0.9),
                               named_parameters=model.named_parameters())
state = hvd.elastic.TorchState(model, opt, step=0)


def on_reset():
    for group in opt.param_groups:
        group["lr"] = BASE_LR * hvd.size()
    print(f"RESET {hvd.rank()} {hvd.size()} {opt.param_groups[0]['lr']:.6f}", flush=True)


state.register_reset_callbacks([on_reset])


def params_hash():
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


@hvd.elastic.run
def train(state):
    while state.step < steps:
        opt.zero_grad()
        loss = step_loss(model, state.step, hvd.rank())
        if victim and state.step + 1 == kill_at and where == "in_backward":
            os.kill(os.getpid(), signal.SIGKILL)
        loss.backward()
        opt.step()
        if victim and state.step + 1 == kill_at and where == "after_update":
            os.kill(os.getpid(), signal.SIGKILL)
        hvd.allreduce(loss.detach())
        state.step += 1
        state.commit()
        print(f"RAN {hvd.rank()} {state.step}", flush=True)
        print(f"COMMIT {state.step} {hvd.rank()} {hvd.size()} {os.getpid()}", flush=True)
        if hvd.rank() == 0:
            print(f"PSUM {state.step} {psum(model):.9g} {os.getpid()}", flush=True)
        if pause:
            time.sleep(pause)


train(state)
if hvd.rank() == 0:
    print("FINAL", params_hash(), flush=True)
print(f"PARAMS {hvd.rank()} {params_hash()}", flush=True)
