#!/usr/bin/python3
"""Plot bench/run_compression_bench.sh results: per method and link rate, the Fashion-MNIST time to
the target accuracy relative to plain DDP of the same run, bert-small samples/s relative to DDP, and
the bytes per step each method hands to collectives (log scale).

usage: /usr/bin/python3 bench/plot_compression.py OUT.png THROUGHPUT.csv ACCURACY.csv [ACCURACY.csv ...]

Each accuracy CSV is one locked run with its own DDP row; every method's time is divided by the DDP
time of its own run (ratios only within a run).
"""
import csv
import sys
from collections import OrderedDict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ORDER = ["ddp", "fp16", "bf16", "powersgd", "int8", "topk", "local_sgd", "async"]
LABELS = {"ddp": "DDP", "fp16": "fp16", "bf16": "bf16", "powersgd": "PowerSGD", "int8": "8-bit",
          "topk": "top-k", "local_sgd": "local SGD", "async": "async avg"}
RATE_COLORS = {"1gbit": "#1f77b4", "200mbit": "#d62728"}


def num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def main(argv):
    if len(argv) < 4:
        print(__doc__)
        return 2
    thr = list(csv.DictReader(open(argv[2])))
    # speedup[rate][method] = DDP train time to target / method's, within each run
    speedup, acc, bytes_ = OrderedDict(), {}, {}
    for path in argv[3:]:
        rows = list(csv.DictReader(open(path)))
        for rate in OrderedDict((r["link"], 1) for r in rows):
            ddp = next((r for r in rows if r["link"] == rate and r["method"] == "ddp"), None)
            for r in rows:
                if r["link"] != rate:
                    continue
                t, base = num(r["train_s_to_target"]), num(ddp["train_s_to_target"]) if ddp else float("nan")
                speedup.setdefault(rate, {})[r["method"]] = base / t if t == t and t > 0 else 0.0
                acc.setdefault(rate, {})[r["method"]] = num(r["final_accuracy"])
                bytes_.setdefault(rate, {})[r["method"]] = num(r["bytes_per_step"])
    rates = list(RATE_COLORS)
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    width = 0.38
    # 1: time-to-accuracy speedup over DDP
    ax = axes[0]
    for k, rate in enumerate(rates):
        ms = [m for m in ORDER if m in speedup.get(rate, {})]
        xs = [ORDER.index(m) + (k - 0.5) * width for m in ms]
        bars = ax.bar(xs, [speedup[rate][m] for m in ms], width, color=RATE_COLORS[rate], label=rate)
        for b, m in zip(bars, ms):
            a = acc[rate][m]
            ax.text(b.get_x() + b.get_width() / 2, b.get_height() + 0.03, f"{a * 100:.1f}%", ha="center",
                    va="bottom", fontsize=6, rotation=90)
    ax.axhline(1.5, color="gray", ls="--", lw=1)
    ax.text(-0.5, 1.52, "target 1.5x at 200 Mbit/s", fontsize=7, color="gray")
    ax.set_ylabel("DDP's time to 91% / method's (training time)")
    ax.set_title("Fashion-MNIST, 2 hosts x 1 rank\n(bar labels: final test accuracy)")
    # 2: bert-small samples/s relative to DDP
    ax = axes[1]
    for k, rate in enumerate(rates):
        rs = [r for r in thr if r["link"] == rate and r["method"] in ORDER]
        xs = [ORDER.index(r["method"]) + (k - 0.5) * width for r in rs]
        ax.bar(xs, [num(r["vs_ddp"]) for r in rs], width, color=RATE_COLORS[rate], label=rate)
        for x, r in zip(xs, rs):
            ax.text(x, num(r["vs_ddp"]) + 0.03, f"{num(r['samples_per_s']):.1f}/s", ha="center", va="bottom",
                    fontsize=6, rotation=90)
    ax.axhline(1.0, color="gray", lw=1)
    ax.set_ylabel("samples/s / DDP's")
    ax.set_title("bert-small throughput, 2 hosts x 1 rank")
    # 3: bytes per step
    ax = axes[2]
    for k, rate in enumerate(rates):
        rs = [r for r in thr if r["link"] == rate and r["method"] in ORDER]
        xs = [ORDER.index(r["method"]) + (k - 0.5) * width for r in rs]
        ax.bar(xs, [num(r["bytes_per_step"]) for r in rs], width, color=RATE_COLORS[rate], label=f"bert-small {rate}")
    ms = [m for m in ORDER if m in bytes_.get("200mbit", {})]
    ax.plot([ORDER.index(m) for m in ms], [bytes_["200mbit"][m] for m in ms], "ko", ms=4,
            label="Fashion-MNIST CNN (whole run)")
    ax.set_yscale("log")
    ax.set_ylabel("bytes per step per rank (counted in the hooks)")
    ax.set_title("bytes handed to collectives per step")
    for ax in axes:
        ax.set_xticks(range(len(ORDER)))
        ax.set_xticklabels([LABELS[m] for m in ORDER], fontsize=8, rotation=30)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(argv[1], dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
