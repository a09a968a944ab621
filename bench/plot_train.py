#!/usr/bin/python3
"""Plot the CSV written by bench/run_train_bench.sh (CSV=...): 2-rank samples/s per implementation,
relative to PyTorch DDP, one panel per model, with each bar's scaling efficiency written on it.

usage: /usr/bin/python3 bench/plot_train.py OUT.png train.csv
"""
import csv
import sys
from collections import OrderedDict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LABELS = {"ddp": "gz DDP", "horovod": "gz Horovod", "ddp_stock": "gz DDP,\nLibTorch kernels",
          "torch-ddp": "PyTorch DDP", "dp": "gz DP\n(1 proc)",
          "single_pair": "2 single\nprocs, no\ncomm (ceiling)",
          "ddp_nocomm": "gz DDP, no\nall-reduce\n(diagnostic)"}
# PyTorch red, the reference rows grey, ours blue.
COLORS = {"torch-ddp": "#d62728", "single_pair": "#7f7f7f", "ddp_nocomm": "#7f7f7f"}


def main(argv):
    if len(argv) != 3:
        print(__doc__)
        return 2
    rows = OrderedDict()
    with open(argv[2]) as f:
        for r in csv.DictReader(f):
            rows.setdefault(r["model"], []).append(r)
    fig, axes = plt.subplots(1, len(rows), figsize=(7.5 * len(rows), 4.6), squeeze=False)
    for ax, (model, rs) in zip(axes[0], rows.items()):
        names = [LABELS.get(r["impl"], r["impl"]) for r in rs]
        rel = [float(r["vs_torch"]) if r["vs_torch"] != "n/a" else 0.0 for r in rs]
        colors = [COLORS.get(r["impl"], "#1f77b4") for r in rs]
        bars = ax.bar(range(len(rs)), rel, color=colors)
        for b, r in zip(bars, rs):
            ax.text(b.get_x() + b.get_width() / 2, b.get_height() + 0.02,
                    f"{float(r['two_ranks']):.0f}/s\nscal {r['scaling']}", ha="center", va="bottom", fontsize=8)
        ax.axhline(1.2, color="gray", ls="--", lw=1)
        ax.text(-0.45, 1.21, "target 1.2x", ha="left", va="bottom", fontsize=8, color="gray")
        ax.set_xticks(range(len(rs)))
        ax.set_xticklabels(names, fontsize=8)
        ax.set_ylim(0, max(rel + [1.3]) * 1.25)
        ax.set_ylabel("2-rank samples/s / PyTorch DDP")
        ax.set_title(f"{model}: 2 ranks x 1 thread")
    fig.tight_layout()
    fig.savefig(argv[1], dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
