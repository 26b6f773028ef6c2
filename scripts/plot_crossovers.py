#!/usr/bin/env python3
"""Plot the fence crossovers (docs/movements-auto-sim.md): the smallest modex contribution per
daemon at which `auto` moves a fence of every daemon on the allgather, against N, log-log, one
line per radix. A crossover of 0 (even a barrier goes lateral) is drawn on the bottom row.

Usage: python3 scripts/plot_crossovers.py docs/movements-crossovers.csv docs/movements-crossovers.png
(the CSV from `dvm-sim crossovers`; needs python3-matplotlib.)
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ZERO = 0.5  # where a crossover of 0 bytes is drawn on the log axis


def main(src, dst):
    lines = {}
    for r in csv.DictReader(open(src)):
        if r["crossover_bytes_per_daemon"] == "":
            continue
        lines.setdefault(int(r["radix"]), []).append((int(r["n"]), int(r["crossover_bytes_per_daemon"])))
    fig, ax = plt.subplots(figsize=(9, 5.5))
    markers = "osD^v<>"
    for i, (radix, pts) in enumerate(sorted(lines.items())):
        pts.sort()
        xs = [n for n, _ in pts]
        ys = [b if b > 0 else ZERO for _, b in pts]
        ax.plot(xs, ys, marker=markers[i % len(markers)], ms=4, lw=1.2, label=f"radix {radix}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.axhline(ZERO, color="grey", lw=0.8, ls=":")
    ticks = [t for t in (1, 10, 100, 1000, 10000) if t <= 2 * max(b for p in lines.values() for _, b in p)]
    ax.set_yticks([ZERO] + ticks)
    ax.set_yticklabels(["0 (lateral\nbarrier)"] + [str(t) for t in ticks])
    ax.set_ylim(ZERO / 1.6, None)
    ax.set_xlabel("daemons N")
    ax.set_ylabel("crossover: modex bytes per daemon")
    ax.set_title("auto: smallest modex per daemon moved on the allgather (model, α = 50 µs, 1 GB/s)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
