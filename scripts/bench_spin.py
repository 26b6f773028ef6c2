#!/usr/bin/env python3
"""Daemons next to spinning ranks (issue 29): how much slower the DVM's own work gets when
its ranks spin on every core, for each --rank-priority value.

For each arm (a dvmd --rank-priority value) and repetition, in ABBA order: a fresh
`dvmd --local DAEMONS`, then idle: N checked fences (`dvm-bench --check-fences`) and J small
jobs (`prun -n 4 hostname`, one after the other); then SPIN ranks of a job spinning
(`sh -c 'while :; do :; done'`, started through the same DVM, so they are its ranks); the same
fences and jobs again; the spinners stopped; the DVM stopped. Prints one row per run and the
medians and paired ratios (spinning / idle, same run) per arm.

With --mpi REPS: what the policy costs the ranks when the daemon is idle. An MPI benchmark of
our own (tests/mpi/pingpong.c: 8-byte ping-pong half round trip and 8-double MPI_Allreduce, 2
ranks on a one-daemon DVM, bound to cores and unbound), each arm in turn (ABBA), REPS times;
medians and paired ratios against the first arm.

usage: scripts/bench_spin.py [--bin target/release] [--priorities same,nice:5,idle] [--reps 3] [--daemons 4]
       [--spin 16] [--fences 2000] [--jobs 50] [--csv FILE] [--mpi REPS [--iters N]]
"""
import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time


def run(cmd, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def timed(cmd, timeout=600):
    t0 = time.monotonic()
    r = run(cmd, timeout=timeout)
    dt = time.monotonic() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()[-400:]}")
    return dt


def dvm_pids(root):
    """The dvmd processes of the DVM whose DVM_TMPDIR is `root`."""
    pids = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/comm") as f:
                if f.read().strip() != "dvmd":
                    continue
            with open(f"/proc/{p}/environ", "rb") as f:
                if f"DVM_TMPDIR={root}".encode() in f.read().split(b"\0"):
                    pids.append(int(p))
        except OSError:
            pass
    return pids


def spinning(root):
    """Count of the spinner processes of the DVM whose DVM_TMPDIR is `root`."""
    n = 0
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/environ", "rb") as f:
                env = f.read().split(b"\0")
            if f"SPIN_MARK={root}".encode() not in env:
                continue
            n += 1
        except OSError:
            pass
    return n


def one(args, prio, rep):
    root = tempfile.mkdtemp(prefix="dvm-spin-")
    env = dict(os.environ, DVM_TMPDIR=root)
    b = args.bin
    uri = os.path.join(root, "uri")
    # Slots for the spinners and a small job beside them (a job that does not fit would wait
    # in the DVM's queue for the spinners to end).
    slots = -(-(args.spin + 4) // args.daemons)
    start = [f"{b}/dvmd", "--local", str(args.daemons), "--slots", str(slots), "--report-uri", uri, "--daemonize"]
    start += ["--rank-priority", prio]
    dvm = ["--dvm-uri", f"file:{uri}"]
    spinner = None
    try:
        r = run(start, env=env, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"dvmd failed: {r.stderr.strip()}")
        def work():
            f = timed([f"{b}/dvm-bench", *dvm, "--check-fences", str(args.fences)])
            t0 = time.monotonic()
            for _ in range(args.jobs):
                timed([f"{b}/prun", *dvm, *args.job_args.split(), "-n", "4", "hostname"])
            return f, time.monotonic() - t0

        idle = work()
        spinner = subprocess.Popen(
            [f"{b}/prun", *dvm, "-x", f"SPIN_MARK={root}", "-n", str(args.spin),
             "sh", "-c", "while :; do :; done"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while spinning(root) < args.spin:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {spinning(root)} of {args.spin} spinners started")
            time.sleep(0.1)
        time.sleep(1.0)
        busy = work()
    finally:
        if spinner is not None:
            spinner.send_signal(signal.SIGTERM)
            try:
                spinner.wait(timeout=30)
            except subprocess.TimeoutExpired:
                spinner.kill()
        run([f"{b}/pterm", *dvm], timeout=60)
        time.sleep(0.3)
        for pid in dvm_pids(root):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        shutil.rmtree(root, ignore_errors=True)
    return idle, busy


def mpi_run(args, prio, exe, bind):
    """One pingpong job on a fresh one-daemon DVM: (pingpong_us, allreduce_us)."""
    root = tempfile.mkdtemp(prefix="dvm-spin-mpi-")
    env = dict(os.environ, DVM_TMPDIR=root)
    try:
        cmd = [f"{args.bin}/prun", "--local", "1", "--slots", "2", "-x", f"DVM_RANK_PRIORITY={prio}",
               "--bind-to", bind, "-n", "2", exe, str(args.iters)]
        r = run(cmd, env=env, timeout=300)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()[-400:]}")
        f = r.stdout.split()
        return float(f[f.index("pingpong_us") + 1]), float(f[f.index("allreduce_us") + 1])
    finally:
        shutil.rmtree(root, ignore_errors=True)


def mpi_main(args, arms):
    out = tempfile.mkdtemp(prefix="dvm-spin-bin-")
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "mpi")
    r = run(["make", "-s", "-C", src, f"OUT={out}", f"{out}/pingpong"])
    if r.returncode != 0:
        raise RuntimeError(f"building tests/mpi/pingpong.c: {r.stderr}")
    exe = os.path.join(out, "pingpong")
    rows = []
    print(f"# pingpong: 2 ranks, {args.iters} iterations, each arm on a fresh one-daemon DVM, ABBA", flush=True)
    print("bind rank_priority rep pingpong_us allreduce_us", flush=True)
    for bind in ("core", "none"):
        for rep in range(args.mpi):
            for arm in (arms if rep % 2 == 0 else list(reversed(arms))):
                pp, ar = mpi_run(args, arm, exe, bind)
                rows.append((bind, arm, rep, pp, ar))
                print(f"{bind} {arm} {rep} {pp:.3f} {ar:.3f}", flush=True)
    print(f"\nper arm (medians; paired ratios against {arms[0]} in the same repetition, min-max):")
    for bind in ("core", "none"):
        base = {r[2]: r for r in rows if r[0] == bind and r[1] == arms[0]}
        for arm in arms:
            rs = [r for r in rows if r[0] == bind and r[1] == arm]
            pr = [r[3] / base[r[2]][3] for r in rs]
            ar = [r[4] / base[r[2]][4] for r in rs]
            print(f"  bind {bind}, {arm}: pingpong {statistics.median(r[3] for r in rs):.3f} us "
                  f"(x{statistics.median(pr):.3f}, {min(pr):.3f}-{max(pr):.3f}), allreduce "
                  f"{statistics.median(r[4] for r in rs):.3f} us (x{statistics.median(ar):.3f}, {min(ar):.3f}-{max(ar):.3f})")
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("bind,rank_priority,rep,pingpong_us,allreduce_us\n")
            for r in rows:
                f.write(f"{r[0]},{r[1]},{r[2]},{r[3]:.4f},{r[4]:.4f}\n")
    shutil.rmtree(out, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="target/release")
    ap.add_argument("--priorities", default="same,nice:5,idle", help="dvmd --rank-priority values, comma-separated")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--daemons", type=int, default=4)
    ap.add_argument("--spin", type=int, default=16)
    ap.add_argument("--fences", type=int, default=2000)
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--csv")
    ap.add_argument("--job-args", default="", help="extra prun options of the small jobs (e.g. '-x DVM_RANK_PRIORITY=same')")
    ap.add_argument("--mpi", type=int, default=0, metavar="REPS", help="measure the ranks' cost instead (see above)")
    ap.add_argument("--iters", type=int, default=20000, help="with --mpi: iterations of each operation")
    args = ap.parse_args()
    arms = args.priorities.split(",")
    if args.mpi:
        return mpi_main(args, arms)
    rows = []
    print(f"# {args.daemons} daemons, {args.spin} spinning ranks on {os.cpu_count()} cpus; "
          f"{args.fences} checked fences, {args.jobs} x prun -n 4 hostname", flush=True)
    print("rank_priority rep idle_fences_s spin_fences_s ratio idle_jobs_s spin_jobs_s ratio", flush=True)
    for rep in range(args.reps):
        order = arms if rep % 2 == 0 else list(reversed(arms))
        for arm in order:
            (fi, ji), (fs, js) = one(args, arm, rep)
            row = (arm, rep, fi, fs, fs / fi, ji, js, js / ji)
            rows.append(row)
            print(f"{arm} {rep} {fi:.2f} {fs:.2f} {fs / fi:.2f} {ji:.2f} {js:.2f} {js / ji:.2f}", flush=True)
    print("\nper arm (medians; ratios are spinning/idle within each run, min-max):")
    for arm in arms:
        rs = [r for r in rows if r[0] == arm]
        med = lambda i: statistics.median(r[i] for r in rs)
        rng = lambda i: f"{min(r[i] for r in rs):.2f}-{max(r[i] for r in rs):.2f}"
        print(f"  {arm}: fences idle {med(2):.2f} s spin {med(3):.2f} s ratio {med(4):.2f} ({rng(4)}); "
              f"jobs idle {med(5):.2f} s spin {med(6):.2f} s ratio {med(7):.2f} ({rng(7)})")
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("rank_priority,rep,idle_fences_s,spin_fences_s,fence_ratio,idle_jobs_s,spin_jobs_s,job_ratio\n")
            for r in rows:
                f.write(",".join(str(x) if not isinstance(x, float) else f"{x:.4f}" for x in r) + "\n")


if __name__ == "__main__":
    sys.exit(main())
