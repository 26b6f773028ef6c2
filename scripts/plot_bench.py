#!/usr/bin/python3
"""Merge the raw files of scripts/bench_live.sh into one CSV, print the markdown tables of
docs/dvm-bench.md, and plot p50 vs the alpha-beta model.

usage: plot_bench.py RAW_DIR OUT_CSV OUT_PNG
"""
import csv
import glob
import os
import re
import statistics
import sys

raw, out_csv, out_png = sys.argv[1:4]
med = statistics.median

rows = []
for path in sorted(glob.glob(os.path.join(raw, "n*-r*-rep*.csv"))):
    rep = int(re.search(r"rep(\d+)", path).group(1))
    with open(path) as f:
        for r in csv.DictReader(f):
            r["rep"] = rep
            rows.append(r)
rss = list(csv.DictReader(open(os.path.join(raw, "rss.csv"))))

fields = ["kind", "daemons", "radix", "rep", "depth", "op", "bytes", "alpha_us", "beta_ns_per_byte",
          "p50_us", "p99_us", "model_us", "ratio", "rank", "pid", "vmrss_kib", "vmhwm_kib"]
with open(out_csv, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({**r, "kind": "bench"})
    for r in rss:
        m = re.match(r"(idle|after-bench)-n(\d+)-r(\d+)(?:-rep(\d+))?", r["tag"])
        w.writerow({**r, "kind": "rss-" + m.group(1), "daemons": m.group(2), "radix": m.group(3),
                    "rep": m.group(4) or ""})


def sel(daemons, radix, op, b):
    return [r for r in rows if r["daemons"] == str(daemons) and r["radix"] == str(radix)
            and r["op"] == op and r["bytes"] == str(b)]


def span(xs, fmt):
    return f"{fmt.format(med(xs))} ({fmt.format(min(xs))}–{fmt.format(max(xs))})"


ops = []
for r in rows:
    if r["daemons"] == "16" and (r["op"], r["bytes"]) not in ops:
        ops.append((r["op"], r["bytes"]))

print("### 16 daemons: median over repetitions (min–max)\n")
print("| op | bytes | radix 2 p50 µs | radix 2 p99 µs | radix 2 p50/model | radix 64 p50 µs | radix 64 p99 µs | radix 64 p50/model |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for op, b in ops:
    cells = []
    for radix in (2, 64):
        s = sel(16, radix, op, b)
        cells += [span([float(r["p50_us"]) for r in s], "{:.0f}"), f"{med([float(r['p99_us']) for r in s]):.0f}",
                  span([float(r["ratio"]) for r in s], "{:.2f}")]
    print(f"| {op} | {b} | " + " | ".join(cells) + " |")
for radix in (2, 64):
    s = sel(16, radix, "ping", 0)
    print(f"\nradix {radix}: alpha {span([float(r['alpha_us']) for r in s], '{:.1f}')} µs, "
          f"beta {span([float(r['beta_ns_per_byte']) for r in s], '{:.3f}')} ns/B, depth {s[0]['depth']}, n={len(s)}")

print("\n### 8 daemons: barrier and modex 64 B/daemon, median (min–max)\n")
print("| radix | alpha µs | barrier p50 µs | barrier/model | modex 64 p50 µs | modex 64 / barrier (paired) |")
print("|---:|---:|---:|---:|---:|---:|")
for radix in (2, 64):
    bar = {r["rep"]: r for r in sel(8, radix, "barrier", 0)}
    m64 = {r["rep"]: r for r in sel(8, radix, "modex", 64)}
    paired = [float(m64[k]["p50_us"]) / float(bar[k]["p50_us"]) for k in bar]
    print(f"| {radix} | {span([float(r['alpha_us']) for r in bar.values()], '{:.1f}')} "
          f"| {span([float(r['p50_us']) for r in bar.values()], '{:.0f}')} "
          f"| {span([float(r['ratio']) for r in bar.values()], '{:.2f}')} "
          f"| {span([float(r['p50_us']) for r in m64.values()], '{:.0f}')} "
          f"| {span(paired, '{:.2f}')} (n={len(paired)}) |")

print("\n### RSS (VmRSS, MiB): daemons = ranks 1..15, HNP = rank 0\n")
print("| when | radix | daemons min / median / max | HNP | daemons VmHWM max |")
print("|---|---:|---:|---:|---:|")
groups = {}
for r in rss:
    key = re.sub(r"-rep\d+$", "", r["tag"])
    groups.setdefault(key, []).append(r)
for key, rs in groups.items():
    d = [int(r["vmrss_kib"]) / 1024 for r in rs if r["rank"] != "0"]
    h = [int(r["vmrss_kib"]) / 1024 for r in rs if r["rank"] == "0"]
    hwm = [int(r["vmhwm_kib"]) / 1024 for r in rs if r["rank"] != "0"]
    when, radix = re.match(r"(.*)-n16-r(\d+)", key).groups()
    print(f"| {when} | {radix} | {min(d):.1f} / {med(d):.1f} / {max(d):.1f} | {span(h, '{:.1f}')} | {max(hwm):.1f} |")

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit(0)
fig, ax = plt.subplots(figsize=(8, 4.5))
labels = [f"{op}\n{b}" for op, b in ops]
x = range(len(ops))
for i, radix in enumerate((2, 64)):
    p50 = [med([float(r["p50_us"]) for r in sel(16, radix, op, b)]) for op, b in ops]
    mod = [med([float(r["model_us"]) for r in sel(16, radix, op, b)]) for op, b in ops]
    ax.bar([k + (i - 0.5) * 0.4 for k in x], p50, 0.4, label=f"radix {radix} measured p50")
    ax.scatter([k + (i - 0.5) * 0.4 for k in x], mod, marker="_", s=300, color="k",
               label="alpha-beta model" if i == 0 else None, zorder=3)
ax.set_yscale("log")
ax.set_xticks(list(x))
ax.set_xticklabels(labels, fontsize=8)
ax.set_ylabel("µs (median of p50 over repetitions)")
ax.set_title("dvm-bench, 16 local daemons on 2 cores")
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(out_png, dpi=100)
