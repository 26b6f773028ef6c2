#!/usr/bin/env python3
"""Plot the movements' A/B (docs/movements.md): live paired ratios lateral/tree on rate-limited
netns nodes (one point per ABBA group, the median marked), and the simulated broadcast at
N = 4096, radix 64, each movement against its own model.

Usage: python3 scripts/plot_movements.py docs/movements.csv docs/movements-sim.csv docs/movements.png
(movements.csv from `dvm-bench --compare-movements ... --csv`, movements-sim.csv from
`dvm-sim project ... --bcast-movement tree,bulk`; needs python3-matplotlib.)
"""
import csv
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def label(op, size):
    size = int(size)
    if size == 0:
        return op
    unit = f"{size // 1048576} MiB" if size >= 1048576 else f"{size // 1024} KiB" if size >= 1024 else f"{size} B"
    return f"{op} {unit}"


def main(live_src, sim_src, dst):
    fig, (ax_l, ax_s) = plt.subplots(1, 2, figsize=(14, 5.5))

    groups = {}
    for r in csv.DictReader(open(live_src)):
        groups.setdefault((r["op"], int(r["bytes"])), []).append(float(r["ratio"]))
    keys = list(groups)
    for i, k in enumerate(keys):
        ratios = groups[k]
        ax_l.scatter([i] * len(ratios), ratios, color="tab:blue", alpha=0.5, s=18)
        ax_l.scatter([i], [statistics.median(ratios)], color="tab:red", marker="_", s=600, linewidths=2)
    ax_l.axhline(1.0, color="grey", lw=1)
    ax_l.axhline(0.5, color="grey", lw=1, ls=":")
    ax_l.set_xticks(range(len(keys)))
    ax_l.set_xticklabels([label(*k) for k in keys], rotation=20)
    ax_l.set_yscale("log")
    ax_l.set_ylabel("lateral / tree (paired, per ABBA group; red: median)")
    ax_l.set_title("Live: 16 netns nodes, 1 Gbit/s tbf links, radix 64")

    series = {}
    for r in csv.DictReader(open(sim_src)):
        series.setdefault(r["movement"], []).append(r)
    colors = {"tree-broadcast": "tab:orange", "scatter-allgather": "tab:green"}
    for mv, rs in series.items():
        rs.sort(key=lambda r: int(r["bytes"]))
        b = [int(r["bytes"]) for r in rs]
        ax_s.plot(b, [float(r["sim_time_us"]) for r in rs], marker="o", color=colors.get(mv), label=f"{mv} simulated")
        ax_s.plot(b, [float(r["model_time_us"]) for r in rs], ls="--", color=colors.get(mv), label=f"{mv} model")
    ax_s.set_xscale("log", base=2)
    ax_s.set_yscale("log")
    ax_s.set_xlabel("broadcast payload (bytes)")
    ax_s.set_ylabel("time until the last daemon holds it (µs)")
    ax_s.set_title("Simulated: N = 4096, radix 64, α = 50 µs, 1 GB/s")
    ax_s.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:4])
