#!/usr/bin/python3
"""Plot gz-bench collectives CSV files: latency and bus bandwidth per backend vs message size.

usage: /usr/bin/python3 bench/plot_collectives.py OUT.png results.csv [more.csv ...] [--memcpy GBPS]
"""
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    out, files, memcpy = argv[1], [], None
    args = argv[2:]
    while args:
        a = args.pop(0)
        if a == "--memcpy":
            memcpy = float(args.pop(0))
        else:
            files.append(a)
    rows = []
    for f in files:
        with open(f) as fh:
            rows.extend(csv.DictReader(fh))
    # gz-bench may sweep several op x dtype x reduce in one CSV (older CSVs have no reduce column):
    # one series per backend when there is one combination, else per backend and combination.
    combo = lambda row: (row["op"], row["dtype"], row.get("reduce", ""))
    several = len({combo(r) for r in rows}) > 1
    series = defaultdict(list)
    title = ""
    for row in rows:
        name = row["backend"] + (" " + " ".join(combo(row)).strip() if several else "")
        series[name].append((int(row["size_bytes"]), float(row["time_us"]), float(row["busbw_GBps"])))
        title = f'{row["ranks"]} ranks' if several else f'{row["op"]} {row["dtype"]}, {row["ranks"]} ranks'
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, pts in sorted(series.items()):
        pts.sort()
        xs = [p[0] for p in pts]
        ax1.plot(xs, [p[1] for p in pts], marker="o", label=name)
        ax2.plot(xs, [p[2] for p in pts], marker="o", label=name)
    if memcpy:
        ax2.axhline(memcpy, color="gray", linestyle="--", label=f"memcpy {memcpy:.1f} GB/s")
        ax2.axhline(0.6 * memcpy, color="gray", linestyle=":", label="0.6 x memcpy")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    ax1.set_yscale("log")
    ax1.set_ylabel("time (us, log)")
    ax2.set_ylabel("bus bandwidth (GB/s)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
