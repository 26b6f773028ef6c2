#!/usr/bin/python3
"""Job throughput of a persistent DVM (docs/throughput.md): jobs of `/bin/true`, one process
each, on a 4-daemon DVM of this machine (`dvmd --local 4 --slots 2`), end to end in Flux's
way (submit all, wait for all).

    scripts/bench_throughput.py                  # build (release), measure, write CSV + plot
    NS="1000 10000 65536" REPS=3 SEQ=1000 scripts/bench_throughput.py
    SKIP_BUILD=1 OUT=/tmp/tp scripts/bench_throughput.py

Arms, each timed as the wall clock of the whole command:
  bulk        `prun --array 0-(N-1) /bin/true`: N jobs over one connection (N in NS);
  sequential  SEQ x `prun -n 1 /bin/true`, one after another;
  concurrent  SEQ x `prun -n 1 /bin/true`, 64 at a time (xargs -P 64);
  fork        the baseline, measured in the same run: SEQ x `/bin/true` forked and exec'd
              by one shell, one after another (what one core does without any runtime).
The head's RSS is read before and after each bulk size. Then the DVM is started again with
its job events logged (a separate run: logging costs time) and 200 sequential jobs give the
median of each stage of a job's life: submit (prun starts -> the head has the job), queue,
launch (-> the daemon forked the proc), run (fork -> the proc reaped: exec, /bin/true, exit),
exit report (-> the head knows), end (-> prun has exited).
Prints the figures and ratios; writes OUT/throughput.csv, and docs/throughput.csv and
docs/throughput.png when OUT is not set.
"""
import csv
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "target" / "release"
NS = [int(n) for n in os.environ.get("NS", "1000 10000 65536").split()]
REPS = int(os.environ.get("REPS", "3"))
SEQ = int(os.environ.get("SEQ", "1000"))
SAMPLE = int(os.environ.get("SAMPLE", "200"))
OUT = Path(os.environ["OUT"]) if os.environ.get("OUT") else None


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


class Dvm:
    """A `dvmd --local 4 --slots 2` of its own (private session root), stopped by pterm."""

    def __init__(self, log_filter=None):
        self.tmp = tempfile.mkdtemp(prefix="dvm-tp-")
        self.env = dict(os.environ, DVM_TMPDIR=self.tmp, PATH=f"{BIN}:{os.environ['PATH']}")
        self.log = Path(self.tmp) / "dvmd.log"
        if log_filter:
            self.env["DVM_LOG"] = log_filter
        uri = Path(self.tmp) / "uri"
        self.proc = subprocess.Popen(
            [BIN / "dvmd", "--local", "4", "--slots", "2", "--report-uri", uri],
            env=self.env, stdout=subprocess.PIPE, stderr=open(self.log, "w"), text=True)
        for line in self.proc.stdout:
            if "DVM ready" in line:
                break
        else:
            sys.exit(f"dvmd did not start; see {self.log}")
        self.uri = f"file:{uri}"

    def prun(self, *args, check=True):
        return subprocess.run([BIN / "prun", "--dvm-uri", self.uri, *args], env=self.env, check=check,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def rss_kib(self):
        for line in open(f"/proc/{self.proc.pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def stop(self):
        run([BIN / "pterm", "--dvm-uri", self.uri], env=self.env)
        self.proc.wait(timeout=30)
        subprocess.run(["rm", "-rf", self.tmp])


def timed(f):
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


def bulk(dvm, n):
    r = dvm.prun("--array", f"0-{n - 1}", "/bin/true")
    m = re.search(rf"{n} of {n} jobs ran, 0 failed", r.stderr)
    if not m:
        sys.exit(f"array of {n}: {r.stderr}")


def sequential(dvm):
    for _ in range(SEQ):
        dvm.prun("-n", "1", "/bin/true")


def concurrent(dvm):
    # Their "queued" notices are expected here (64 jobs on 8 slots) and not shown.
    cmd = f"seq {SEQ} | xargs -P 64 -I{{}} {BIN}/prun --dvm-uri {dvm.uri} -n 1 /bin/true 2>/dev/null"
    run(["sh", "-c", cmd], env=dvm.env)


def fork_baseline():
    run(["sh", "-c", f"i=0; while [ $i -lt {SEQ} ]; do /bin/true; i=$((i+1)); done"])


STAMP = re.compile(r"^(\S+Z)\s+\w+\s+(.*)$")


def stages():
    """Median of each stage of a job's life over SAMPLE sequential jobs, from the DVM's log."""
    dvm = Dvm("warn,dvm_core::jobs=debug,dvmd::odls=debug")
    prun_times = {}
    try:
        for _ in range(SAMPLE):
            t0 = time.time()
            dvm.prun("-n", "1", "/bin/true")
            prun_times[len(prun_times) + 1] = (t0, time.time())
    finally:
        log = dvm.log.read_text()
        dvm.stop()
    ev = {}
    for line in log.splitlines():
        m = STAMP.match(line)
        if not m:
            continue
        t = datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
        rest = m.group(2)
        j = re.search(r"jobid=(\d+)", rest)
        if not j:
            continue
        jobid = int(j.group(1))
        for key, text in [("submitted", "job submitted"), ("launching", "launching job"),
                          ("forked", "proc started"), ("reaped", "proc reaped"), ("reported", "proc ended")]:
            if rest.startswith(text) or f" {text}" in rest[:40]:
                ev.setdefault(jobid, {}).setdefault(key, t)
    rows = []
    for jobid, (start, end) in prun_times.items():
        e = ev.get(jobid, {})
        keys = ["submitted", "launching", "forked", "reaped", "reported"]
        if not all(k in e for k in keys):
            continue
        rows.append({
            "submit": e["submitted"] - start,
            "queue": e["launching"] - e["submitted"],
            "launch": e["forked"] - e["launching"],
            "run": e["reaped"] - e["forked"],
            "exit report": e["reported"] - e["reaped"],
            "end": end - e["reported"],
            "total": end - start,
        })
    return rows


def main():
    if not os.environ.get("SKIP_BUILD"):
        run(["cargo", "build", "--release", "-p", "dvmd", "--quiet"], cwd=ROOT)
    out = OUT or ROOT / "docs"
    out.mkdir(parents=True, exist_ok=True)
    results = []  # (arm, n, rep, seconds, jobs_per_s)
    rss = []
    dvm = Dvm()
    try:
        dvm.prun("--array", "0-99", "/bin/true")  # warm-up
        for n in NS:
            before = dvm.rss_kib()
            reps = REPS if n <= 10000 else 1
            for rep in range(reps):
                s = timed(lambda: bulk(dvm, n))
                results.append(("bulk", n, rep, s, n / s))
                print(f"bulk {n:>6}: {s:7.2f} s  {n / s:7.0f} jobs/s", flush=True)
            rss.append((n, before, dvm.rss_kib()))
        for rep in range(REPS):
            for arm, f in [("sequential", lambda: sequential(dvm)), ("concurrent", lambda: concurrent(dvm)),
                           ("fork", fork_baseline)]:
                s = timed(f)
                results.append((arm, SEQ, rep, s, SEQ / s))
                print(f"{arm:>10} {SEQ}: {s:7.2f} s  {SEQ / s:7.0f} jobs/s", flush=True)
    finally:
        dvm.stop()

    with open(out / "throughput.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["arm", "jobs", "rep", "seconds", "jobs_per_s"])
        for r in results:
            w.writerow([r[0], r[1], r[2], f"{r[3]:.4f}", f"{r[4]:.1f}"])

    def med(arm, n):
        v = [r[4] for r in results if r[0] == arm and r[1] == n]
        return statistics.median(v) if v else float("nan")

    print("\nmedian jobs/s")
    for n in NS:
        print(f"  bulk {n:>6}: {med('bulk', n):7.0f}")
    for arm in ["sequential", "concurrent", "fork"]:
        print(f"  {arm:>11}: {med(arm, SEQ):7.0f}")
    print("ratios")
    if len(NS) > 1:
        print(f"  bulk {NS[-1]} / bulk {NS[0]}: {med('bulk', NS[-1]) / med('bulk', NS[0]):.2f}")
    print(f"  sequential / fork baseline: {med('sequential', SEQ) / med('fork', SEQ):.2f}")
    print(f"  bulk {NS[0]} / fork baseline: {med('bulk', NS[0]) / med('fork', SEQ):.2f}")
    print("head RSS (KiB) before -> after each bulk size")
    for n, b, a in rss:
        print(f"  {n:>6}: {b} -> {a} ({a - b:+d})")
    print(f"  growth from the first size's start to the last's end: {rss[-1][2] - rss[0][1]:+d} KiB")

    rows = stages()
    print(f"\nwhere a sequential job's time goes (median of {len(rows)} jobs, ms)")
    for k in ["submit", "queue", "launch", "run", "exit report", "end", "total"]:
        v = [r[k] * 1000 for r in rows]
        if v:
            print(f"  {k:>11}: {statistics.median(v):7.3f}")

    if OUT is None:
        plot(results, out / "throughput.png")


def plot(results, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no plot: python3-matplotlib is not installed; apt-get install python3-matplotlib)")
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    ns = sorted({r[1] for r in results if r[0] == "bulk"})
    meds = [statistics.median([r[4] for r in results if r[0] == "bulk" and r[1] == n]) for n in ns]
    ax.plot(ns, meds, "o-", label="dvm bulk (prun --array)")
    labels = {"sequential": "prun -n 1, one after another", "concurrent": "prun -n 1, 64 at a time",
              "fork": "baseline: a shell forking /bin/true"}
    for i, (arm, style) in enumerate([("sequential", "--"), ("concurrent", "-."), ("fork", ":")]):
        v = [r[4] for r in results if r[0] == arm]
        if v:
            ax.axhline(statistics.median(v), linestyle=style, color=f"C{i + 1}", label=f"{labels[arm]} (median)")
    ax.axhline(1000, color="grey", linewidth=0.5)
    ax.set_xscale("log")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("jobs submitted")
    ax.set_ylabel("jobs/s (end to end)")
    ax.set_title("/bin/true jobs on a 4-daemon DVM (2 slots each), this machine")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
