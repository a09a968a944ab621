"""guozhuang.torch.elastic under gzrun --recovery in-place: the survivors keep their processes.

Mutations run by hand (each fails these tests): in elastic.run's wrapper, re-raising the lost-peer
error instead of recovering (`if not _in_place.enabled(): raise` -> `raise`): the survivors exit,
gzrun's budget of one replacement is spent and the job fails; dropping `_rebuild_cores()` from
_in_place.regroup: the optimizer keeps averaging on the aborted group and recovery gives up after
5 attempts; dropping the root's `self.restore()` (memory) in _restore_as_root: "after_update" ends
with other parameters than the uninterrupted run.
"""
import re
import subprocess

import pytest

from conftest import PYTHON, env, gzrun

STEPS = 10
ENV = {"GZ_TIMEOUT_S": 30}  # a hang fails in seconds, not in the default 300 s


def ran(out, rank):
    """Steps that `rank` committed, in order (gzrun prefixes each line with "[rank] ")."""
    return [int(s) for s in re.findall(rf"^(?:\[{rank}\] )?RAN {rank} (\d+)$", out, re.M)]


def pids(out, rank):
    return [int(p) for p in re.findall(rf"^(?:\[{rank}\] )?PID {rank} (\d+)$", out, re.M)]


def final(out):
    m = re.search(r"FINAL ([0-9a-f]+)", out)
    assert m, out[-3000:]
    return m.group(1)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    r = gzrun("elastic_in_place.py", 3, STEPS, 0, extra_env={"GZ_ELASTIC_DIR": tmp_path_factory.mktemp("ref"), **ENV})
    assert r.returncode == 0, r
    return final(r.out)


# The last case kills rank 1 before the first commit, then its replacement too: two recoveries.
@pytest.mark.parametrize("where,kill_at,again", [("after_update", 5, 0), ("in_backward", 5, 0), ("in_backward", 1, 7)])
def test_survivors_regroup_with_the_replacement(tmp_path, uninterrupted, where, kill_at, again):
    r = gzrun("elastic_in_place.py", 3, STEPS, kill_at, where, again, extra_env={"GZ_ELASTIC_DIR": tmp_path, **ENV},
              launcher_args=("--recovery", "in-place", "--max-restarts", "2"))
    assert r.returncode == 0, r
    kills = [k for k in (kill_at, again) if k]
    assert len(re.findall(r"rank 1 .*replacing it in place", r.out)) == len(kills), r
    assert len(pids(r.out, 0)) == len(pids(r.out, 2)) == 1, ("the survivors keep their processes", r)
    assert len(set(pids(r.out, 1))) == 1 + len(kills), ("rank 1 and its replacements", r)
    # Steps 1..k-1 were committed (commit c holds step c + 1); step k was not, anywhere.
    restored = [k - 2 for k in kills]
    for c in restored:
        if c >= 0:
            assert f"restored commit {c} (from rank 0's memory)" in r.out, r
    for rank in range(3):  # every step committed once per rank: none redone, none skipped
        assert ran(r.out, rank) == list(range(1, STEPS + 1)), (rank, r)
    assert final(r.out) == uninterrupted, "the recovered run must end with the uninterrupted run's parameters"
    found = re.findall(r"recovered in place at commit (-?\d+).* in ([0-9.]+) s \(regrouped in ([0-9.]+) s\)", r.out)
    assert [int(c) for c, _, _ in found] == restored, r
    print(f"{where} {kills}: rank 0 recovered in {', '.join(f'{t} s (regrouped in {g} s)' for _, t, g in found)}; "
          f"job {r.seconds:.1f} s")


def test_without_init_in_place_recovery_names_what_is_missing():
    code = ("import guozhuang.torch as hvd\n"
            "hvd.elastic.run(lambda state: None)(hvd.elastic.ObjectState(step=0))\n")
    p = subprocess.run([PYTHON, "-c", code], env=env(GZ_RECOVERY="in_place"), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=120)
    assert p.returncode != 0 and "needs hvd.init() before hvd.elastic.run" in p.stdout, p.stdout


def test_a_rank_moved_as_it_withdraws_fails_and_other_withdrawal_failures_warn():
    # Mutation checks (by hand): matching the message text again, or catching MovedError with the
    # other RuntimeErrors, lets the moved rank end as if the job had ended (exit 0).
    code = ("import guozhuang.torch as hvd\n"
            "from guozhuang import _C\n"
            "from guozhuang.torch import _in_place, elastic\n"
            "assert issubclass(_C.MovedError, RuntimeError) and _in_place.MovedError is _C.MovedError\n"
            "assert not issubclass(_C.MovedError, _C.HorovodInternalError)\n"
            "def closed(on):\n"
            "    raise RuntimeError('gz::TcpStore: the server closed the connection')\n"
            "_in_place.accept_moves = closed\n"
            "elastic._withdraw_from_moves()\n"
            "def moved(on):\n"
            "    raise _C.MovedError('rank 0 of run r-0: gzrun moved this worker')\n"
            "_in_place.accept_moves = moved\n"
            "elastic._withdraw_from_moves()\n")
    p = subprocess.run([PYTHON, "-c", code], env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=120)
    assert p.returncode != 0, p.stdout
    assert "cannot withdraw from gzrun's moves: gz::TcpStore" in p.stdout, p.stdout
    assert "MovedError: rank 0 of run r-0: gzrun moved this worker" in p.stdout, p.stdout
