#!/usr/bin/env python3
"""Plots and tables for contrib/dockerswarm/scaletest.sh results.

Reads DIR/NAME.csv (scaletest rows), DIR/NAME-mpi.csv and DIR/NAME-boot.csv; writes
DIR/NAME-modex.png (collect - barrier vs total modex bytes), DIR/NAME-barrier.png (barrier vs
N with PRRTE's published 165 + 40(N-1) us line) and DIR/NAME-tables.md. Iteration 1 is kept
apart: steady state is the median over the other rows (iterations 2..I, or jobs 2..R).
"""
import argparse
import csv
import os
import statistics
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--name", default="sweep")
    a = ap.parse_args()
    base = os.path.join(a.dir, a.name)
    rows = read(base + ".csv")
    mpi = read(base + "-mpi.csv")
    boot = read(base + "-boot.csv")
    bench = read(base + "-bench.csv")

    # config -> iteration rows
    cfg = defaultdict(list)
    for r in rows:
        key = (int(r["nodes"]), int(r["ppn"]), int(r["ranks"]), r["radix"], r["movement"], r["mode"],
               int(r["size"]), int(r["nkeys"]))
        row = {k: float(r[k]) for k in ("iteration", "collect_us", "barrier_us", "get_us")}
        row["job"] = int(r.get("job") or 1)
        cfg[key].append(row)

    summary = []
    for key in sorted(cfg, key=lambda k: (k[5], k[0], k[1], k[3], k[4], k[6])):
        # The first row (job 1, iteration 1) is cold; the rest is the steady state.
        its = sorted(cfg[key], key=lambda x: (x["job"], x["iteration"]))
        first = its[0]
        steady = its[1:] or its
        s = {m: med([x[m] for x in steady]) for m in ("collect_us", "barrier_us", "get_us")}
        s["diff"] = med([x["collect_us"] - x["barrier_us"] for x in steady])
        s["ratio"] = med([x["collect_us"] / x["barrier_us"] for x in steady if x["barrier_us"] > 0])
        s["last_collect"] = its[-1]["collect_us"]
        s["last_it"] = int(its[-1]["iteration"])
        summary.append((key, first, s, len(steady)))

    # Plot 1: collect - barrier (left) and the collecting fence itself (right) vs the bytes the
    # fence carried. libpmix 4.2's server sends every key a proc ever committed at each
    # collecting fence (fresh key names do not help), so iteration k of a job carries
    # ranks x keys x size x k bytes. The first row is cold: left out. On an oversubscribed host
    # the barrier right after a collecting fence also absorbs the ranks' skew, so the difference
    # can be negative: the right panel does not depend on it.
    import math
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    series = {"diff": defaultdict(lambda: defaultdict(list)), "collect": defaultdict(lambda: defaultdict(list))}
    for key, its in cfg.items():
        nodes, ppn, ranks, radix, mv, mode, size, nkeys = key
        if mode != "all":
            continue
        for x in sorted(its, key=lambda x: (x["job"], x["iteration"]))[1:]:
            carried = ranks * nkeys * size * int(x["iteration"])
            series["diff"][(nodes, ppn, radix, mv)][carried].append(x["collect_us"] - x["barrier_us"])
            series["collect"][(nodes, ppn, radix, mv)][carried].append(x["collect_us"])
    groups = sorted({(k[0], k[1]) for k in series["collect"]})
    for ax, which, ylabel in ((axes[0], "diff", "collect - barrier, median us"),
                              (axes[1], "collect", "collecting fence, median us")):
        for (nodes, ppn, radix, mv), by_b in sorted(series[which].items()):
            # Medians over bins a factor 4 wide; non-positive medians are left out.
            bins = defaultdict(list)
            for b, ds in by_b.items():
                bins[int(math.log(b, 4))].extend(ds)
            pts = [(4 ** (k + 0.5), med(ds)) for k, ds in sorted(bins.items())]
            pts = [(x, y) for x, y in pts if y > 0]
            if not pts:
                continue
            color = plt.cm.viridis(groups.index((nodes, ppn)) / max(len(groups) - 1, 1))
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "-" if radix == "64" else "--", marker="o",
                    markersize=3, color=color, label=f"{nodes} nodes x {ppn} ppn, radix {radix}, {mv}")
        if ax.lines:
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.legend(fontsize=7)
        ax.set_xlabel("bytes carried: ranks x keys x size x iteration")
        ax.set_ylabel(ylabel + " (bins x4, first row left out)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_title("cost of the data: collect - barrier")
    axes[1].set_title("collecting PMIx_Fence")
    fig.tight_layout()
    fig.savefig(base + "-modex.png", dpi=110)
    plt.close(fig)

    # Plot 2: barrier vs N per radix/ppn (median over sizes and iterations 2..), with PRRTE's line.
    fig, ax = plt.subplots(figsize=(7, 4.5))
    bar = defaultdict(lambda: defaultdict(list))
    for key, its in cfg.items():
        nodes, ppn, ranks, radix, mv, mode, size, nkeys = key
        steady = sorted(its, key=lambda x: (x["job"], x["iteration"]))[1:] or its
        bar[(radix, ppn)][nodes].extend(x["barrier_us"] for x in steady)
    ns = sorted({k[0] for k in cfg})
    for (radix, ppn), by_n in sorted(bar.items()):
        xs = sorted(by_n)
        ax.plot(xs, [med(by_n[x]) for x in xs], marker="o", label=f"dvm radix {radix}, {ppn} ppn")
    dvmb = defaultdict(dict)
    for r in bench:
        if r["op"] == "barrier":
            dvmb[int(r["radix"])][int(r["nodes"])] = float(r["p50_us"])
    for radix, by_n in sorted(dvmb.items()):
        xs = sorted(by_n)
        ax.plot(xs, [by_n[x] for x in xs], ":", marker="s", label=f"dvm-bench daemon barrier, radix {radix}")
    if ns:
        ax.plot(ns, [165 + 40 * (x - 1) for x in ns], "k--", marker="x",
                label="PRRTE published 165 + 40(N-1) us (radix 64)")
    if any(y > 0 for line in ax.lines for y in line.get_ydata()):
        ax.set_yscale("log")
    ax.set_xlabel("N (node containers; the HNP adds one daemon)")
    ax.set_ylabel("barrier fence, median us")
    ax.set_title("PMIx barrier (no data) vs DVM size, 2-core host")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(base + "-barrier.png", dpi=110)
    plt.close(fig)

    out = []
    out.append(f"### scaletest ({a.name}.csv): the first row (job 1, iteration 1) vs median of the others, max over ranks, us\n")
    out.append("Iteration k carries k x size bytes per rank (libpmix re-sends every committed key), so for "
               "large sizes the 2..I medians mix 2..I x size; the last column is the last iteration's collect.\n")
    out.append("| nodes | ppn | ranks | radix | mode | size B | it1 collect | it1 barrier | it1 get "
               "| collect | barrier | get | collect-barrier | collect/barrier | n | last-it collect |")
    out.append("|" + "---|" * 16)
    for key, first, s, n in summary:
        nodes, ppn, ranks, radix, mv, mode, size, nkeys = key
        out.append(f"| {nodes} | {ppn} | {ranks} | {radix} | {mode} | {size} | {first['collect_us']:.0f} | "
                   f"{first['barrier_us']:.0f} | {first['get_us']:.0f} | {s['collect_us']:.0f} | "
                   f"{s['barrier_us']:.0f} | {s['get_us']:.0f} | {s['diff']:.0f} | {s['ratio']:.2f} | {n} | "
                   f"{s['last_collect']:.0f} (it {s['last_it']}) |")
    if mpi:
        out.append("\n### MPI jobs under prun: median wall time of the whole `prun` (ms), rank 0's MPI_Init (us)\n")
        out.append("| nodes | ppn | ranks | radix | mpinoop ms | MPI_Init us | allreduce ms | ring ms | reps |")
        out.append("|---|---|---|---|---|---|---|---|---|")
        m = defaultdict(lambda: defaultdict(list))
        for r in mpi:
            k = (int(r["nodes"]), int(r["ppn"]), int(r["ranks"]), r["radix"])
            m[k][r["program"]].append(float(r["wall_ms"]))
            if r["init_us"]:
                m[k]["init"].append(float(r["init_us"]))
        for k in sorted(m):
            d = m[k]
            out.append(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {med(d['mpinoop']):.0f} | {med(d['init']):.0f} | "
                       f"{med(d['allreduce']):.0f} | {med(d['ring']):.0f} | {len(d['mpinoop'])} |")
    if boot:
        out.append("\n### DVM boot from the head (`dvmd --host node1..nodeN`, ssh agent) until the URI is written, ms\n")
        out.append("| nodes | daemons | radix | boot ms |")
        out.append("|---|---|---|---|")
        for r in boot:
            out.append(f"| {r['nodes']} | {r['daemons']} | {r['radix']} | {r['boot_ms']} |")
    if bench:
        out.append("\n### dvm-bench on the same DVMs: the daemons' own fences (no PMIx, no ranks), p50 us\n")
        out.append("| nodes | daemons | radix | barrier | modex 64 B/daemon | modex 8 KiB/daemon | modex 64 / barrier |")
        out.append("|---|---|---|---|---|---|---|")
        b = defaultdict(dict)
        for r in bench:
            b[(int(r["nodes"]), int(r["daemons"]), int(r["radix"]))][(r["op"], int(r["bytes"]))] = float(r["p50_us"])
        for k in sorted(b):
            d = b[k]
            bar_, m64, m8k = d.get(("barrier", 0)), d.get(("modex", 64)), d.get(("modex", 8192))
            ratio = f"{m64 / bar_:.2f}" if bar_ and m64 else "-"
            out.append(f"| {k[0]} | {k[1]} | {k[2]} | {bar_:.0f} | {m64:.0f} | {m8k:.0f} | {ratio} |")
    with open(base + "-tables.md", "w") as f:
        f.write("\n".join(out) + "\n")
    print(f"wrote {base}-modex.png, {base}-barrier.png, {base}-tables.md")


if __name__ == "__main__":
    main()
