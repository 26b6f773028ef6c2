#!/usr/bin/python3
"""Launch benchmark (issue 4): prun one-shot, prun on a persistent DVM and Open MPI's mpirun
starting /bin/true on the same netns fake nodes. Writes docs/launch-bench.csv (+ .png via
scripts/plot_launch.py) and prints the tables of docs/launch-bench.md.

    sudo scripts/bench_launch.py                 # build, measure K = 1 2 4 8 16, plot
    REPS=15 KS="1 2 4 8 16" PPNS="1 4" scripts/bench_launch.py
    SKIP_BUILD=1 OUT=/tmp/x scripts/bench_launch.py
    BIN_DIR=/other/target/release CSV=/tmp/whatif.csv scripts/bench_launch.py   # other binaries
    ALT_BIN_DIR=/patched/target/release scripts/bench_launch.py   # + oneshot_alt, persistent_alt arms

Per K, `tests/examples/fake_cluster.rs` holds K fake nodes (one network namespace each, a
hostfile `node slots=4`) for the duration; then, in a private mount namespace whose
/etc/hosts also names the nodes (as a real head node's would: without it mpirun's lookup of
each node name falls through to DNS and ~1 run in 4 waits out the 5 s resolver timeout),
this script re-runs itself (`--inner`) and
  1. boots the persistent DVM(s) (`dvmd --hostfile ... --daemonize`, not part of any arm),
  2. checks every arm with `hostname` instead of /bin/true: K*ppn lines, ppn per node, no
     proc on the head; and reads back that the arms differ (the persistent DVM's job ids
     grow run after run, every one-shot run is job 1 of a fresh DVM),
  3. one untimed warm-up run per arm and ppn, then REPS repetitions; in repetition r, for
     each ppn, the arms run in the order rotated by r (A B C / B C A / C A B ...; five arms
     with ALT_BIN_DIR), the ppn order flipping every repetition,
     each timed as the wall clock of the whole command (perf_counter around subprocess.run),
  4. after each repetition, the one-shot breakdown: a second DVM booted (`dvmd --daemonize`
     returns at `DVM ready`) and stopped (`pterm`, then until its HNP pid has exited),
  5. stops the persistent DVM(s) and checks that no dvmd/orted/prun of this run is left.
The launch agent is the same for dvmd and mpirun: OUT/nsagent HOST CMD..., an ssh stand-in
(`ip netns exec HOST unshare --uts <sethost> HOST sh -c "CMD..."`), so every daemon sees its
node's hostname (orted needs it: under plain `ip netns exec` all orteds share the head's
hostname and segfault in hwloc's shared-memory topology setup).
"""
import csv
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 120


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def loadavg():
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


# ---------------------------------------------------------------- inner: one K, timed arms


def run(argv, env=None, capture=False):
    """Runs argv in its own session; kills that group on timeout. Returns (seconds, rc, out)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(
        argv,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        text=True,
    )
    try:
        out, err = p.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        err = f"TIMEOUT after {TIMEOUT}s; " + (err or "")
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        log(f"  rc={p.returncode}: {' '.join(argv)}\n    {err.strip()[-600:]}")
    return dt, p.returncode, out or ""


def pid_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def hnp_pid(uri_file):
    with open(uri_file) as f:
        return int(re.search(r"/dvm-(\d+)-[0-9a-f]+\s*$", f.read()).group(1))


def wait_gone(pid, limit=15.0):
    t0 = time.perf_counter()
    while pid_alive(pid):
        if time.perf_counter() - t0 > limit:
            return None
        time.sleep(0.005)
    return time.perf_counter() - t0


def own_processes(cfg):
    """dvmd/prun run from OUT/bin, and any orted: (pid, comm) still alive."""
    left = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            exe = os.readlink(f"/proc/{d}/exe")
            with open(f"/proc/{d}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if exe in {f"{cfg['bin']}{alt}/{b}" for b in ("dvmd", "prun", "pterm") for alt in ("", "-alt")} \
                or comm == "orted":
            if pid_alive(int(d)):
                left.append((int(d), comm, exe))
    return left


class Arms:
    """The arms of one K. `oneshot`/`persistent` use OUT/bin; with ALT_BIN_DIR set, the same two
    arms again from OUT/bin-alt (`oneshot_alt`, `persistent_alt`), each persistent arm on its
    own DVM; `mpirun` is Open MPI. Every prun arm has its own DVM_TMPDIR, so a one-shot `prun
    --hostfile` never finds (and silently joins) one of the persistent DVMs."""

    def __init__(self, cfg):
        self.cfg = cfg
        k = cfg["k_dir"]
        agent = f"{cfg['nsagent']} {{host}}"
        self.dvmd_args = ["--hostfile", cfg["hostfile"], "--launch-agent", agent, "--bind-address", cfg["head"]]
        self.names = ["oneshot", "persistent", "mpirun"] + (["oneshot_alt", "persistent_alt"] if cfg["alt"] else [])
        self.bin, self.envs, self.uris = {}, {}, {}
        for arm in self.names:
            if arm == "mpirun":
                self.envs[arm] = None
                continue
            self.bin[arm] = cfg["bin"] + ("-alt" if arm.endswith("_alt") else "")
            env = dict(os.environ, DVM_TMPDIR=f"{k}/sess-{arm}")
            env.pop("PRUN_DVMD_ARGS", None)
            if arm.startswith("oneshot"):
                env["PRUN_DVMD_ARGS"] = f"--launch-agent '{agent}' --bind-address {cfg['head']}"
            else:
                self.uris[arm] = f"{k}/{arm}.uri"
            os.makedirs(env["DVM_TMPDIR"], exist_ok=True)
            self.envs[arm] = env
        self.env_boot = dict(os.environ, DVM_TMPDIR=f"{k}/sess-breakdown")
        os.makedirs(self.env_boot["DVM_TMPDIR"], exist_ok=True)

    def persistent(self):
        return [a for a in self.names if a.startswith("persistent")]

    def argv(self, arm, ppn, exe, extra=()):
        n = str(self.cfg["K"] * ppn)
        if arm.startswith("oneshot"):
            return [f"{self.bin[arm]}/prun", "--hostfile", self.cfg["hostfile"], "-n", n, "-N", str(ppn), *extra, exe]
        if arm.startswith("persistent"):
            uri = self.uris[arm]
            return [f"{self.bin[arm]}/prun", "--dvm-uri", f"file:{uri}", "-n", n, "-N", str(ppn), *extra, exe]
        sub = self.cfg["subnet"]
        return ["mpirun", "--allow-run-as-root", "--hostfile", self.cfg["hostfile"], "-np", n, "-N", str(ppn),
                "--mca", "plm_rsh_agent", self.cfg["nsagent"], "--mca", "oob_tcp_if_include", sub,
                "--mca", "btl_tcp_if_include", sub, *extra, exe]

    def env(self, arm):
        return self.envs[arm]

    def boot(self, uri, env, b=None):
        b = b or self.cfg["bin"]
        dt, rc, _ = run([f"{b}/dvmd", *self.dvmd_args, "--report-uri", uri, "--daemonize"], env=env)
        if rc != 0:
            raise SystemExit(f"dvmd boot failed (rc {rc}) on K={self.cfg['K']}")
        return dt

    def term(self, uri, env, b=None):
        b = b or self.cfg["bin"]
        pid = hnp_pid(uri)
        dt, rc, _ = run([f"{b}/pterm", "--dvm-uri", f"file:{uri}"], env=env)
        gone = wait_gone(pid)
        if rc != 0 or gone is None:
            raise SystemExit(f"pterm rc {rc}; HNP {pid} {'still alive' if gone is None else 'gone'}")
        return dt, dt + gone


def verify(arms, cfg):
    """Each arm runs K*ppn procs once, ppn on every node, none on the head; arms differ."""
    nodes = cfg["nodes"]
    for ppn in cfg["ppns"]:
        for arm in arms.names:
            _, rc, out = run(arms.argv(arm, ppn, "hostname"), env=arms.env(arm), capture=True)
            names = out.split()
            counts = {n: names.count(n) for n in set(names)}
            want = {n: ppn for n in nodes}
            if rc != 0 or counts != want:
                raise SystemExit(f"verify {arm} K={cfg['K']} ppn={ppn}: rc {rc}, per-host counts {counts}, want {want}")
    notes = []
    for one, per in (("oneshot", "persistent"), ("oneshot_alt", "persistent_alt")):
        if one not in arms.names:
            continue
        jobs = {}
        for arm in (one, per):
            ids = []
            for _ in range(2):
                _, rc, out = run(arms.argv(arm, 1, "hostname", ["--tag-output"]), env=arms.env(arm), capture=True)
                ids.append(sorted({int(m) for m in re.findall(r"^\[(\d+),\d+\]", out, re.M)}))
            jobs[arm] = ids
        p, o = jobs[per], jobs[one]
        if not (o[0] == o[1] and len(p[0]) == 1 and len(p[1]) == 1 and p[1][0] > p[0][0]):
            raise SystemExit(f"arms not distinct: job ids {one} {o}, {per} {p}")
        notes.append(f"job ids {one} {o[0]} {o[1]} (fresh DVM each time), {per} {p[0]} {p[1]} (same DVM)")
    return "; ".join(notes)


def inner(cfg_path):
    with open(cfg_path) as f:
        cfg = json.load(f)
    K, reps = cfg["K"], cfg["reps"]
    arms = Arms(cfg)
    names = tuple(arms.names)
    rows = []
    log(f"K={K}: persistent DVM boot")
    booted = []
    try:
        for arm in arms.persistent():
            dt = arms.boot(arms.uris[arm], arms.env(arm), arms.bin[arm])
            booted.append(arm)
            rows.append(dict(k=K, ppn=0, rep=-1, arm=f"boot_{arm}", pos=0, seconds=f"{dt:.6f}", rc=0, load1=loadavg()))
        note = verify(arms, cfg)
        log(f"K={K}: verified ({note})")
        for ppn in cfg["ppns"]:  # warm-up, untimed
            for arm in names:
                run(arms.argv(arm, ppn, "/bin/true"), env=arms.env(arm))
        for rep in range(reps):
            ppns = cfg["ppns"] if rep % 2 == 0 else cfg["ppns"][::-1]
            for ppn in ppns:
                r = rep % len(names)
                order = names[r:] + names[:r]
                for pos, arm in enumerate(order):
                    l1 = loadavg()
                    dt, rc, _ = run(arms.argv(arm, ppn, "/bin/true"), env=arms.env(arm))
                    rows.append(dict(k=K, ppn=ppn, rep=rep, arm=arm, pos=pos, seconds=f"{dt:.6f}", rc=rc, load1=l1))
            # One-shot breakdown (OUT/bin): boot and stop of a DVM on the same nodes.
            uri = f"{cfg['k_dir']}/breakdown.uri"
            l1 = loadavg()
            bt = arms.boot(uri, arms.env_boot)
            pt, gone = arms.term(uri, arms.env_boot)
            for arm, v in (("dvm_boot", bt), ("pterm_return", pt), ("pterm_hnp_exit", gone)):
                rows.append(dict(k=K, ppn=0, rep=rep, arm=arm, pos=0, seconds=f"{v:.6f}", rc=0, load1=l1))
            log(f"K={K} rep {rep + 1}/{reps} done, load {loadavg()}")
    finally:
        for arm in booted:
            arms.term(arms.uris[arm], arms.env(arm), arms.bin[arm])
    time.sleep(0.3)
    left = own_processes(cfg)
    if left:
        raise SystemExit(f"K={K}: processes left after the run: {left}")
    with open(cfg["rows"], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    cfg["verified"] = note
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=1)


# ---------------------------------------------------------------- outer: clusters, summary


NSAGENT = """#!/bin/sh
# ssh stand-in: nsagent HOST CMD... runs CMD (words joined, through sh -c, as ssh does) on fake
# node HOST, in its network namespace and under its hostname.
h=$1; shift
exec ip netns exec "$h" unshare --uts sh {sethost} "$h" sh -c "$*"
"""


def start_cluster(fc_bin, K, hostfile):
    p = subprocess.Popen([fc_bin, str(K), "4", hostfile], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    info = {"nodes": [], "addrs": []}
    for line in p.stdout:
        line = line.strip()
        if line == "ready":
            break
        key, _, val = line.partition("=")
        if key == "node":
            name, addr = val.split()
            info["nodes"].append(name)
            info["addrs"].append(addr)
        else:
            info[key] = val
    else:
        raise SystemExit(f"fake_cluster {K} ended before ready (rc {p.wait()})")
    return p, info


def stop_cluster(p, info):
    p.stdin.close()
    p.wait(timeout=60)
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    left = [n for n in info["nodes"] if re.search(rf"^{n}\b", ns, re.M)]
    if left:
        raise SystemExit(f"namespaces left after the cluster was dropped: {left}")


def outer():
    reps = int(os.environ.get("REPS", "15"))
    ks = [int(k) for k in os.environ.get("KS", "1 2 4 8 16").split()]
    ppns = [int(p) for p in os.environ.get("PPNS", "1 4").split()]
    out = os.environ.get("OUT") or subprocess.run(["mktemp", "-d", "/tmp/dvm-launch-bench.XXXXXX"],
                                                  capture_output=True, text=True, check=True).stdout.strip()
    csv_path = os.environ.get("CSV", f"{ROOT}/docs/launch-bench.csv")
    os.makedirs(f"{out}/bin", exist_ok=True)
    if os.environ.get("SKIP_BUILD") != "1":
        subprocess.run(["cargo", "build", "--release", "--bins"], cwd=ROOT, check=True)
        subprocess.run(["cargo", "build", "--release", "-p", "dvm-tests", "--example", "fake_cluster"],
                       cwd=ROOT, check=True)
    # Private copies: a concurrent `cargo build` must not swap the binaries mid-run. prun
    # starts the one-shot dvmd from its own directory.
    # BIN_DIR: measure dvmd/prun/pterm built elsewhere (e.g. a patched tree) instead.
    bin_src = os.environ.get("BIN_DIR", f"{ROOT}/target/release")
    for b in ("dvmd", "prun", "pterm"):
        shutil.copy2(f"{bin_src}/{b}", f"{out}/bin/{b}")
    shutil.copy2(f"{ROOT}/target/release/examples/fake_cluster", f"{out}/bin/fake_cluster")
    # ALT_BIN_DIR: a second build (e.g. a patched tree), measured as two extra arms.
    alt_src = os.environ.get("ALT_BIN_DIR")
    if alt_src:
        os.makedirs(f"{out}/bin-alt", exist_ok=True)
        for b in ("dvmd", "prun", "pterm"):
            shutil.copy2(f"{alt_src}/{b}", f"{out}/bin-alt/{b}")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    mpi = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    machine = [f"git HEAD {head.strip()}; dvmd/prun/pterm from {bin_src}",
               *(f"sha256 {b} {sha256(f'{out}/bin/{b}')[:16]}" for b in ("dvmd", "prun")),
               *([f"alt arms: dvmd/prun/pterm from {alt_src}",
                  *(f"sha256 alt {b} {sha256(f'{out}/bin-alt/{b}')[:16]}" for b in ("dvmd", "prun"))]
                 if alt_src else []),
               f"mpirun: {mpi}; {shutil.which('mpirun')} -> sha256 {sha256(os.path.realpath(shutil.which('mpirun')))[:16]}",
               f"nproc {os.cpu_count()}; kernel {os.uname().release}; cpu {cpu}",
               f"loadavg at start: {' '.join(open('/proc/loadavg').read().split()[:3])}",
               f"REPS={reps} KS={ks} PPNS={ppns}"]
    log("\n".join(machine))
    all_rows, notes = [], []
    t_start = time.time()
    for K in ks:
        k_dir = f"{out}/k{K}"
        os.makedirs(k_dir, exist_ok=True)
        fc, info = start_cluster(f"{out}/bin/fake_cluster", K, f"{k_dir}/hosts")
        try:
            sethost = info["agent"].split("unshare --uts sh ")[1].split()[0]
            nsagent = f"{k_dir}/nsagent"
            with open(nsagent, "w") as f:
                f.write(NSAGENT.replace("{sethost}", sethost))
            os.chmod(nsagent, 0o755)
            with open("/etc/hosts") as f:
                etc_hosts = f.read()
            hosts = etc_hosts + f"# fake cluster k={info['k']}\n" + "".join(
                f"{a} {n}\n" for n, a in zip(info["nodes"], info["addrs"]))
            with open(f"{k_dir}/etc_hosts", "w") as f:
                f.write(hosts)
            cfg = dict(K=K, reps=reps, ppns=ppns, bin=f"{out}/bin", alt=bool(alt_src), k_dir=k_dir, nsagent=nsagent,
                       hostfile=info["hostfile"], head=info["head"], subnet=info["subnet"],
                       nodes=info["nodes"], rows=f"{k_dir}/rows.csv")
            cfg_path = f"{k_dir}/cfg.json"
            with open(cfg_path, "w") as f:
                json.dump(cfg, f, indent=1)
            subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            'mount --bind "$0" /etc/hosts && exec "$@"', f"{k_dir}/etc_hosts",
                            sys.executable, os.path.abspath(__file__), "--inner", cfg_path], check=True)
            with open(cfg_path) as f:
                notes.append(f"K={K}: {json.load(f)['verified']}")
            with open(cfg["rows"]) as f:
                all_rows.extend(csv.DictReader(f))
        finally:
            stop_cluster(fc, info)
    machine.append(f"loadavg at end: {' '.join(open('/proc/loadavg').read().split()[:3])}; "
                   f"wall time {time.time() - t_start:.0f} s")
    leftover = []
    for pid in subprocess.run(["pgrep", "-x", "dvmd|pmix-worker|orted|prun"], capture_output=True, text=True).stdout.split():
        try:
            leftover.append(f"{pid} {os.readlink(f'/proc/{pid}/exe')}")
        except OSError:
            pass
    machine.append(f"dvmd/pmix-worker/orted/prun processes on the machine after the run (any owner): {leftover or 'none'}")
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(all_rows[0]))
        w.writeheader()
        w.writerows(all_rows)
    with open(f"{out}/machine.txt", "w") as f:
        f.write("\n".join(machine + notes) + "\n")
    log("\n".join(machine + notes))
    log(f"raw rows: {csv_path}; work dir {out}")
    png = os.path.splitext(csv_path)[0] + ".png"
    alt_name = [os.environ.get("ALT_NAME", "alt build")] if alt_src else []
    subprocess.run([sys.executable, f"{ROOT}/scripts/plot_launch.py", csv_path, png, *alt_name], check=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--inner":
        inner(sys.argv[2])
    else:
        if os.geteuid() != 0:
            raise SystemExit("bench_launch.py needs root (network namespaces)")
        outer()
