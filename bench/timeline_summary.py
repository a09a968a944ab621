#!/usr/bin/python3
"""Summarise GZ_TIMELINE traces of `gz-bench train` (DDP or Horovod mode): where a step's time goes.

    GZ_TIMELINE=/tmp/tl gzrun ... gz-bench train --model bert-small --mode ddp ...
    /usr/bin/python3 bench/timeline_summary.py /tmp/tl [--skip 2] [--plot out.png] [--rate-mbit 1000]

Reads PREFIX.rank*.json (Chrome trace files, one per rank). Per rank and step (a step starts at its
"forward" span), in milliseconds, medians over the steps after --skip:
  fwd, bwd, opt   the training thread's forward, backward (ends when DDP's buckets are reduced)
                  and optimizer spans
  wait            DDP: time backward spent at its end waiting for buckets ("wait for buckets")
  comm            sum of the communication spans (bucket all-reduces / fused groups) in the step
  comm_first      from backward's start to the first communication span's start
  tail            from the last gradient-ready event to the end of the last communication span
  idle            wire idle from the first communication span's start to the last one's end
  queued          summed queueing of buckets on the progress thread (submitted -> started)
  cpu             progress thread CPU time inside communication spans (vs comm: waiting or starved)
  MB              gradient bytes reduced per step (dense size of every bucket)
  wireMB          what went on the wire instead: dense buckets as MB, row-sparse ones as all ranks'
                  rows (index + row); MB/s = wireMB / comm
With --rate-mbit, also wire/step: the fraction of the step the wire needs at that rate for wireMB.
--plot draws one step (the median-length one) of every rank: compute above, communication below.
"""
import argparse
import glob
import json
import re
import statistics
import sys


def load(prefix):
    ranks = {}
    for path in sorted(glob.glob(prefix + ".rank*.json")):
        m = re.search(r"\.rank(\d+)\.json$", path)
        with open(path) as f:
            ranks[int(m.group(1))] = json.load(f)["traceEvents"]
    if not ranks:
        sys.exit(f"no {prefix}.rank*.json")
    return ranks


def steps_of(events):
    """Split events into steps at each 'forward' span; returns [(t0, t_end, [events])] in us."""
    fw = sorted(e["ts"] for e in events if e.get("cat") == "step" and e["name"] == "forward")
    out = []
    for i, t0 in enumerate(fw):
        t1 = fw[i + 1] if i + 1 < len(fw) else float("inf")
        evs = [e for e in events if t0 <= e["ts"] < t1]
        # A bucket of this step may end after the next forward began (never with DDP: backward waits).
        out.append((t0, t1, evs))
    return out


def summarize(evs, t0):
    def spans(cat, name=None):
        return [e for e in evs if e.get("cat") == cat and e.get("ph") == "X" and (name is None or e["name"] == name)]

    def dur(cat, name):
        s = spans(cat, name)
        return sum(e["dur"] for e in s) / 1e3 if s else 0.0

    r = {"fwd": dur("step", "forward"), "bwd": dur("step", "backward")}
    r["opt"] = dur("step", "optimizer") + dur("step", "synchronize+optimizer")
    r["wait"] = dur("ddp", "wait for buckets")
    comm = sorted(spans("comm"), key=lambda e: e["ts"])
    data = [e for e in comm if "bytes" in e.get("args", {})]
    r["comm"] = sum(e["dur"] for e in comm) / 1e3
    bwd = spans("step", "backward")
    b0 = bwd[0]["ts"] if bwd else t0
    b1 = b0 + (bwd[0]["dur"] if bwd else 0)
    ready = [e["ts"] for e in evs if e.get("cat") == "ddp" and e["name"].startswith("ready ")]
    if comm:
        r["comm_first"] = (comm[0]["ts"] - b0) / 1e3
        end = max(e["ts"] + e["dur"] for e in comm)
        r["tail"] = (end - (max(ready) if ready else b1)) / 1e3
        busy, cur_s, cur_e = 0.0, None, None
        for e in comm:  # union of the spans
            s, t = e["ts"], e["ts"] + e["dur"]
            if cur_e is None or s > cur_e:
                if cur_e is not None:
                    busy += cur_e - cur_s
                cur_s, cur_e = s, t
            else:
                cur_e = max(cur_e, t)
        busy += cur_e - cur_s
        r["idle"] = (end - comm[0]["ts"] - busy) / 1e3
    else:
        r["comm_first"] = r["tail"] = r["idle"] = 0.0
    r["queued"] = sum(e["args"].get("queued_us", 0) for e in data) / 1e3
    r["cpu"] = sum(e.get("args", {}).get("cpu_us", 0) for e in comm) / 1e3
    r["MB"] = sum(e["args"]["bytes"] for e in data) / 1e6
    r["wireMB"] = sum(e["args"].get("wire_bytes", e["args"]["bytes"]) for e in data) / 1e6
    r["MB/s"] = r["wireMB"] / (r["comm"] / 1e3) if r["comm"] > 0 else 0.0
    r["step"] = None
    return r


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prefix")
    p.add_argument("--skip", type=int, default=2, help="steps to leave out at the start (warm-up, bucket rebuild)")
    p.add_argument("--plot", help="PNG of one step per rank")
    p.add_argument("--rate-mbit", type=float, default=0, help="link rate for the wire-time column")
    args = p.parse_args()
    ranks = load(args.prefix)
    cols = ["step", "fwd", "bwd", "opt", "wait", "comm", "comm_first", "tail", "idle", "queued", "cpu", "MB", "wireMB", "MB/s"]
    if args.rate_mbit:
        cols.append("wire/step")
    print(f"{args.prefix}: {len(ranks)} rank(s); medians over steps after the first {args.skip}; ms unless noted")
    print("rank " + " ".join(f"{c:>10}" for c in cols))
    chosen = {}
    for rank, events in sorted(ranks.items()):
        steps = steps_of(events)[args.skip:]
        # The last step's span ends at the next forward, which does not exist: drop it if incomplete.
        rows = []
        for i, (t0, t1, evs) in enumerate(steps):
            r = summarize(evs, t0)
            if t1 != float("inf"):
                r["step"] = (t1 - t0) / 1e3
            else:
                r["step"] = r["fwd"] + r["bwd"] + r["opt"]
            if args.rate_mbit:
                r["wire/step"] = r["wireMB"] * 8 / args.rate_mbit / (r["step"] / 1e3) if r["step"] else 0
            rows.append((r, t0, t1, evs))
        if not rows:
            continue
        med = {c: statistics.median(r[c] for r, *_ in rows) for c in cols}
        print(f"{rank:>4} " + " ".join(f"{med[c]:>10.2f}" for c in cols))
        rows.sort(key=lambda x: x[0]["step"])
        chosen[rank] = rows[len(rows) // 2]
    if args.plot:
        plot(chosen, args.plot)


def plot(chosen, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"forward": "#4c72b0", "backward": "#55a868", "optimizer": "#c44e52", "synchronize+optimizer": "#c44e52",
              "wait for buckets": "#dd8452"}
    fig, ax = plt.subplots(figsize=(11, 1.2 + 1.1 * len(chosen)))
    yt, yl = [], []
    y = 0
    for rank, (r, t0, t1, evs) in sorted(chosen.items()):
        for e in evs:
            if e.get("ph") != "X":
                continue
            s = (e["ts"] - t0) / 1e3
            d = e["dur"] / 1e3
            if e["cat"] == "step" or e["cat"] == "ddp":
                row = y + (0.55 if e["cat"] == "ddp" else 0.6)
                ax.broken_barh([(s, d)], (row, 0.35 if e["cat"] == "step" else 0.3),
                               facecolors=colors.get(e["name"], "#8172b2"))
            elif e["cat"] == "comm":
                ax.broken_barh([(s, d)], (y + 0.1, 0.35), facecolors="#937860", edgecolor="k", linewidth=0.4)
        for e in evs:
            if e.get("cat") == "ddp" and e.get("ph") == "i":
                ax.plot([(e["ts"] - t0) / 1e3] * 2, [y + 0.47, y + 0.53], color="k", linewidth=0.5)
        yt += [y + 0.27, y + 0.77]
        yl += [f"rank {rank} comm", f"rank {rank} train"]
        y += 1.2
    ax.set_yticks(yt)
    ax.set_yticklabels(yl)
    ax.set_xlabel("ms from the step's start")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in ["#4c72b0", "#55a868", "#c44e52", "#dd8452", "#937860"]]
    ax.legend(handles, ["forward", "backward", "optimizer", "DDP waits for buckets", "all-reduce (progress thread)"],
              loc="upper left", fontsize=8, ncol=5, bbox_to_anchor=(0, 1.25))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
