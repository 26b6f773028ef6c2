#!/usr/bin/python3
"""MPI launch benchmark (issue 5): `mpinoop` (MPI_Init + MPI_Finalize) under prun one-shot, prun
on a persistent DVM and Open MPI's mpirun, on the same netns fake nodes. Writes
docs/mpi-bench.csv and docs/mpi-bench.png and prints the tables of docs/mpi-bench.md.

    sudo scripts/bench_mpi.py                       # build, measure K = 1 2 4 8 16 x 1, 4 ppn, plot
    REPS=10 KS="1 2 4 8 16" PPNS="1 4" scripts/bench_mpi.py
    SKIP_BUILD=1 BIN_DIR=/tmp/x/target/release FC_BIN=/tmp/x/target/release/examples/fake_cluster \
        MPI_SRC=/tmp/x/tests/mpi BIN_COMMIT=abc123 scripts/bench_mpi.py     # binaries built elsewhere
    scripts/bench_mpi.py --report docs/mpi-bench.csv docs/mpi-bench.png   # tables + plot again
    scripts/bench_mpi.py --augment OUT docs/mpi-bench.csv   # (re)add the tl_ rows from OUT's debug logs

The machinery is scripts/bench_launch.py's (imported): per K a `fake_cluster` holder, the
`nsagent` ssh stand-in for both dvmd and mpirun, a private mount namespace whose /etc/hosts
names the nodes, private copies of the binaries, the process/namespace checks at the end.
Four arms, each the wall clock of the whole command:

  oneshot        prun --hostfile H -n N -N ppn -x OMPI_MCA_... mpinoop   (no DVM visible: boots one)
  persistent     prun --dvm-uri file:F ... mpinoop                       (DVM booted once per K)
  persistent_dbg the same on a second persistent DVM whose daemons log PMIx fences and grpcomm
                 fences at debug; its log gives the fence times (`fences_*` rows)
  mpirun         mpirun --hostfile H -np N -N ppn --mca pml ob1 --mca btl_tcp_if_include SUBNET ...

Every arm gives the ranks the same MCA settings: pml ob1 and btl_tcp_if_include SUBNET (prun:
`-x`, mpirun: `--mca`). Before timing, per arm and ppn, `hello` must print K*ppn lines with
size K*ppn, ranks 0..N-1, ppn per node, none on the head; `printenv` must read back the MCA
values in every rank; prun arms must be distinct DVMs (job ids). Then one untimed warm-up per
arm and ppn, and REPS repetitions with the arm order rotated per repetition and the ppn order
flipped; rank 0's `mpinoop MPI_Init_us` is kept with each run. After each repetition, the
one-shot breakdown (boot a DVM, pterm it). After the repetitions, `dvm-bench` barrier/modex on
the persistent DVM (the DVM's collectives alone, no MPI).

Fence times, from the debug DVM's log (every daemon's lines are forwarded to the HNP's log,
tagged): per job and fence sequence number, over the daemons hosting the job,
  span = last `fence complete` - first `fence started` (the fence's footprint on the job's
         critical path, including waiting for the slowest node's ranks to arrive),
  dvm  = last `fence complete` - last `fence started` (the DVM's own part: from the moment the
         last daemon has all its local ranks in the fence until every daemon has the result).
The HNP hosts no rank here, so it takes part in no fence and logs none itself.
"""
import csv
import datetime
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_launch as bl  # noqa: E402  (run, loadavg, sha256, clusters, nsagent, pid helpers)

ROOT = bl.ROOT
log = bl.log
ARMS = ("oneshot", "persistent", "persistent_dbg", "mpirun")
DBG_LOG = "warn,dvmd::pmix=debug,dvm_grpcomm=debug"
INIT_RE = re.compile(r"^mpinoop MPI_Init_us (\d+)\s*$", re.M)

# ---------------------------------------------------------------- inner: one K


class Arms:
    def __init__(self, cfg):
        self.cfg = cfg
        k = cfg["k_dir"]
        agent = f"{cfg['nsagent']} {{host}}"
        self.dvmd_args = ["--hostfile", cfg["hostfile"], "--launch-agent", agent, "--bind-address", cfg["head"]]
        self.mca = {"OMPI_MCA_pml": "ob1", "OMPI_MCA_btl_tcp_if_include": cfg["subnet"]}
        self.bin = cfg["bin"]
        self.envs, self.uris = {}, {}
        for arm in ARMS:
            if arm == "mpirun":
                self.envs[arm] = dict(os.environ)
                continue
            env = dict(os.environ, DVM_TMPDIR=f"{k}/sess-{arm}")
            for v in ("PRUN_DVMD_ARGS", "DVM_LOG", *self.mca):
                env.pop(v, None)
            if arm == "oneshot":
                env["PRUN_DVMD_ARGS"] = f"--launch-agent '{agent}' --bind-address {cfg['head']}"
            else:
                self.uris[arm] = f"{k}/{arm}.uri"
            os.makedirs(env["DVM_TMPDIR"], exist_ok=True)
            self.envs[arm] = env
        for v in self.mca:
            self.envs["mpirun"].pop(v, None)
        self.env_boot = dict(self.envs["persistent"], DVM_TMPDIR=f"{k}/sess-breakdown")
        os.makedirs(self.env_boot["DVM_TMPDIR"], exist_ok=True)

    def argv(self, arm, ppn, exe, extra=()):
        n = str(self.cfg["K"] * ppn)
        if arm == "mpirun":
            sub = self.cfg["subnet"]
            mca = [w for k, v in self.mca.items() for w in ("--mca", k.removeprefix("OMPI_MCA_"), v)]
            return ["mpirun", "--allow-run-as-root", "--hostfile", self.cfg["hostfile"], "-np", n, "-N", str(ppn),
                    "--mca", "plm_rsh_agent", self.cfg["nsagent"], "--mca", "oob_tcp_if_include", sub,
                    *mca, *extra, *exe]
        xs = [w for k, v in self.mca.items() for w in ("-x", f"{k}={v}")]
        where = ["--hostfile", self.cfg["hostfile"]] if arm == "oneshot" else ["--dvm-uri", f"file:{self.uris[arm]}"]
        return [f"{self.bin}/prun", *where, "-n", n, "-N", str(ppn), *xs, *extra, *exe]

    def boot(self, uri, env):
        dt, rc, _ = bl.run([f"{self.bin}/dvmd", *self.dvmd_args, "--report-uri", uri, "--daemonize"], env=env)
        if rc != 0:
            raise SystemExit(f"dvmd boot failed (rc {rc}) on K={self.cfg['K']}")
        return dt

    def term(self, uri, env):
        pid = bl.hnp_pid(uri)
        dt, rc, _ = bl.run([f"{self.bin}/pterm", "--dvm-uri", f"file:{uri}"], env=env)
        gone = bl.wait_gone(pid)
        if rc != 0 or gone is None:
            raise SystemExit(f"pterm rc {rc}; HNP {pid} {'still alive' if gone is None else 'gone'}")
        return dt, dt + gone


def verify(arms, cfg):
    K, nodes, mpi = cfg["K"], cfg["nodes"], cfg["mpi"]
    for ppn in cfg["ppns"]:
        n = K * ppn
        for arm in ARMS:
            _, rc, out = bl.run(arms.argv(arm, ppn, [f"{mpi}/hello"]), env=arms.envs[arm], capture=True)
            got = re.findall(r"^hello rank (\d+) of (\d+) on (\S+)$", out, re.M)
            ranks = sorted(int(r) for r, _, _ in got)
            sizes = {int(s) for _, s, _ in got}
            hosts = [h for _, _, h in got]
            per = {h: hosts.count(h) for h in set(hosts)}
            if rc != 0 or ranks != list(range(n)) or sizes != {n} or per != {h: ppn for h in nodes}:
                raise SystemExit(f"verify hello {arm} K={K} ppn={ppn}: rc {rc}, {len(got)} lines, sizes {sizes}, "
                                 f"per-host {per}\n{out[-2000:]}")
    for arm in ARMS:  # the ranks' MCA settings, read back in every rank
        _, rc, out = bl.run(arms.argv(arm, 1, ["printenv", *arms.mca]), env=arms.envs[arm], capture=True)
        want = "".join(f"{v}\n" for v in arms.mca.values()) * K
        if rc != 0 or sorted(out.splitlines()) != sorted(want.splitlines()):
            raise SystemExit(f"verify MCA read-back {arm} K={K}: rc {rc}, got {out!r}")
    ids = {}
    for arm in ("oneshot", "persistent", "persistent_dbg"):
        got = []
        for _ in range(2):
            _, rc, out = bl.run(arms.argv(arm, 1, ["hostname"], ["--tag-output"]), env=arms.envs[arm], capture=True)
            got.append(sorted({int(m) for m in re.findall(r"^\[(\d+),\d+\]", out, re.M)}))
        ids[arm] = got
    o, p, d = ids["oneshot"], ids["persistent"], ids["persistent_dbg"]
    if not (o[0] == o[1] and all(len(x) == 1 and len(y) == 1 and y[0] > x[0] for x, y in (p, d))):
        raise SystemExit(f"arms not distinct: job ids {ids}")
    return (f"hello: K*ppn ranks of size K*ppn, ppn per node, every arm; MCA read back in every rank; "
            f"job ids oneshot {o[0]} {o[1]}, persistent {p[0]} {p[1]}, persistent_dbg {d[0]} {d[1]}")


def hnp_log(arms, arm):
    uri = arms.uris[arm]
    pid = bl.hnp_pid(uri)
    found = glob.glob(f"{arms.envs[arm]['DVM_TMPDIR']}/dvm-*/dvm-{pid}-*/dvmd.log")
    if len(found) != 1:
        raise SystemExit(f"HNP log of {arm} (pid {pid}): found {found}")
    return found[0]


def own_processes(cfg):
    """dvmd/prun/pterm from OUT/bin, MPI programs from OUT/mpi, and any orted, still alive."""
    mine = {f"{cfg['bin']}/{b}" for b in ("dvmd", "prun", "pterm", "dvm-bench")}
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
        if (exe in mine or exe.startswith(cfg["mpi"] + "/") or comm == "orted") and bl.pid_alive(int(d)):
            left.append((int(d), comm, exe))
    return left


def inner(cfg_path):
    with open(cfg_path) as f:
        cfg = json.load(f)
    K, reps, mpi = cfg["K"], cfg["reps"], cfg["mpi"]
    loadavg = bl.loadavg
    arms = Arms(cfg)
    rows, windows = [], []
    booted = []

    def row(**kw):
        rows.append(dict(dict(k=K, ppn=0, rep=-1, arm="", pos=0, seconds="", rc=0, load1=loadavg(), init_us="",
                              jobid="", nfences=""), **kw))

    try:
        for arm in ("persistent", "persistent_dbg"):
            env = dict(arms.envs[arm], DVM_LOG=DBG_LOG) if arm == "persistent_dbg" else arms.envs[arm]
            dt = arms.boot(arms.uris[arm], env)
            booted.append(arm)
            row(arm=f"boot_{arm}", seconds=f"{dt:.6f}")
        dbg_log = hnp_log(arms, "persistent_dbg")
        note = verify(arms, cfg)
        log(f"K={K}: verified ({note})")
        for ppn in cfg["ppns"]:  # warm-up, untimed
            for arm in ARMS:
                bl.run(arms.argv(arm, ppn, [f"{mpi}/mpinoop"]), env=arms.envs[arm], capture=True)
        for rep in range(reps):
            ppns = cfg["ppns"] if rep % 2 == 0 else cfg["ppns"][::-1]
            for ppn in ppns:
                r = rep % len(ARMS)
                for pos, arm in enumerate(ARMS[r:] + ARMS[:r]):
                    l1 = loadavg()
                    off = os.path.getsize(dbg_log)
                    dt, rc, out = bl.run(arms.argv(arm, ppn, [f"{mpi}/mpinoop"]), env=arms.envs[arm], capture=True)
                    m = INIT_RE.findall(out)
                    if rc == 0 and len(m) != 1:
                        log(f"  K={K} ppn={ppn} {arm}: {len(m)} MPI_Init_us lines in {out!r}")
                    if arm == "persistent_dbg":
                        windows.append((ppn, rep, off, os.path.getsize(dbg_log), dt))
                    row(ppn=ppn, rep=rep, arm=arm, pos=pos, seconds=f"{dt:.6f}", rc=rc, load1=l1,
                        init_us=m[0] if len(m) == 1 else "")
            l1 = loadavg()
            uri = f"{cfg['k_dir']}/breakdown.uri"
            bt = arms.boot(uri, arms.env_boot)
            pt, gone = arms.term(uri, arms.env_boot)
            for arm, v in (("dvm_boot", bt), ("pterm_return", pt), ("pterm_hnp_exit", gone)):
                row(rep=rep, arm=arm, seconds=f"{v:.6f}", load1=l1)
            log(f"K={K} rep {rep + 1}/{reps} done, load {loadavg()}")
        # The DVM's collectives alone: dvm-bench on the (non-debug) persistent DVM.
        bcsv = f"{cfg['k_dir']}/dvm-bench.csv"
        _, rc, out = bl.run([f"{cfg['bin']}/dvm-bench", "--dvm-uri", f"file:{arms.uris['persistent']}",
                             "--count", "100", "--modex-bytes", "0,1024,4096", "--xcast-bytes", "64", "--csv", bcsv],
                            env=arms.envs["persistent"], capture=True)
        log(out)
        if rc == 0:
            with open(bcsv) as f:
                for b in csv.DictReader(f):
                    if b["op"] in ("barrier", "modex"):
                        row(arm=f"dvmbench_{b['op']}_{b['bytes']}", seconds=f"{float(b['p50_us']) / 1e6:.6f}")
        time.sleep(0.5)  # let the forwarded daemon log lines of the last job arrive
        shutil.copy2(dbg_log, f"{cfg['k_dir']}/dvmd-debug.log")
    finally:
        for arm in booted:
            arms.term(arms.uris[arm], arms.envs[arm])
    fences = parse_fences(f"{cfg['k_dir']}/dvmd-debug.log")
    with open(f"{cfg['k_dir']}/dvmd-debug.log", "rb") as f:
        text = f.read()
    tl_runs = []
    for ppn, rep, a, b, wall in windows:
        jobs = {int(j) for j in re.findall(rb"PMIx namespace registered jobid=(\d+)", text[a:b])}
        if len(jobs) != 1:
            log(f"  K={K} ppn={ppn} rep={rep}: job ids in the log window {sorted(jobs)}; fence rows skipped")
            continue
        job = jobs.pop()
        fs = fences.get(job, {})
        bad = [s for s, f in fs.items() if len(f["start"]) != K or len(f["done"]) != K]
        if bad:
            log(f"  K={K} job {job}: fences {bad} not seen on all {K} daemons: { {s: fs[s] for s in bad} }")
        span = sum(max(f["done"]) - min(f["start"]) for f in fs.values())
        dvm = sum(max(f["done"]) - max(f["start"]) for f in fs.values())
        for arm, v in (("fences_span", span), ("fences_dvm", dvm)):
            row(ppn=ppn, rep=rep, arm=arm, seconds=f"{v:.6f}", jobid=job, nfences=len(fs))
        tl_runs.append((ppn, rep, job))
    rows.extend(timeline_rows(f"{cfg['k_dir']}/dvmd-debug.log", tl_runs, K))
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


EVENT_RE = re.compile(r"^\[dvmd (\d+)@\S+\] (\S+) DEBUG (?:PMIx namespace registered jobid=(\d+) .*took=(\S+)"
                      r"|PMIx upcall kind=\"(client_connected|client_finalized)\""
                      r"|PMIx namespace deregistered nspace=dvm-\S+?-job(\d+))")
TL_PHASES = ("reg_last", "conn_first", "conn_last", "f0_first", "f0_last", "f0_done", "f1_first", "f1_last",
             "f1_done", "f2_first", "f2_last", "f2_done", "fin_last", "dereg_last")


def tstamp(s):
    return datetime.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def timeline(path):
    """{jobid: {phase: seconds after the job's first `namespace registered`}} from every daemon's
    lines; lines without a job id (client connected/finalized) belong to the job most recently
    registered on the same daemon (each daemon's own lines arrive in order)."""
    ev = defaultdict(lambda: defaultdict(list))
    took = defaultdict(float)
    current = {}
    with open(path, errors="replace") as f:
        for line in f:
            m = EVENT_RE.match(line)
            if not m:
                continue
            d, t = int(m.group(1)), tstamp(m.group(2))
            if m.group(3):
                job = int(m.group(3))
                current[d] = job
                ev[job]["reg"].append(t)
                v = m.group(4)
                took[job] = max(took[job], float(re.sub(r"[a-zµ]+$", "", v)) *
                                {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}[re.sub(r"^[0-9.]+", "", v)])
            elif m.group(5) and d in current:
                ev[current[d]]["conn" if m.group(5) == "client_connected" else "fin"].append(t)
            elif m.group(6):
                ev[int(m.group(6))]["dereg"].append(t)
    fences = parse_fences(path)
    out = {}
    for job, e in ev.items():
        if not e["reg"]:
            continue
        t0 = min(e["reg"])
        tl = {"reg_took_max": took[job]}
        for name, xs in (("reg_last", e["reg"]), ("conn_first", e["conn"]), ("conn_last", e["conn"]),
                         ("fin_last", e["fin"]), ("dereg_last", e["dereg"])):
            if xs:
                tl[name] = (min(xs) if name.endswith("first") else max(xs)) - t0
        for seq, fs in fences.get(job, {}).items():
            if fs["start"] and fs["done"]:
                tl[f"f{seq}_first"] = min(fs["start"]) - t0
                tl[f"f{seq}_last"] = max(fs["start"]) - t0
                tl[f"f{seq}_done"] = max(fs["done"]) - t0
        out[job] = tl
    return out


def timeline_rows(path, runs, K):
    """Rows `tl_<phase>` for the runs [(ppn, rep, jobid)] of the debug DVM."""
    tls = timeline(path)
    rows = []
    for ppn, rep, job in runs:
        for name, v in sorted(tls.get(job, {}).items()):
            rows.append(dict(k=K, ppn=ppn, rep=rep, arm=f"tl_{name}", pos=0, seconds=f"{v:.6f}", rc=0, load1="",
                             init_us="", jobid=job, nfences=""))
    return rows


def augment(out_dir, csv_path):
    """Adds the tl_ rows of an earlier run (from OUT/k*/dvmd-debug.log and its fences_span rows)."""
    with open(csv_path) as f:
        rows = [r for r in csv.DictReader(f) if not r["arm"].startswith("tl_")]
    runs = defaultdict(list)
    for r in rows:
        if r["arm"] == "fences_span":
            runs[int(r["k"])].append((int(r["ppn"]), int(r["rep"]), int(r["jobid"])))
    for K, rs in sorted(runs.items()):
        rows.extend(timeline_rows(f"{out_dir}/k{K}/dvmd-debug.log", rs, K))
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


FENCE_RE = re.compile(r"^\[dvmd (\d+)@\S+\] (\S+) DEBUG fence (started|complete) rank=\d+ "
                      r"key=b\"dvm-\S+?-job(\d+):\*\" seq=(\d+)")


def parse_fences(path):
    """{jobid: {seq: {"start": [t...], "done": [t...]}}} (seconds), from every daemon's lines."""
    out = defaultdict(lambda: defaultdict(lambda: {"start": [], "done": []}))
    with open(path, errors="replace") as f:
        for line in f:
            m = FENCE_RE.match(line)
            if not m:
                continue
            t = tstamp(m.group(2))
            out[int(m.group(4))][int(m.group(5))]["start" if m.group(3) == "started" else "done"].append(t)
    return out


# ---------------------------------------------------------------- outer


def outer():
    reps = int(os.environ.get("REPS", "10"))
    ks = [int(k) for k in os.environ.get("KS", "1 2 4 8 16").split()]
    ppns = [int(p) for p in os.environ.get("PPNS", "1 4").split()]
    out = os.environ.get("OUT") or subprocess.run(["mktemp", "-d", "/tmp/dvm-mpi-bench.XXXXXX"],
                                                  capture_output=True, text=True, check=True).stdout.strip()
    csv_path = os.environ.get("CSV", f"{ROOT}/docs/mpi-bench.csv")
    if os.environ.get("SKIP_BUILD") != "1":
        subprocess.run(["cargo", "build", "--release", "--bins"], cwd=ROOT, check=True)
        subprocess.run(["cargo", "build", "--release", "-p", "dvm-tests", "--example", "fake_cluster"],
                       cwd=ROOT, check=True)
    bin_src = os.environ.get("BIN_DIR", f"{ROOT}/target/release")
    fc_src = os.environ.get("FC_BIN", f"{ROOT}/target/release/examples/fake_cluster")
    mpi_src = os.environ.get("MPI_SRC", f"{ROOT}/tests/mpi")
    os.makedirs(f"{out}/bin", exist_ok=True)
    for b in ("dvmd", "prun", "pterm", "dvm-bench"):
        shutil.copy2(f"{bin_src}/{b}", f"{out}/bin/{b}")
    shutil.copy2(fc_src, f"{out}/bin/fake_cluster")
    subprocess.run(["make", "-s", "-C", mpi_src, f"OUT={out}/mpi"], check=True)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    mpiv = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    machine = [f"git HEAD {head.strip()}; dvmd/prun/pterm/dvm-bench from {bin_src}"
               f"{' (built from ' + os.environ['BIN_COMMIT'] + ')' if os.environ.get('BIN_COMMIT') else ''}; "
               f"MPI programs from {mpi_src}",
               *(f"sha256 {b} {bl.sha256(f'{out}/bin/{b}')[:16]}" for b in ("dvmd", "prun")),
               f"sha256 mpinoop {bl.sha256(f'{out}/mpi/mpinoop')[:16]}",
               f"mpirun: {mpiv}; {shutil.which('mpirun')}",
               f"nproc {os.cpu_count()}; kernel {os.uname().release}; cpu {cpu}",
               f"loadavg at start: {' '.join(open('/proc/loadavg').read().split()[:3])}",
               f"REPS={reps} KS={ks} PPNS={ppns}"]
    log("\n".join(machine))
    all_rows, notes = [], []
    t_start = time.time()
    for K in ks:
        k_dir = f"{out}/k{K}"
        os.makedirs(k_dir, exist_ok=True)
        fc, info = bl.start_cluster(f"{out}/bin/fake_cluster", K, f"{k_dir}/hosts")
        try:
            sethost = info["agent"].split("unshare --uts sh ")[1].split()[0]
            nsagent = f"{k_dir}/nsagent"
            with open(nsagent, "w") as f:
                f.write(bl.NSAGENT.replace("{sethost}", sethost))
            os.chmod(nsagent, 0o755)
            with open("/etc/hosts") as f:
                hosts = f.read() + f"# fake cluster k={info['k']}\n" + "".join(
                    f"{a} {n}\n" for n, a in zip(info["nodes"], info["addrs"]))
            with open(f"{k_dir}/etc_hosts", "w") as f:
                f.write(hosts)
            cfg = dict(K=K, reps=reps, ppns=ppns, bin=f"{out}/bin", mpi=f"{out}/mpi", k_dir=k_dir, nsagent=nsagent,
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
            bl.stop_cluster(fc, info)
    machine.append(f"loadavg at end: {' '.join(open('/proc/loadavg').read().split()[:3])}; "
                   f"wall time {time.time() - t_start:.0f} s")
    leftover = []
    for pid in subprocess.run(["pgrep", "-x", "dvmd|orted|prun|mpinoop|hello"], capture_output=True,
                              text=True).stdout.split():
        try:
            leftover.append(f"{pid} {os.readlink(f'/proc/{pid}/exe')}")
        except OSError:
            pass
    machine.append(f"dvmd/orted/prun/mpinoop/hello processes on the machine after the run (any owner): "
                   f"{leftover or 'none'}")
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(all_rows[0]))
        w.writeheader()
        w.writerows(all_rows)
    with open(f"{out}/machine.txt", "w") as f:
        f.write("\n".join(machine + notes) + "\n")
    log("\n".join(machine + notes))
    log(f"raw rows: {csv_path}; work dir {out}")
    report(csv_path, os.path.splitext(csv_path)[0] + ".png")


# ---------------------------------------------------------------- report: tables + plot


def report(csv_path, png):
    med = statistics.median
    t = defaultdict(dict)  # (k, ppn, arm) -> {rep: seconds}
    init = defaultdict(dict)  # (k, ppn, arm) -> {rep: us}
    failed = defaultdict(int)
    loads = []
    with open(csv_path) as f:
        for r in csv.DictReader(f):
            key = (int(r["k"]), int(r["ppn"]), r["arm"])
            if int(r["rc"]) != 0:
                failed[key] += 1
                continue
            t[key][int(r["rep"])] = float(r["seconds"])
            if r["init_us"]:
                init[key][int(r["rep"])] = float(r["init_us"])
            if r["arm"] in ARMS:
                loads.append(float(r["load1"]))
    ks = sorted({k for k, _, a in t if a in ARMS})
    ppns = sorted({p for _, p, a in t if a in ARMS})

    def ms(xs):
        return f"{1e3 * med(xs):.0f} ({1e3 * min(xs):.0f}–{1e3 * max(xs):.0f})" if xs else "–"

    def paired(k, ppn, arm, base="mpirun", src=t):
        a, b = src[(k, ppn, arm)], src[(k, ppn, base)]
        return [a[r] / b[r] for r in sorted(a) if r in b]

    def rat(xs):
        return f"{med(xs):.2f} ({min(xs):.2f}–{max(xs):.2f})" if xs else "–"

    print(f"load average (1 min) at the timed runs: median {med(loads):.1f}, min {min(loads):.1f}, "
          f"max {max(loads):.1f}")
    if failed:
        print("failed runs (left out):", dict(failed))
    for ppn in ppns:
        print(f"\n### {ppn} proc{'s' if ppn > 1 else ''} per node — wall ms, median (min–max); ratios paired\n")
        print("| K | ranks | prun one-shot | prun persistent | mpirun | one-shot / mpirun | persistent / mpirun "
              "| debug-log DVM / persistent | n |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for k in ks:
            cells = [ms(list(t[(k, ppn, a)].values())) for a in ("oneshot", "persistent", "mpirun")]
            rs = [rat(paired(k, ppn, "oneshot")), rat(paired(k, ppn, "persistent")),
                  rat(paired(k, ppn, "persistent_dbg", "persistent"))]
            if k == max(ks):
                cells, rs = [f"**{c}**" for c in cells], [f"**{r}**" for r in rs[:2]] + rs[2:]
            print(f"| {k} | {k * ppn} | {' | '.join(cells)} | {' | '.join(rs)} | {len(paired(k, ppn, 'oneshot'))} |")
    for ppn in ppns:
        print(f"\n### Rank 0's MPI_Init, {ppn} ppn — ms, median (min–max); ratio paired\n")
        print("| K | ranks | prun one-shot | prun persistent | mpirun | one-shot / mpirun | persistent / mpirun |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for k in ks:
            cells = [ms([v / 1e6 for v in init[(k, ppn, a)].values()]) for a in ("oneshot", "persistent", "mpirun")]
            rs = [rat(paired(k, ppn, a, src=init)) for a in ("oneshot", "persistent")]
            print(f"| {k} | {k * ppn} | {' | '.join(cells)} | {' | '.join(rs)} |")
    print("\n### DVM fences per job (debug-log DVM) — ms summed over the job's fences, median (min–max)\n")
    print("| K | ppn | fences/job | span (first start → last complete) | DVM part (last start → last complete) "
          "| span / wall (debug DVM) | DVM part / wall (debug DVM) | span / one-shot median | span / persistent median "
          "| dvm-bench barrier + modex 4 KiB + barrier |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    nf = defaultdict(set)
    with open(csv_path) as f:
        for r in csv.DictReader(f):
            if r["arm"] == "fences_span":
                nf[(int(r["k"]), int(r["ppn"]))].add(int(r["nfences"]))
    for ppn in ppns:
        for k in ks:
            span, dvm = t.get((k, ppn, "fences_span"), {}), t.get((k, ppn, "fences_dvm"), {})
            wall = t[(k, ppn, "persistent_dbg")]
            share = [span[r] / wall[r] for r in span if r in wall]
            dshare = [dvm[r] / wall[r] for r in dvm if r in wall]
            one, per = med(t[(k, ppn, "oneshot")].values()), med(t[(k, ppn, "persistent")].values())
            bar, mod = t.get((k, 0, "dvmbench_barrier_0"), {}), t.get((k, 0, "dvmbench_modex_4096"), {})
            pred = f"{1e3 * (2 * med(bar.values()) + med(mod.values())):.2f}" if bar and mod else "–"
            sp = list(span.values())
            print(f"| {k} | {ppn} | {','.join(map(str, sorted(nf[(k, ppn)])))} | {ms(sp)} | "
                  f"{1e3 * med(dvm.values()):.2f} ({1e3 * min(dvm.values()):.2f}–{1e3 * max(dvm.values()):.2f}) | "
                  f"{rat(share)} | {rat(dshare)} | {med(sp) / one:.2f} | {med(sp) / per:.2f} | {pred} |" if sp else
                  f"| {k} | {ppn} | 0 | – | – | – | – | – | – | {pred} |")
    print("\n### Job timeline on the debug-log DVM — ms after the job's first `namespace registered`, median\n")
    cols = ("reg_last", "reg_took_max", "conn_first", "conn_last", "f0_first", "f0_last", "f0_done", "f1_done",
            "f2_done", "fin_last", "dereg_last")
    print("| K | ppn | prun wall | " + " | ".join(cols) + " |")
    print("|---:|---:|---:|" + "---:|" * len(cols))
    for ppn in ppns:
        for k in ks:
            cells = [f"{1e3 * med(t[(k, ppn, 'tl_' + c)].values()):.0f}" if t.get((k, ppn, "tl_" + c)) else "–"
                     for c in cols]
            print(f"| {k} | {ppn} | {1e3 * med(t[(k, ppn, 'persistent_dbg')].values()):.0f} | {' | '.join(cells)} |")
    print("\n### One-shot breakdown — ms, median (min–max)\n")
    print("| K | dvmd boot | pterm returns | pterm → HNP exited |")
    print("|---:|---:|---:|---:|")
    for k in ks:
        print(f"| {k} | " + " | ".join(ms(list(t[(k, 0, a)].values()))
                                      for a in ("dvm_boot", "pterm_return", "pterm_hnp_exit")) + " |")
    # Issue 11's goals, for MPI_Init+Finalize at K = 16 x 4 ppn.
    goals = {"oneshot": 0.6, "persistent": 0.5}
    print("\n### Goals at K = 16, 4 ppn: one-shot ≤ 0.6 × mpirun, persistent ≤ 0.5 × mpirun\n")
    for arm, goal in goals.items():
        if (16, 4, arm) in t:
            r = med(paired(16, 4, arm))
            print(f"- {arm} / mpirun: {r:.2f} → {'met' if r <= goal else 'NOT met'}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"oneshot": "tab:blue", "persistent": "tab:green", "persistent_dbg": "tab:olive", "mpirun": "tab:red"}
    labels = {"oneshot": "prun one-shot", "persistent": "prun, persistent DVM",
              "persistent_dbg": "prun, persistent DVM, debug log", "mpirun": "mpirun (Open MPI 4.1.4)"}
    fig, axes = plt.subplots(3, len(ppns), figsize=(6 * len(ppns), 13), squeeze=False)
    for j, ppn in enumerate(ppns):
        for row_i, (src, scale, what) in enumerate(((t, 1e3, "wall time of the command"),
                                                    (init, 1e-3, "rank 0's MPI_Init"))):
            ax = axes[row_i][j]
            for arm in ARMS:
                ys = [list(src[(k, ppn, arm)].values()) for k in ks]
                if not all(ys):
                    continue
                m = [scale * med(y) for y in ys]
                ax.errorbar(ks, m, yerr=[[m[i] - scale * min(y) for i, y in enumerate(ys)],
                                         [scale * max(y) - m[i] for i, y in enumerate(ys)]],
                            marker="o", capsize=3, color=colors[arm], label=labels[arm],
                            ls=":" if arm == "persistent_dbg" else "-")
            if row_i == 0 and all((k, ppn, "fences_span") in t for k in ks if k > 1):
                kk = [k for k in ks if (k, ppn, "fences_span") in t and med(t[(k, ppn, "fences_span")].values()) > 0]
                ax.plot(kk, [1e3 * med(t[(k, ppn, "fences_span")].values()) for k in kk], "k--", marker="x",
                        label="DVM fences, span (sum of 3)")
                ax.plot(kk, [1e3 * med(t[(k, ppn, "fences_dvm")].values()) for k in kk], "k:", marker="+",
                        label="DVM fences, DVM part (sum of 3)")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(ks, [str(k) for k in ks])
            ax.set_xlabel("fake nodes K (one daemon each)")
            ax.set_ylabel("ms (median, min–max)")
            ax.set_title(f"mpinoop, {ppn} rank{'s' if ppn > 1 else ''} per node: {what}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7, loc="best")
        ax = axes[2][j]
        for arm in ("oneshot", "persistent"):
            rs = [paired(k, ppn, arm) for k in ks]
            m = [med(r) for r in rs]
            ax.errorbar(ks, m, yerr=[[m[i] - min(r) for i, r in enumerate(rs)], [max(r) - m[i] for i, r in enumerate(rs)]],
                        marker="o", capsize=3, color=colors[arm], label=f"{labels[arm]} / mpirun")
        ax.axhline(0.6, color="tab:blue", ls=":", lw=1.2, label="goal for one-shot at K=16 x 4: ≤ 0.6")
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.set_xlabel("fake nodes K")
        ax.set_ylabel("prun / mpirun wall, paired (median, min–max)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle("mpinoop (MPI_Init + MPI_Finalize) on netns fake nodes, 2 shared vCPUs")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    print(f"\nplot: {png}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--inner":
        inner(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "--augment":
        augment(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "--report":
        report(sys.argv[2], sys.argv[3])
    else:
        if os.geteuid() != 0:
            raise SystemExit("bench_mpi.py needs root (network namespaces)")
        outer()
