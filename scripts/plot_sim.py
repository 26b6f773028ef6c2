#!/usr/bin/env python3
"""Plot the dvm-sim projection table: simulated vs alpha-beta model time, and their ratio.

Usage: dvm-sim project > proj.csv && python3 scripts/plot_sim.py proj.csv docs/sim-projection.png
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst):
    rows = list(csv.DictReader(open(src)))
    series = {}
    for r in rows:
        key = (r["op"], int(r["bytes"]), int(r["radix"]))
        series.setdefault(key, []).append(r)
    fig, (ax_t, ax_r) = plt.subplots(1, 2, figsize=(14, 6))
    colors = {2: "tab:blue", 8: "tab:orange", 64: "tab:green"}
    markers = {("xcast", True): "o", ("xcast", False): "s", ("barrier", True): "^", ("modex", True): "D"}
    for (op, size, radix), rs in sorted(series.items()):
        rs.sort(key=lambda r: int(r["n"]))
        n = [int(r["n"]) for r in rs]
        sim = [float(r["sim_time_us"]) for r in rs]
        model = [float(r["model_time_us"]) for r in rs]
        ratio = [float(r["ratio"]) for r in rs]
        small = op != "xcast" or size <= 4096
        label = f"{op} {size}B r={radix}" if op != "barrier" else f"barrier r={radix}"
        m = markers[(op, small)]
        ax_t.plot(n, sim, marker=m, color=colors.get(radix, "k"), label=label)
        ax_t.plot(n, model, linestyle=":", color=colors.get(radix, "k"), alpha=0.6)
        ax_r.plot(n, ratio, marker=m, color=colors.get(radix, "k"), label=label)
    ax_t.set_xscale("log", base=2)
    ax_t.set_yscale("log")
    ax_t.set_xlabel("daemons N")
    ax_t.set_ylabel("virtual time (us); dotted = alpha-beta model")
    ax_t.set_title("dvm-sim: collective time vs N")
    ax_t.legend(fontsize=7, ncol=2)
    ax_r.set_xscale("log", base=2)
    ax_r.axhline(1.0, color="k", linewidth=0.8)
    ax_r.axhline(1.1, color="r", linewidth=0.8, linestyle="--")
    ax_r.set_xlabel("daemons N")
    ax_r.set_ylabel("sim / model")
    ax_r.set_title("ratio to the tree model (dashed: 1.1)")
    ax_r.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
