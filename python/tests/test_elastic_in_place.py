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

STEPS, KILL_AT = 10, 5
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


@pytest.mark.parametrize("where,kill_at", [("after_update", 5), ("in_backward", 5), ("in_backward", 1)])
def test_survivors_regroup_with_the_replacement(tmp_path, uninterrupted, where, kill_at):
    r = gzrun("elastic_in_place.py", 3, STEPS, kill_at, where, extra_env={"GZ_ELASTIC_DIR": tmp_path, **ENV},
              launcher_args=("--recovery", "in-place", "--max-restarts", "1"))
    assert r.returncode == 0, r
    assert len(re.findall(r"rank 1 .*replacing it in place", r.out)) == 1, r
    assert len(pids(r.out, 0)) == len(pids(r.out, 2)) == 1, ("the survivors keep their processes", r)
    assert len(set(pids(r.out, 1))) == 2, ("rank 1 and its replacement", r)
    # Steps 1..kill_at-1 were committed (commit c holds step c + 1); step kill_at was not, anywhere.
    restored = kill_at - 2
    if restored >= 0:
        assert f"restored commit {restored} (from rank 0's memory)" in r.out, r
    for rank in range(3):  # every step committed once per rank: none redone, none skipped
        assert ran(r.out, rank) == list(range(1, STEPS + 1)), (rank, r)
    assert final(r.out) == uninterrupted, "the recovered run must end with the uninterrupted run's parameters"
    m = re.search(r"recovered in place at commit (-?\d+).* in ([0-9.]+) s", r.out)
    assert m and int(m.group(1)) == restored, r
    print(f"{where} {kill_at}: rank 0 recovered in {m.group(2)} s; job {r.seconds:.1f} s")


def test_without_init_in_place_recovery_names_what_is_missing():
    code = ("import guozhuang.torch as hvd\n"
            "hvd.elastic.run(lambda state: None)(hvd.elastic.ObjectState(step=0))\n")
    p = subprocess.run([PYTHON, "-c", code], env=env(GZ_RECOVERY="in_place"), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=120)
    assert p.returncode != 0 and "needs hvd.init() before hvd.elastic.run" in p.stdout, p.stdout
