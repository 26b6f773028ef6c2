#!/usr/bin/env python3
"""Summary and plot of scripts/bench_staging.sh's CSV: the median time of each arm per file
size, its ratio to the limit and to the all-at-once copy, and a log-scale plot.

    python3 scripts/plot_staging.py staging.csv staging.png N RATE RADIX
"""
import csv
import statistics
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ARMS = ["dvm", "dvm-clear", "dvm-tree", "copy-seq", "copy-par"]
LABEL = {
    "dvm": "dvm staging (pbcast)",
    "dvm-clear": "dvm staging, frames in clear",
    "dvm-tree": "same bytes, whole-payload tree",
    "copy-seq": "one TCP stream per node, in turn",
    "copy-par": "one TCP stream per node, all at once",
}


def main():
    src, png, n, rate, radix = sys.argv[1:6]
    times = defaultdict(list)
    limit, rss = {}, defaultdict(list)
    for r in csv.DictReader(open(src)):
        mib = int(r["mib"])
        times[(r["arm"], mib)].append(float(r["seconds"]))
        limit[mib] = float(r["limit_s"])
        if r["rss_rise_mib"]:
            rss[(r["arm"], mib)].append(float(r["rss_rise_mib"]))
    sizes = sorted(limit)
    arms = [a for a in ARMS if any((a, s) in times for s in sizes)]
    print(f"\n| MiB | limit s | " + " | ".join(f"{a} s (×limit)" for a in arms) + " | dvm / copy-par | largest RSS rise MiB (dvm/clear) |")
    print("|---:|---:|" + "---:|" * len(arms) + "---:|---:|")
    for s in sizes:
        med = {a: statistics.median(times[(a, s)]) for a in arms if (a, s) in times}
        cells = [f"{med[a]:.3f} ({med[a] / limit[s]:.2f}×)" if a in med else "" for a in arms]
        par = f"{med['dvm'] / med['copy-par']:.3f}" if "dvm" in med and "copy-par" in med else ""
        r = "/".join(f"{max(rss[(a, s)]):.1f}" for a in ("dvm", "dvm-clear") if rss[(a, s)])
        print(f"| {s} | {limit[s]:.3f} | " + " | ".join(cells) + f" | {par} | {r} |")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    width = 0.8 / (len(arms) + 1)
    for i, a in enumerate(arms + ["limit"]):
        xs = [j + (i - len(arms) / 2) * width for j in range(len(sizes))]
        if a == "limit":
            ys = [limit[s] for s in sizes]
            ax.bar(xs, ys, width, label="limit (size ÷ link rate)", color="0.8", hatch="//")
        else:
            ys = [statistics.median(times[(a, s)]) if (a, s) in times else 0 for s in sizes]
            ax.bar(xs, ys, width, label=LABEL[a])
    ax.set_xticks(range(len(sizes)))
    ax.set_xticklabels([f"{s} MiB" for s in sizes])
    ax.set_yscale("log")
    ax.set_ylabel("seconds until every node has the file (median)")
    ax.set_title(f"A file to {n} nodes, links {rate} (tbf), radix {radix}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


if __name__ == "__main__":
    main()
