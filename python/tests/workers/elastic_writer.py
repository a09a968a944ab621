"""One writer per node folder, whatever round each rank was started in. argv: none.

A survivor that gzrun moved to a new round in place keeps the GZ_RESTART_COUNT it started with,
while a fresh worker beside it (a replacement) has the new round's: rank 1 plays that fresh worker
(its GZ_RESTART_COUNT set to 5 after the state took the job's id). Every rank prints "WRITERS <n>",
the number of ranks that claimed the node folder (all ranks share one node here): it must be 1.
"""
import os

import guozhuang.torch as hvd
from guozhuang.torch.functions import allgather_object

hvd.init()
state = hvd.elastic.ObjectState(step=0)
if hvd.rank() == 1:
    os.environ["GZ_RESTART_COUNT"] = "5"


@hvd.elastic.run
def train(state):
    print(f"WRITERS {sum(allgather_object(state._files.writer))}", flush=True)
    state.step += 1
    state.commit()


train(state)
