"""Shared helpers: where the build is, and running a worker script on N ranks through gzrun.

The tests run from ctest (python/CMakeLists.txt) with GZ_BUILD_DIR set; by hand:
    GZ_BUILD_DIR=build /usr/bin/python3 -m pytest python/tests -q
"""
import os
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.abspath(os.environ.get("GZ_BUILD_DIR", os.path.join(ROOT, "build")))
GZRUN = os.path.join(BUILD, "tools", "gzrun", "gzrun")
PYTHON = sys.executable
WORKERS = os.path.join(HERE, "workers")


def env(**extra):
    """The environment of a test's processes: our package first on the path, one thread each."""
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([os.path.join(BUILD, "python"), e.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    e.setdefault("OMP_NUM_THREADS", "1")
    e.update({k: str(v) for k, v in extra.items()})
    return e


class Result:
    def __init__(self, proc, seconds):
        self.returncode = proc.returncode
        self.out = proc.stdout
        self.seconds = seconds

    def __repr__(self):
        return f"exit {self.returncode} after {self.seconds:.1f} s:\n{self.out[-6000:]}"


def gzrun(script, nproc, *args, timeout=240, extra_env=None, launcher_args=()):
    """Run workers/<script> (or a path) on `nproc` ranks under gzrun; stdout+stderr merged."""
    path = script if os.path.isabs(script) else os.path.join(WORKERS, script)
    cmd = [GZRUN, "--nproc-per-node", str(nproc), *launcher_args, PYTHON, path, *map(str, args)]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env(**(extra_env or {})), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout)
    return Result(proc, time.monotonic() - t0)


@pytest.fixture(scope="session", autouse=True)
def built():
    if not os.path.exists(GZRUN):
        pytest.fail(f"{GZRUN} is missing: build first (scripts/build.sh)")
    if not os.path.isdir(os.path.join(BUILD, "python", "guozhuang")):
        pytest.fail(f"{BUILD}/python/guozhuang is missing: the Python package was not built")
