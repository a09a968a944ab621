"""In-place recovery of the Horovod-mode default group (gzrun --recovery in-place): gzrun replaces
only a lost worker (same rank, GZ_REPLACEMENT=n) and the survivors meet it in the group's next
generation (gz::regroup(), include/gz/comm/generations.h), keeping their processes. In an elastic
job a lost or returning node moves the survivors to gzrun's next round instead (a new rank and
size; include/gz/store/round_move.h), and gz::regroup() follows the move.
hvd.elastic.run drives it (elastic.py); this module holds what touches the group.
"""
import os

from .. import _C
from .optimizer import _rebuild_cores

# Attempts (generations) without a commit in between before a survivor gives up, as the C++
# Trainer's kRecoveryAttempts: a replacement lost again while it joins is one more attempt.
ATTEMPTS = 5

HorovodInternalError = _C.HorovodInternalError
# gzrun moved this rank as it withdrew from moves (accept_moves(False)): it must fail, not end.
MovedError = _C.MovedError


def enabled():
    """Whether gzrun replaces lost workers in place (its --recovery in-place sets GZ_RECOVERY)."""
    return os.environ.get("GZ_RECOVERY", "") == "in_place"


def check():
    """Raise, naming what is missing, when the survivors could not regroup."""
    if not _C.hvd_is_initialized():
        raise RuntimeError("guozhuang elastic: in-place recovery (gzrun --recovery in-place) needs hvd.init() "
                           "before hvd.elastic.run")
    if not _C.hvd_can_regroup():
        raise RuntimeError("guozhuang elastic: in-place recovery needs a default group that can be replaced: "
                           "hvd.init() builds one when GZ_RECOVERY=in_place is set at that time (gzrun "
                           "--recovery in-place sets it); use gzrun's default --recovery restart otherwise")


def regroup(why):
    """Abort the default group and join its next generation (collective with the other survivors
    and the replacements; the group's timeout), then rebuild what averages on it. The one place
    that replaces the group. In an elastic job (gzrun --nnodes MIN:MAX) gzrun may have moved the
    job to a new round instead (a node lost or admitted): the group then has a new rank and size,
    which hvd.rank()/hvd.size() return from here on. Returns (old rank, old size)."""
    rank, size = _C.hvd_rank(), _C.hvd_size()
    new_rank, new_size = _C.hvd_regroup(why)
    if (new_rank, new_size) != (rank, size):
        print(f"guozhuang elastic: rank {rank} of {size} continues as rank {new_rank} of {new_size}", flush=True)
    _rebuild_cores()
    return rank, size


def accept_moves(on):
    """Tell gzrun whether this rank adopts a new rank and size now (an elastic job's node lost or
    admitted): gzrun moves a node's workers in place only while each of them said yes, and stops
    and restarts them otherwise. hvd.elastic.run says yes while it runs. accept_moves(False) may
    wait up to the group's timeout for gzrun's claim on this rank, and raises MovedError when
    gzrun moved the rank meanwhile."""
    return _C.hvd_accept_moves(on)
