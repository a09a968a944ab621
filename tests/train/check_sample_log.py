#!/usr/bin/env python3
"""Audit the sample logs gz-train writes with log_samples: true (work_dir/samples/).

A rank writes a step's record when the step begins and "done <step>" when it ends. For every
optimizer step, the records of the last session (launch) that began it count: earlier sessions'
records of that step were lost in a crash and redone after a resume. The check:
  - every step 1..last was run, and by every rank of its session's world;
  - within each epoch no sample index appears twice, and the epoch read exactly
    floor(N / G) x G samples (G = global batch) when --dataset-size is given (keep_global);
  - with --reference DIR (an uninterrupted run's work_dir), every step read the same samples.
Prints one summary line: sessions and their worlds, steps, samples per epoch. Exit 1 on a finding.

  check_sample_log.py WORK_DIR [--dataset-size N] [--epochs E] [--worlds 3,2,3] [--reference DIR]
"""
import argparse
import collections
import glob
import os
import sys


def load(work_dir):
    """session -> {"world": W, "global_batch": G, "steps": {step: {rank: (epoch, [indices])}},
    "done": {steps some rank of the session completed}}"""
    sessions = {}
    files = glob.glob(os.path.join(work_dir, "samples", "session-*-rank*.txt"))
    if not files:
        sys.exit(f"FAIL: no sample logs in {work_dir}/samples")
    for path in files:
        with open(path) as f:
            header = f.readline().split()
            if not header or header[0] != "#":
                sys.exit(f"FAIL: {path}: no header line")
            h = dict(zip(header[1::2], header[2::2]))
            session, rank, world = int(h["session"]), int(h["rank"]), int(h["world"])
            s = sessions.setdefault(session, {"world": world, "global_batch": int(h["global_batch"]), "steps": {},
                                             "done": set(), "start_step": int(h["start_step"])})
            if s["world"] != world:
                sys.exit(f"FAIL: {path}: world {world}, other ranks of session {session} say {s['world']}")
            for line in f:
                parts = line.split()
                if not parts:
                    continue
                if parts[0] == "done":
                    if len(parts) != 2 or not parts[1].isdigit():
                        sys.exit(f"FAIL: {path}: malformed line {line.strip()!r}")
                    s["done"].add(int(parts[1]))
                    continue
                epoch, step, n = int(parts[0]), int(parts[1]), int(parts[2])
                idx = [int(x) for x in parts[3:]]
                if len(idx) != n:
                    sys.exit(f"FAIL: {path}: step {step} says {n} samples, lists {len(idx)}")
                s["steps"].setdefault(step, {})[rank] = (epoch, idx)
    return sessions


def surviving(sessions):
    """step -> (session, epoch, [indices of all ranks])"""
    last = {}
    for session in sorted(sessions):
        for step in sessions[session]["steps"]:
            last[step] = session
    out = {}
    for step, session in sorted(last.items()):
        s = sessions[session]
        ranks = s["steps"][step]
        # Records are written when a step begins: the session that counts must have finished it
        # (a survivor's "done" stands in for a rank killed before writing its own), or a later
        # session must have resumed past it (killed after saving the step, before writing "done").
        resumed_past = any(o > session and sessions[o]["start_step"] >= step for o in sessions)
        if step not in s["done"] and not resumed_past:
            sys.exit(f"FAIL: step {step} was begun by session {session} (the last to run it) but never completed")
        if sorted(ranks) != list(range(s["world"])):
            sys.exit(f"FAIL: step {step} (session {session}, world {s['world']}): records of ranks {sorted(ranks)}")
        epochs = {e for e, _ in ranks.values()}
        if len(epochs) != 1:
            sys.exit(f"FAIL: step {step}: ranks disagree on the epoch ({sorted(epochs)})")
        samples = [i for r in sorted(ranks) for i in ranks[r][1]]
        if len(samples) != s["global_batch"]:
            sys.exit(f"FAIL: step {step}: {len(samples)} samples, global batch {s['global_batch']}")
        out[step] = (session, epochs.pop(), samples)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("work_dir")
    ap.add_argument("--dataset-size", type=int)
    ap.add_argument("--epochs", type=int)
    ap.add_argument("--worlds", help="expected worlds of the sessions that count, in order, e.g. 3,2,3")
    ap.add_argument("--reference", help="work_dir of an uninterrupted run with the same config")
    a = ap.parse_args()

    sessions = load(a.work_dir)
    steps = surviving(sessions)
    last = max(steps)
    missing = [s for s in range(1, last + 1) if s not in steps]
    if missing:
        sys.exit(f"FAIL: steps never run: {missing[:10]}")
    by_epoch = collections.defaultdict(list)
    for step, (_, epoch, samples) in steps.items():
        by_epoch[epoch].extend(samples)
    if a.epochs is not None and sorted(by_epoch) != list(range(a.epochs)):
        sys.exit(f"FAIL: epochs {sorted(by_epoch)}, expected 0..{a.epochs - 1}")
    for epoch, samples in sorted(by_epoch.items()):
        dup = [i for i, c in collections.Counter(samples).items() if c > 1]
        if dup:
            sys.exit(f"FAIL: epoch {epoch}: {len(dup)} sample(s) read twice, e.g. {dup[:5]}")
        if a.dataset_size is not None:
            g = {sessions[steps[s][0]]["global_batch"] for s in steps if steps[s][1] == epoch}
            if len(g) == 1:
                want = a.dataset_size // next(iter(g)) * next(iter(g))
                if len(samples) != want:
                    sys.exit(f"FAIL: epoch {epoch}: read {len(samples)} distinct samples, expected {want}")
            if any(i < 0 or i >= a.dataset_size for i in samples):
                sys.exit(f"FAIL: epoch {epoch}: sample index out of range")
    counted = sorted({s for s, _, _ in steps.values()})
    worlds = [sessions[s]["world"] for s in counted]
    if a.worlds and worlds != [int(w) for w in a.worlds.split(",")]:
        sys.exit(f"FAIL: sessions that count ran on worlds {worlds}, expected {a.worlds}")
    if a.reference:
        ref = surviving(load(a.reference))
        if sorted(ref) != sorted(steps):
            sys.exit(f"FAIL: reference ran steps 1..{max(ref)}, this run 1..{last}")
        for step in steps:
            if sorted(steps[step][2]) != sorted(ref[step][2]):
                sys.exit(f"FAIL: step {step} read other samples than the reference run")
    per_session = collections.Counter(s for s, _, _ in steps.values())
    # Work lost to faults: steps some session completed that a later session ran again; and steps
    # a fault interrupted (begun, never completed there), run again as well.
    later = [(sid, step) for sid, sess in sessions.items() for step in sess["steps"] if steps[step][0] != sid]
    redone = sum(1 for sid, step in later if step in sessions[sid]["done"])
    interrupted = len(later) - redone
    counted_text = ", ".join("%d: %d" % (sessions[s]["world"], per_session[s]) for s in counted)
    sizes = sorted({len(v) for v in by_epoch.values()})
    print(f"sample log OK: {last} steps, {len(by_epoch)} epoch(s) of {sizes} distinct samples, no sample twice "
          f"in an epoch; sessions counted (world: steps): {counted_text}; "
          f"{redone} step(s) run twice (lost to faults and redone after a resume), "
          f"{interrupted} interrupted step(s) run again, "
          f"{len(sessions) - len(counted)} session(s) fully redone")


if __name__ == "__main__":
    main()
