#!/usr/bin/env python3
"""The sample audit's rules on made-up logs (tests/train/check_sample_log.py): records are written
when a step begins, "done <step>" when it ends; the last session that began a step counts, and it
must have completed the step unless a later session resumed past it.

  test_check_sample_log.py CHECKER
"""
import os
import subprocess
import sys
import tempfile

CHECKER = sys.argv[1]


def audit(sessions):
    """sessions: {session: (start_step, [lines])}, world 1, global batch 2. Returns (rc, output)."""
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "samples"))
        for sid, (start, lines) in sessions.items():
            with open(os.path.join(d, "samples", f"session-{sid}-rank0.txt"), "w") as f:
                f.write(f"# session {sid} world 1 rank 0 start_step {start} epoch 0 epoch_samples {2 * start} "
                        "global_batch 2\n")
                f.write("".join(line + "\n" for line in lines))
        r = subprocess.run([sys.executable, CHECKER, d], capture_output=True, text=True)
        return r.returncode, r.stdout + r.stderr


def step(n):  # the record of step n (samples 2n-2, 2n-1)
    return f"0 {n} 2 {2 * n - 2} {2 * n - 1}"


failures = []


def expect(name, sessions, ok, says):
    rc, out = audit(sessions)
    if (rc == 0) != ok or says not in out:
        failures.append(f"{name}: rc {rc}, expected {'OK' if ok else 'FAIL'} saying {says!r}; got: {out.strip()}")


expect("plain", {1: (0, [step(1), "done 1", step(2), "done 2"])}, True, "0 step(s) run twice")
# Session 1 began step 2 and was interrupted; session 2 resumed from step 1 and redid it.
expect("interrupted", {1: (0, [step(1), "done 1", step(2)]), 2: (1, [step(2), "done 2"])}, True,
       "0 step(s) run twice (lost to faults and redone after a resume), 1 interrupted step(s) run again")
# Session 1 completed step 2 (its snapshot lagged); session 2 resumed from step 1: a redo.
expect("redone", {1: (0, [step(1), "done 1", step(2), "done 2"]), 2: (1, [step(2), "done 2"])}, True,
       "1 step(s) run twice")
# Killed after saving step 2's checkpoint, before writing "done 2": session 2 resumed past it.
expect("saved", {1: (0, [step(1), "done 1", step(2)]), 2: (2, [step(3), "done 3"])}, True, "sample log OK")
# Begun, never completed, and nobody resumed past it: the step's samples were not trained.
expect("never completed", {1: (0, [step(1), "done 1", step(2)])}, False, "step 2 was begun by session 1")
expect("malformed", {1: (0, [step(1), "done x"])}, False, "malformed line")

if failures:
    print("\n".join(failures))
    sys.exit(1)
print("check_sample_log.py: 6 cases as expected")
