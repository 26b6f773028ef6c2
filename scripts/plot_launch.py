#!/usr/bin/python3
"""Tables and plot of docs/launch-bench.md from the raw rows of scripts/bench_launch.py.

usage: plot_launch.py CSV PNG [NAME_OF_ALT_BUILD]

Prints, per (K, ppn): the median (min-max) wall time of each arm over the repetitions, and
the paired ratios prun/mpirun (one per repetition: the two runs of the same repetition),
medianed, with min-max; then the one-shot breakdown (boot, pterm) per K. Failed runs (rc != 0)
are counted and left out.
"""
import csv
import statistics
import sys
from collections import defaultdict

csv_path, png = sys.argv[1:3]
med = statistics.median
GOALS = {"oneshot": 0.35, "persistent": 0.05}  # at K = 16, prun / mpirun (issue 11)

t = defaultdict(dict)  # (k, ppn, arm) -> {rep: seconds}
failed = defaultdict(int)
loads = []
with open(csv_path) as f:
    for r in csv.DictReader(f):
        key = (int(r["k"]), int(r["ppn"]), r["arm"])
        if int(r["rc"]) != 0:
            failed[key] += 1
            continue
        t[key][int(r["rep"])] = float(r["seconds"])
        loads.append(float(r["load1"]))

ks = sorted({k for k, _, _ in t})
ARMS = ("oneshot", "persistent", "mpirun")
ALT = ("oneshot_alt", "persistent_alt")
has_alt = any(a in ALT for _, _, a in t)
ppns = sorted({p for _, p, a in t if a in ARMS})


def ms(xs):
    return f"{1e3 * med(xs):.0f} ({1e3 * min(xs):.0f}–{1e3 * max(xs):.0f})"


def paired(k, ppn, arm, base="mpirun"):
    a, b = t[(k, ppn, arm)], t[(k, ppn, base)]
    return [a[r] / b[r] for r in sorted(a) if r in b]


def rat(xs):
    return f"{med(xs):.2f} ({min(xs):.2f}–{max(xs):.2f})"


print(f"load average (1 min) at the runs: median {med(loads):.1f}, min {min(loads):.1f}, max {max(loads):.1f}")
if failed:
    print("failed runs (left out):", dict(failed))
for ppn in ppns:
    print(f"\n### {ppn} proc{'s' if ppn > 1 else ''} per node — wall ms, median (min–max); ratios paired per repetition\n")
    print("| K | procs | prun one-shot | prun persistent DVM | mpirun | one-shot / mpirun | persistent / mpirun | n |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for k in ks:
        cells = [ms(list(t[(k, ppn, a)].values())) for a in ARMS]
        po, pp = paired(k, ppn, "oneshot"), paired(k, ppn, "persistent")
        bold = k == max(ks)
        r1, r2 = rat(po), rat(pp)
        if bold:
            r1, r2 = f"**{r1}**", f"**{r2}**"
        print(f"| {k} | {k * ppn} | {' | '.join(cells)} | {r1} | {r2} | {len(po)} |")

if has_alt:
    for ppn in ppns:
        print(f"\n### Alternative build (`_alt` arms), {ppn} proc{'s' if ppn > 1 else ''} per node — same runs, interleaved\n")
        print("| K | prun one-shot alt | prun persistent alt | one-shot alt / mpirun | persistent alt / mpirun "
              "| one-shot alt / one-shot | persistent alt / persistent |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for k in ks:
            cells = [ms(list(t[(k, ppn, a)].values())) for a in ALT]
            rs = [rat(paired(k, ppn, "oneshot_alt")), rat(paired(k, ppn, "persistent_alt")),
                  rat(paired(k, ppn, "oneshot_alt", "oneshot")), rat(paired(k, ppn, "persistent_alt", "persistent"))]
            if k == max(ks):
                rs = [f"**{r}**" for r in rs]
            print(f"| {k} | {' | '.join(cells)} | {' | '.join(rs)} |")

print("\n### One-shot breakdown — ms, median (min–max)\n")
print("| K | dvmd boot (`--daemonize` returns) | pterm returns | pterm → HNP exited | boot + persistent job (1 ppn) + pterm → exit | one-shot measured (1 ppn) |")
print("|---:|---:|---:|---:|---:|---:|")
for k in ks:
    b, pr, pe = (list(t[(k, 0, a)].values()) for a in ("dvm_boot", "pterm_return", "pterm_hnp_exit"))
    job = med(list(t[(k, 1, "persistent")].values()))
    one = med(list(t[(k, 1, "oneshot")].values()))
    print(f"| {k} | {ms(b)} | {ms(pr)} | {ms(pe)} | {1e3 * (med(b) + job + med(pe)):.0f} | {1e3 * one:.0f} |")

print("\n### Goals at K = 16\n")
for ppn in ppns:
    for arm, goal in GOALS.items():
        if (16, ppn, arm) in t:
            r = med(paired(16, ppn, arm))
            print(f"- {arm} / mpirun, {ppn} ppn: {r:.3f} vs goal ≤ {goal}: {'met' if r <= goal else 'NOT met'}")
        if (16, ppn, arm + "_alt") in t:
            r = med(paired(16, ppn, arm + "_alt"))
            print(f"- {arm}_alt / mpirun, {ppn} ppn: {r:.3f} vs goal ≤ {goal}: {'met' if r <= goal else 'NOT met'}")

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

colors = {"oneshot": "tab:blue", "persistent": "tab:green", "mpirun": "tab:red",
          "oneshot_alt": "tab:cyan", "persistent_alt": "tab:olive"}
labels = {"oneshot": "prun one-shot", "persistent": "prun, persistent DVM", "mpirun": "mpirun (Open MPI 4.1.4)",
          "oneshot_alt": "prun one-shot, alt build", "persistent_alt": "prun persistent, alt build"}
if len(sys.argv) > 3:  # a name for the alternative build
    for a in ALT:
        labels[a] = labels[a].replace("alt build", sys.argv[3])
plot_arms = ARMS + (ALT if has_alt else ())
fig, axes = plt.subplots(2, len(ppns), figsize=(6 * len(ppns), 9), squeeze=False)
for j, ppn in enumerate(ppns):
    ax = axes[0][j]
    for arm in plot_arms:
        ys = [list(t[(k, ppn, arm)].values()) for k in ks]
        m = [1e3 * med(y) for y in ys]
        lo = [m[i] - 1e3 * min(y) for i, y in enumerate(ys)]
        hi = [1e3 * max(y) - m[i] for i, y in enumerate(ys)]
        ax.errorbar(ks, m, yerr=[lo, hi], marker="o", capsize=3, color=colors[arm], label=labels[arm],
                    ls="--" if arm in ALT else "-")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_xlabel("fake nodes K (one daemon each)")
    ax.set_ylabel("wall time, ms (median, min–max)")
    ax.set_title(f"launch /bin/true, {ppn} proc{'s' if ppn > 1 else ''} per node")
    ax.grid(True, which="both", alpha=0.3)
    lo_y, hi_y = ax.get_ylim()
    ax.set_ylim(lo_y, hi_y * 8)
    ax.legend(fontsize=7, ncol=2, loc="upper left")
    ax = axes[1][j]
    for arm in ("oneshot", "persistent") + (ALT if has_alt else ()):
        rs = [paired(k, ppn, arm) for k in ks]
        m = [med(r) for r in rs]
        ax.errorbar(ks, m, yerr=[[m[i] - min(r) for i, r in enumerate(rs)], [max(r) - m[i] for i, r in enumerate(rs)]],
                    marker="o", capsize=3, color=colors[arm], label=f"{labels[arm]} / mpirun",
                    ls="--" if arm in ALT else "-")
        if arm in GOALS:
            ax.axhline(GOALS[arm], color=colors[arm], ls=":", lw=1.2, label=f"goal at K=16: ≤ {GOALS[arm]}")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_xlabel("fake nodes K")
    ax.set_ylabel("prun / mpirun, paired (median, min–max)")
    ax.grid(True, which="both", alpha=0.3)
    lo_y, hi_y = ax.get_ylim()
    ax.set_ylim(lo_y, hi_y * 12)
    ax.legend(fontsize=7, ncol=2, loc="upper right")
fig.suptitle("Launch time on netns fake nodes (2 shared vCPUs)")
fig.tight_layout()
fig.savefig(png, dpi=110)
print(f"\nplot: {png}")
