"""Timeouts and dead peers: every survivor raises within the deadline + 2 s, naming what failed."""
import os
import socket
import subprocess

import pytest

from conftest import PYTHON, WORKERS, env


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_pair(mode, timeout_s):
    """Two ranks started by hand (plain env://, no launcher to stop the survivor)."""
    port = free_port()
    procs = []
    for rank in range(2):
        e = env(RANK=rank, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, LOCAL_RANK=rank,
                LOCAL_WORLD_SIZE=2)
        procs.append(subprocess.Popen([PYTHON, os.path.join(WORKERS, "faults.py"), mode, str(timeout_s)], env=e,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    out0, _ = procs[0].communicate(timeout=timeout_s + 60)
    procs[1].kill()
    procs[1].communicate()
    lines = [line for line in out0.splitlines() if line.startswith(("RAISED", "NO ERROR"))]
    assert lines, out0
    return lines[-1], out0


def raised(line):
    assert line.startswith("RAISED"), line
    _, secs, msg = line.split(" ", 2)
    return float(secs), msg


@pytest.mark.parametrize("timeout_s", [3])
def test_stalled_peer_times_out(timeout_s):
    line, out = run_pair("stall", timeout_s)
    secs, msg = raised(line)
    assert timeout_s - 0.5 <= secs <= timeout_s + 2, out
    assert "rank 0/2" in msg and "1" in msg, msg  # names this rank and the peer it waited for
    assert " Timed out " in msg, msg  # as torch's own backends say it


def test_work_wait_timeout():
    line, out = run_pair("wait", 30)
    secs, msg = raised(line)
    assert 0.8 <= secs <= 3, out


@pytest.mark.parametrize("mode", ["kill", "ddp"])
def test_killed_peer_raises_within_deadline(mode):
    timeout_s = 10
    line, out = run_pair(mode, timeout_s)
    secs, msg = raised(line)
    assert secs <= timeout_s + 2, out
    assert "1" in msg, msg


def test_abort_fails_running_and_queued_futures():
    line, out = run_pair("abort", 30)
    secs, msg = raised(line)
    assert secs <= 2, out
    assert "abort" in msg, msg


def test_groups_torn_down_with_ops_finishing():
    line, out = run_pair("teardown", 60)
    assert line.startswith("RAISED 0 teardown ok"), out
