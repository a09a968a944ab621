#!/usr/bin/python3
"""PyTorch's own backend test-suite (DistributedTest._DistTestBase, shipped in python3-torch) against a
backend: gz (this package, as a plugin backend) or gloo (the reference).

    PYTHONPATH=build/python /usr/bin/python3 python/tests/torch_dist_suite.py --backend gz --world-size 2 \
        --out results.jsonl [-k PATTERN ...]

Every test starts --world-size fresh processes (forked from this one: torch and guozhuang are imported
once) that meet through a FileStore (file:// init, as the suite does). One JSON line per test goes to
--out: {"test", "outcome": pass|skip|fail|error, "reason", "seconds"}. A summary is printed at the end.
The "gz" backend is declared a plugin and, like gloo, a DDP- and subgroup-capable backend, so the
DDP and new_group tests run for it as they do for gloo (tests the suite reserves for gloo by name,
e.g. its timeout tests, still skip).

--as-gloo (with --backend gz): the suite is told it runs "gloo" (so its gloo-only tests run too) while
every process group it asks for, "gloo" included, is a "gz" one. Tests that check for gloo itself
(isinstance ProcessGroupGloo, get_backend() == "gloo") then fail by construction; the report says so.

The suite's process entry enables DDP's experimental ReplicatedTensor mode, whose module does not
import with Debian's torch 1.13 under Python 3.11 (a dataclass with a mutable default): nine DDP
tests then fail on every backend before any communication. The runner leaves that mode off
(--replicated-tensor keeps it), so those tests exercise the ordinary DDP path.
"""
import argparse
import json
import os
import sys
import tempfile
import time
import unittest


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="gz", choices=["gz", "gloo"])
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--out", required=True, help="JSON lines, one per test")
    p.add_argument("-k", action="append", default=[], help="run only tests whose name contains this (repeatable)")
    p.add_argument("--timeout", type=int, default=180, help="seconds per test before the suite kills it")
    p.add_argument("--as-gloo", action="store_true", help="tell the suite it runs gloo; every group is gz")
    p.add_argument("--replicated-tensor", action="store_true", help="keep the suite's ReplicatedTensor mode")
    return p.parse_args()


args = parse()
# distributed_test reads these at import time.
temp_dir = tempfile.mkdtemp(prefix=f"gz-torchsuite-{args.backend}-{args.world_size}-")
os.environ.update(BACKEND="gloo" if args.as_gloo else args.backend, WORLD_SIZE=str(args.world_size), TEMP_DIR=temp_dir,
                  DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=str(args.timeout))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.makedirs(os.path.join(temp_dir, "barrier"), exist_ok=True)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "shims"))  # expecttest
import torch  # noqa: E402
import torch.multiprocessing  # noqa: E402
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

if args.backend == "gz":
    import guozhuang  # noqa: E402,F401  (registers "gz")
    for feature in ("plugin", "ddp", "subgroup"):
        DistTestCases.backend_feature[feature].add("gz")
    if args.as_gloo:
        import torch.distributed as dist  # noqa: E402

        def to_gz(fn):
            def wrapper(*a, **kw):
                if "backend" in kw and kw["backend"] is not None and str(kw["backend"]).lower() == "gloo":
                    kw["backend"] = "gz"
                elif fn.__name__ == "init_process_group" and a and str(a[0]).lower() == "gloo":
                    a = ("gz",) + tuple(a[1:])
                return fn(*a, **kw)
            wrapper.__name__ = fn.__name__
            return wrapper

        dist.init_process_group = to_gz(dist.init_process_group)
        dist.new_group = to_gz(dist.new_group)
if not args.replicated_tensor:
    try:  # torch 1.13 only: 2.x removed the mode (and this module)
        import torch.nn.parallel._replicated_tensor_ddp_utils as _rt  # noqa: E402
    except ImportError:
        _rt = None
    if _rt is not None:
        _set_rt = _rt._set_ddp_with_replicated_tensor
        _rt._set_ddp_with_replicated_tensor = lambda value: _set_rt(False)

from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402


class TestSuite(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        # fork, not spawn: the ranks start in milliseconds instead of re-importing torch.
        self._start_processes(torch.multiprocessing.get_context("fork").Process)


class Recorder(unittest.TextTestResult):
    def __init__(self, stream, descriptions, verbosity, out):
        super().__init__(stream, descriptions, verbosity)
        self.out = out
        self.t0 = {}

    def startTest(self, test):
        self.t0[test.id()] = time.time()
        super().startTest(test)

    def record(self, test, outcome, reason=""):
        name = test.id().split(".")[-1]
        reason = reason.strip()
        if len(reason) > 4000:  # the message and the end of the traceback; C++ frames in between
            reason = reason[:2000] + "\n...\n" + reason[-2000:]
        line = {"test": name, "outcome": outcome, "reason": reason,
                "seconds": round(time.time() - self.t0.get(test.id(), time.time()), 2)}
        self.out.write(json.dumps(line) + "\n")
        self.out.flush()

    def addSuccess(self, test):
        super().addSuccess(test)
        self.record(test, "pass")

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self.record(test, "skip", reason)

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self.record(test, "fail", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self.record(test, "error", self._exc_info_to_string(err, test))

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self.record(test, "pass", "expected failure")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self.record(test, "fail", "unexpected success")


def main():
    loader = unittest.TestLoader()
    suite = loader.loadTestsFromTestCase(TestSuite)
    tests = [t for t in suite if not args.k or any(k in t.id() for k in args.k)]
    with open(args.out, "a") as out:
        runner = unittest.TextTestRunner(verbosity=2, resultclass=lambda s, d, v: Recorder(s, d, v, out))
        res = runner.run(unittest.TestSuite(tests))
    print(f"torch_dist_suite: backend={args.backend} world_size={args.world_size} tests={res.testsRun} "
          f"failures={len(res.failures)} errors={len(res.errors)} skipped={len(res.skipped)}")


if __name__ == "__main__":
    main()
