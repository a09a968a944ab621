#!/usr/bin/python3
"""Plot the CSVs of bench/run_multihost_train.sh and bench/run_bert_base.sh (CSV=...).

usage: /usr/bin/python3 bench/plot_multihost_train.py train OUT.png multihost_train.csv [more.csv ...]
       /usr/bin/python3 bench/plot_multihost_train.py bert-base OUT.png bert_base.csv

train: one panel per (model, link): samples/s of gz DDP, gz Horovod mode, gz DDP with every gradient
dense, PyTorch DDP, PyTorch DDP with a sparse embedding, and the pair of single processes (the
cores' ceiling), each bar labelled with its ratio to PyTorch DDP. Several CSVs (e.g. one per model,
from separate runs) are concatenated.
bert-base: samples/s per implementation, one host x 2 ranks and 2 hosts x 1 rank, with the single
process as a line and s per 1,000 samples on each bar.
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

TRAIN = [("pair", "2 single procs\n(ceiling)", "#7f7f7f"), ("gz_ddp", "gz DDP", "#1f77b4"),
         ("gz_horovod", "gz Horovod", "#4f9fd4"), ("gz_ddp_dense", "gz DDP,\nall dense", "#9ecae1"),
         ("torch_ddp", "PyTorch DDP", "#d62728"), ("torch_sparse", "PyTorch DDP,\nsparse emb.", "#f4a582")]
BERT = [("gz-dp", "gz DP"), ("gz-ddp", "gz DDP"), ("gz-horovod", "gz Horovod"), ("torch-ddp", "PyTorch DDP"),
        ("torch-sparse", "PyTorch DDP,\nsparse emb.")]


def num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def plot_train(out, paths):
    rows = []
    for p in paths:
        with open(p) as f:
            rows += list(csv.DictReader(f))
    fig, axes = plt.subplots(1, len(rows), figsize=(3.6 * len(rows), 4.2), squeeze=False)
    for ax, r in zip(axes[0], rows):
        torch_v = num(r["torch_ddp"])
        bars = [(label, num(r.get(key)), color) for key, label, color in TRAIN if num(r.get(key)) is not None]
        xs = range(len(bars))
        ax.bar(xs, [b[1] for b in bars], color=[b[2] for b in bars])
        for x, (_, v, _) in zip(xs, bars):
            if torch_v:
                ax.text(x, v, f"{v / torch_v:.2f}x", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(list(xs))
        ax.set_xticklabels([b[0] for b in bars], rotation=60, ha="right", fontsize=7)
        link = "unshaped" if r["link"] == "none" else r["link"]
        ax.set_title(f"{r['model']}, {link}", fontsize=9)
        ax.set_ylabel("samples/s (2 ranks)", fontsize=8)
    fig.suptitle("2 simulated hosts x 1 rank (labels: x PyTorch DDP)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def plot_bert(out, path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    single = next((num(r["samples_per_s"]) for r in rows if r["impl"] == "single"), None)
    fig, axes = plt.subplots(1, 2, figsize=(9, 4), sharey=True)
    for ax, where, title in zip(axes, ["1host", "2hosts"], ["1 host x 2 ranks", "2 hosts x 1 rank"]):
        bars = []
        for key, label in BERT:
            v = next((num(r["samples_per_s"]) for r in rows if r["where"] == where and r["impl"] == key), None)
            if v is not None:
                bars.append((label, v, "#d62728" if key.startswith("torch") else "#1f77b4"))
        xs = range(len(bars))
        ax.bar(xs, [b[1] for b in bars], color=[b[2] for b in bars])
        for x, (_, v, _) in zip(xs, bars):
            ax.text(x, v, f"{1000 / v:.0f} s\n/1000", ha="center", va="bottom", fontsize=7)
        if single:
            ax.axhline(2 * single, color="#7f7f7f", linestyle="--", linewidth=1)
            ax.text(len(bars) - 0.5, 2 * single, "2 x single", fontsize=7, va="bottom", ha="right", color="#555555")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([b[0] for b in bars], rotation=45, ha="right", fontsize=8)
        ax.set_title(title, fontsize=9)
    axes[0].set_ylabel("samples/s")
    fig.suptitle("bert-base (12 layers, hidden 768, seq 128): DP vs DDP vs Horovod vs PyTorch DDP", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv):
    if len(argv) < 4 or argv[1] not in ("train", "bert-base"):
        print(__doc__)
        return 2
    if argv[1] == "train":
        plot_train(argv[2], argv[3:])
    else:
        plot_bert(argv[2], argv[3])
    print(f"wrote {argv[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
