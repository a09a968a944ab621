#!/usr/bin/python3
"""Plot bench/run_multihost_bench.sh's long CSV: all-reduce bus bandwidth per implementation vs
message size, one panel per layout (hosts x ranks per host), one figure per link rate.

usage: /usr/bin/python3 bench/plot_multihost.py OUT_PREFIX results.csv [more.csv ...]
writes OUT_PREFIX_<rate>.png (e.g. docs/results/multihost_allreduce_none.png)
"""
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {  # implementation -> (label, line style)
    "gz_auto": ("gz auto (hier shm+Gloo)", "-"),
    "gz_gloo": ("gz gloo", "-"),
    "gz_gloo_native": ("gz gloo, Gloo's own algorithms", "--"),
    "torch_gloo": ("PyTorch 1.13 ProcessGroupGloo", "-."),
    "mpi": ("OpenMPI 4.1 (tcp btl)", ":"),
    "tcp_floor": ("raw TCP floor (2 hosts)", ":"),
}
LINE_RATE_GBPS = {"1gbit": 0.125, "10gbit": 1.25}


def busbw(size, time_us, ranks):
    return size / (time_us * 1e3) * 2 * (ranks - 1) / ranks


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    prefix = argv[1]
    data = defaultdict(lambda: defaultdict(list))  # rate -> (hosts, ppn) -> rows
    for f in argv[2:]:
        with open(f) as fh:
            for row in csv.DictReader(fh):
                if int(row["size_bytes"]) <= 0:
                    continue
                data[row["rate"]][(int(row["hosts"]), int(row["ppn"]))].append(row)
    for rate, layouts in sorted(data.items()):
        keys = sorted(layouts)
        fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 4.2), squeeze=False)
        for ax, (hosts, ppn) in zip(axes[0], keys):
            n = hosts * ppn
            series = defaultdict(list)
            for row in layouts[(hosts, ppn)]:
                impl = row["impl"]
                if impl not in STYLE:
                    continue
                ranks = 2 if impl == "tcp_floor" else n
                series[impl].append((int(row["size_bytes"]), busbw(int(row["size_bytes"]), float(row["time_us"]), ranks)))
            for impl in STYLE:
                if impl in series:
                    pts = sorted(series[impl])
                    label, ls = STYLE[impl]
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], ls, marker="o", ms=3, label=label)
            if rate in LINE_RATE_GBPS:
                ax.axhline(LINE_RATE_GBPS[rate], color="gray", lw=0.8, label=f"line rate {rate}")
                ax.axhline(0.9 * LINE_RATE_GBPS[rate], color="gray", lw=0.8, ls="--", label="0.9 x line rate")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("message size (bytes)")
            ax.set_ylabel("bus bandwidth (GB/s)")
            ax.set_title(f"{hosts} hosts x {ppn} rank(s)")
            ax.grid(True, which="both", alpha=0.3)
        axes[0][0].legend(fontsize=7)
        fig.suptitle(f"f32 sum all-reduce across simulated hosts, link {'unshaped veth' if rate == 'none' else rate}"
                     " (busbw = size/time x 2(n-1)/n)")
        fig.tight_layout()
        out = f"{prefix}_{rate}.png"
        fig.savefig(out, dpi=100)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
