//! A DVM for job tests: started with `dvmd` (local daemons or fake netns nodes), driven with
//! `prun`, stopped with `pterm`; everything it started is killed by PID on drop.
#![allow(dead_code)]

use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use dvm_tests::{wait_for_line, FakeCluster, LineReader};

pub const DVMD: &str = env!("CARGO_BIN_EXE_dvmd");
pub const PRUN: &str = env!("CARGO_BIN_EXE_prun");
pub const PTERM: &str = env!("CARGO_BIN_EXE_pterm");
pub const BENCH: &str = env!("CARGO_BIN_EXE_dvm-bench");

/// Alive and not a zombie.
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z')))
        .unwrap_or(false)
}

/// Live children of `pid`.
pub fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) {
            let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
            if fields.get(1).and_then(|f| f.parse::<u32>().ok()) == Some(pid) && alive(p) {
                out.push(p);
            }
        }
    }
    out
}

/// Every live descendant of `pid`.
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut all = Vec::new();
    let mut frontier = vec![pid];
    while let Some(p) = frontier.pop() {
        for c in children_of(p) {
            all.push(c);
            frontier.push(c);
        }
    }
    all
}

/// A process's name (`/proc/<pid>/comm`), if it is still there.
pub fn comm(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).ok().map(|c| c.trim_end().to_string())
}

/// Every live descendant of the HNP `pid` but the daemons' PMIx workers: an exec'd one
/// (`dvmd --pmix-worker`) or one a daemon forked at its start (its command line is its
/// parent's).
fn daemon_tree(pid: u32) -> Vec<u32> {
    let cmdline = |p: u32| std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
    let parent = |p: u32| {
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
        stat.rsplit(')').next().and_then(|r| r.split_whitespace().nth(1)).and_then(|f| f.parse::<u32>().ok())
    };
    descendants(pid)
        .into_iter()
        .filter(|&p| {
            let cmd = cmdline(p);
            let forked = parent(p).is_some_and(|pp| cmdline(pp) == cmd);
            !forked && !String::from_utf8_lossy(&cmd).contains("--pmix-worker")
        })
        .collect()
}

/// Pids of every live process whose command line contains `needle`.
pub fn procs_with(needle: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        if let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            if String::from_utf8_lossy(&cmd).contains(needle) && alive(pid) {
                out.push(pid);
            }
        }
    }
    out
}

/// Session directories under a `DVM_TMPDIR` root (`<root>/dvm-<uid>/<dir>`).
pub fn session_dirs(root: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(users) = std::fs::read_dir(root) {
        for u in users.flatten().filter(|e| e.path().is_dir()) {
            if let Ok(s) = std::fs::read_dir(u.path()) {
                // The topology cache lives beside the session directories and is not one.
                out.extend(s.flatten().map(|e| e.path()).filter(|p| !p.ends_with("topology")));
            }
        }
    }
    out
}

/// (stdout, stderr) as text.
pub fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// Where the daemons run.
pub enum Nodes {
    /// `--local n --slots s`.
    Local { daemons: u32, slots: u32 },
    /// One daemon per fake node, `slots` each, through `ip netns exec`.
    Netns { cluster: FakeCluster, slots: usize },
}

pub struct Dvm {
    hnp: Child,
    pub root: PathBuf,
    pub uri: String,
    log: PathBuf,
    /// The HNP and its daemons.
    pub pids: Vec<u32>,
    pub cluster: Option<FakeCluster>,
    /// Leave the DVMs' empty cpu groups when dropped (a test that checks the daemons removed
    /// their own, then calls [`remove_cpu_groups`]).
    pub keep_cpu_groups: bool,
    /// Keeps draining the HNP's stdout.
    _stdout: LineReader,
}

/// Only guards against a hung boot; never what decides pass or fail.
const BOOT_GUARD: Duration = Duration::from_secs(120);

impl Dvm {
    /// Start a DVM; `env` goes to dvmd (and so to every daemon and proc).
    pub fn start(name: &str, nodes: Nodes, radix: u32, env: &[(&str, &str)]) -> Dvm {
        Dvm::start_with_args(name, nodes, radix, env, &[])
    }

    /// As [`Dvm::start`], with more `dvmd` options.
    pub fn start_with_args(name: &str, nodes: Nodes, radix: u32, env: &[(&str, &str)], args: &[&str]) -> Dvm {
        let root = std::env::temp_dir().join(format!("dvm-t-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let uri_file = root.join("uri");
        let log = root.join("dvmd.log");
        let mut cmd = Command::new(DVMD);
        let cluster = match nodes {
            Nodes::Local { daemons, slots } => {
                cmd.args(["--local", &daemons.to_string(), "--slots", &slots.to_string()]);
                None
            }
            Nodes::Netns { cluster, slots } => {
                let hf = root.join("hosts");
                cluster.write_hostfile(&hf, slots).unwrap();
                cmd.arg("--hostfile").arg(&hf);
                cmd.arg("--launch-agent").arg(cluster.exec_prefix_with_hostname());
                cmd.arg("--bind-address").arg(cluster.head_addr().to_string());
                Some(cluster)
            }
        };
        cmd.args(["--radix", &radix.to_string()])
            .args(args)
            .arg("--report-uri")
            .arg(&uri_file)
            .env("DVM_TMPDIR", &root)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap());
        let mut hnp = cmd.spawn().unwrap();
        // Read on a thread (it keeps draining stdout), so the wait for the boot is bounded.
        let stdout = match wait_for_line(hnp.stdout.take().unwrap(), "DVM ready", BOOT_GUARD) {
            Ok((_, lines)) => lines,
            Err(e) => {
                let started = descendants(hnp.id());
                let _ = hnp.kill();
                let _ = hnp.wait();
                for p in started {
                    // SAFETY: plain kill(2) on what this dvmd started.
                    unsafe {
                        libc::kill(p as i32, libc::SIGKILL);
                    }
                }
                if let Some(c) = &cluster {
                    c.kill_all_in_netns();
                }
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                let _ = std::fs::remove_dir_all(&root);
                panic!("dvmd did not start: {e}\n{log}");
            }
        };
        let pids = std::iter::once(hnp.id()).chain(daemon_tree(hnp.id())).collect();
        Dvm {
            hnp,
            root,
            uri: format!("file:{}", uri_file.display()),
            log,
            pids,
            cluster,
            keep_cpu_groups: false,
            _stdout: stdout,
        }
    }

    pub fn prun(&self, args: &[&str]) -> Output {
        self.prun_with_stdin(args, None)
    }

    /// Each daemon's (rank, fences it holds state for), from the DVM's tree views.
    pub fn fences_in_flight(&self) -> Vec<(u32, u64)> {
        let file = self.uri.trim_start_matches("file:");
        let uri = dvmd::session::DvmUri::parse(&std::fs::read_to_string(file).unwrap()).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let views = rt.block_on(async {
            let mut c = dvmd::control::Client::connect(uri).await.expect("control client");
            c.tree_views().await.expect("tree views").views
        });
        views.iter().map(|v| (v.rank, v.fences_in_flight)).collect()
    }

    pub fn prun_with_stdin(&self, args: &[&str], input: Option<&[u8]>) -> Output {
        let mut cmd = Command::new(PRUN);
        cmd.arg("--dvm-uri").arg(&self.uri).args(args).env("DVM_TMPDIR", &self.root);
        cmd.stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() });
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        if let Some(data) = input {
            let mut stdin = child.stdin.take().unwrap();
            let data = data.to_vec();
            std::thread::spawn(move || {
                let _ = stdin.write_all(&data);
            });
        }
        child.wait_with_output().unwrap()
    }

    /// What the HNP and its daemons logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The DVM still runs jobs.
    pub fn assert_up(&self) {
        let out = self.prun(&["-n", "1", "true"]);
        assert!(out.status.success(), "DVM no longer runs jobs: {}", text(&out).1);
    }

    /// Processes left under the daemons (finished jobs must leave none; a daemon's PMIx worker
    /// is the daemon's own). Each process is judged by itself (its parent and executable), so a
    /// worker being replaced while this looks is never mistaken for a leftover.
    pub fn leftover_procs(&self) -> Vec<u32> {
        let mut out: Vec<u32> = self
            .pids
            .iter()
            .flat_map(|&d| descendants(d))
            .filter(|&p| !self.pids.contains(&p) && alive(p) && !self.is_worker(p))
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// A PMIx worker of one of the daemons: a child of a daemon running the daemon's own
    /// executable (`dvmd --pmix-worker`, or just forked to become one).
    fn is_worker(&self, p: u32) -> bool {
        let exe = |p: u32| std::fs::read_link(format!("/proc/{p}/exe")).ok();
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
        let parent = stat.rsplit(')').next().and_then(|r| r.split_whitespace().nth(1)).and_then(|f| f.parse().ok());
        match parent {
            Some(pp) if self.pids.contains(&pp) => exe(p).is_some() && exe(p) == exe(pp),
            _ => false,
        }
    }

    /// [`Dvm::leftover_procs`] with each one's parent and command line, for a failure message.
    pub fn describe_procs(pids: &[u32]) -> Vec<String> {
        pids.iter()
            .map(|p| {
                let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
                let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
                let exe = std::fs::read_link(format!("/proc/{p}/exe")).map(|e| e.display().to_string());
                let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
                let ppid = stat.rsplit(')').next().and_then(|r| r.split_whitespace().nth(1)).unwrap_or("?").to_string();
                format!("{p} (parent {ppid}, exe {exe:?}): {cmd}")
            })
            .collect()
    }

    /// The PMIx worker processes the daemons run now: children of a daemon running the
    /// daemon's own executable (`dvmd --pmix-worker`, or just forked to become one), other
    /// than the daemons themselves.
    pub fn pmix_workers(&self) -> Vec<u32> {
        let mut out: Vec<u32> = (0..self.pids.len()).flat_map(|r| self.workers_of(r)).collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    fn workers_of(&self, rank: usize) -> Vec<u32> {
        let Some(&d) = self.pids.get(rank) else { return Vec::new() };
        children_of(d).into_iter().filter(|&c| !self.pids.contains(&c) && self.is_worker(c)).collect()
    }

    /// The PMIx worker daemon `rank` runs now, if any (one that has started as a worker: it
    /// names itself `pmix-worker`, forked or exec'd).
    pub fn pmix_worker_of(&self, rank: usize) -> Option<u32> {
        self.workers_of(rank).into_iter().find(|&p| comm(p).as_deref() == Some("pmix-worker"))
    }

    /// pterm; then no daemon, no PMIx worker and no session directory may remain.
    pub fn stop(mut self) {
        let workers = self.pmix_workers();
        let st = Command::new(PTERM).arg("--dvm-uri").arg(&self.uri).status().unwrap();
        assert!(st.success(), "pterm failed");
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.hnp.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "dvmd did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.pids.iter().any(|&p| alive(p)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(self.pids.iter().all(|&p| !alive(p)), "daemons left running");
        until(Duration::from_secs(10), "PMIx workers ending with their daemons", || workers.iter().all(|&p| !alive(p)));
        let left = session_dirs(&self.root);
        assert!(left.is_empty(), "session dirs left: {left:?}");
        self.pids.clear();
    }
}

/// Remove the DVMs' cpu groups (`dvm-*` under the cpu hierarchy) that no process is in: a
/// daemon killed with SIGKILL leaves its own behind. (A live DVM whose group is empty at this
/// moment makes it again when it needs it.)
pub fn remove_cpu_groups() {
    for mount in ["/sys/fs/cgroup/cpu", "/sys/fs/cgroup"] {
        let dvms: Vec<_> = std::fs::read_dir(mount).into_iter().flatten().flatten().collect();
        for dvm in dvms.iter().filter(|d| d.file_name().to_str().is_some_and(|n| n.starts_with("dvm-"))) {
            for _ in 0..5 {
                let jobs: Vec<_> = std::fs::read_dir(dvm.path()).into_iter().flatten().flatten().collect();
                let mut busy = false;
                for j in jobs.iter().filter(|j| j.file_type().is_ok_and(|t| t.is_dir())) {
                    busy |= std::fs::remove_dir(j.path()).is_err();
                }
                if !busy && std::fs::remove_dir(dvm.path()).is_ok() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

impl Drop for Dvm {
    fn drop(&mut self) {
        let workers = self.pmix_workers();
        for &p in &workers {
            // SAFETY: plain kill(2) on PMIx workers of this test's daemons.
            unsafe {
                libc::kill(p as i32, libc::SIGKILL);
            }
        }
        let _ = self.hnp.kill();
        let _ = self.hnp.wait();
        for &p in &self.pids {
            // SAFETY: plain kill(2) on PIDs this test started.
            unsafe {
                libc::kill(p as i32, libc::SIGKILL);
            }
        }
        if let Some(c) = &self.cluster {
            c.kill_all_in_netns();
        }
        // A daemon removes its cpu groups as it exits; one the test killed could not.
        if !self.keep_cpu_groups {
            remove_cpu_groups();
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// The MPI test programs (`tests/mpi/*.c`, built with Debian's mpicc), built once per test
/// binary; the path of program `name`.
pub fn mpi_bin(name: &str) -> String {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/mpi");
        // Under the build's own scratch directory (cargo clean removes it), one per test
        // process: test binaries may build at the same time.
        let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("mpi-bin-{}", std::process::id()));
        let st = Command::new("make")
            .arg("-s")
            .arg("-C")
            .arg(&src)
            .arg(format!("OUT={}", out.display()))
            .status()
            .expect("make (and mpicc from Debian's libopenmpi-dev) are needed to build tests/mpi");
        assert!(st.success(), "building tests/mpi with mpicc failed");
        out
    });
    dir.join(name).display().to_string()
}

/// The PMIx test clients (`tests/pmix/*.c`, plain libpmix built with cc and pkg-config), built
/// once per test binary; the path of program `name`.
pub fn pmix_bin(name: &str) -> String {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/pmix");
        let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("pmix-bin-{}", std::process::id()));
        let st = Command::new("make")
            .arg("-s")
            .arg("-C")
            .arg(&src)
            .arg(format!("OUT={}", out.display()))
            .status()
            .expect("make, cc and pkg-config (with Debian's libpmix-dev) are needed to build tests/pmix");
        assert!(st.success(), "building tests/pmix failed");
        out
    });
    dir.join(name).display().to_string()
}

/// kill(2) on a pid this test started.
pub fn signal(pid: u32, sig: i32) {
    // SAFETY: plain kill(2); the caller names a process it started.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// Live processes whose environment holds `DVM_TMPDIR=<root>`: everything a test's DVM, prun
/// or job started under that root, wherever it was reparented.
pub fn procs_in_root(root: &std::path::Path) -> Vec<u32> {
    let want = format!("DVM_TMPDIR={}", root.display()).into_bytes();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        if let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) {
            if env.split(|&b| b == 0).any(|v| v == want.as_slice()) && alive(pid) {
                out.push(pid);
            }
        }
    }
    out
}

/// Poll until `cond` holds, at most `limit`; fail naming `what` otherwise (a guard against a
/// hang, never a measurement).
pub fn until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Wait for `child` to exit, at most `limit` (then kill it and fail naming `what`), and collect
/// its output. The pipes are read on threads from the start, so a full pipe never stalls the
/// child; a pipe still held open by something the child started fails the test by name
/// instead of hanging it.
pub fn wait_output(child: &mut Child, limit: Duration, what: &str) -> Output {
    use std::io::Read;
    fn drain(p: Option<impl Read + Send + 'static>) -> std::sync::mpsc::Receiver<Vec<u8>> {
        let (tx, rx) = std::sync::mpsc::channel();
        if let Some(mut p) = p {
            std::thread::spawn(move || {
                let mut v = Vec::new();
                let _ = p.read_to_end(&mut v);
                let _ = tx.send(v);
            });
        } else {
            let _ = tx.send(Vec::new());
        }
        rx
    }
    let (out, err) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not end within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let grace = Duration::from_secs(20);
    let held = |what_pipe: &str| {
        format!("{what}: its {what_pipe} stayed open {grace:?} after it exited (a process it started still runs)")
    };
    let stdout = out.recv_timeout(grace).unwrap_or_else(|_| panic!("{}", held("stdout")));
    let stderr = err.recv_timeout(grace).unwrap_or_else(|_| panic!("{}", held("stderr")));
    Output { status, stdout, stderr }
}

impl Dvm {
    /// Start `prun args` on this DVM in the background, stdout and stderr piped.
    pub fn spawn_prun(&self, args: &[&str]) -> Child {
        Command::new(PRUN)
            .arg("--dvm-uri")
            .arg(&self.uri)
            .args(args)
            .env("DVM_TMPDIR", &self.root)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }
}

impl Dvm {
    /// Start `dvm-bench args` on this DVM in the background, stdout and stderr piped.
    pub fn bench(&self, args: &[&str]) -> Child {
        Command::new(BENCH)
            .arg("--dvm-uri")
            .arg(&self.uri)
            .args(args)
            .env("DVM_TMPDIR", &self.root)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// Pid of daemon `rank` of this DVM (0: the HNP).
    pub fn daemon_pid(&self, rank: u32) -> u32 {
        if rank == 0 {
            return self.pids[0];
        }
        let found: Vec<u32> =
            procs_with(&format!("--rank={rank}\0")).into_iter().filter(|p| self.pids.contains(p)).collect();
        assert_eq!(found.len(), 1, "daemon {rank}: pids {found:?}");
        found[0]
    }

    /// A `dvm-bench --check-fences` storm (the HNP's benchmark number `nth`) with daemon
    /// `victim` killed by SIGKILL once it runs: the storm must fail naming the victim, and the
    /// `daemons - 1` survivors then pass a clean storm and run jobs. The DVM must have been
    /// started with `DVM_LOG` including `dvm_core::router::bench=info` (the start is seen in its log).
    pub fn storm_with_kill(&self, name: &str, daemons: u32, victim: u32, nth: u32) {
        let mut storm = self.bench(&["--check-fences", "100000000"]);
        let started = format!("benchmark {nth} started");
        until(Duration::from_secs(60), "the fence storm to start on the HNP", || self.log().contains(&started));
        signal(self.daemon_pid(victim), libc::SIGKILL);
        let out = wait_output(&mut storm, Duration::from_secs(60), "the fence storm after kill -9");
        let (o, e) = text(&out);
        assert!(!out.status.success(), "{name}: the storm that lost daemon {victim} reported success: {o}");
        assert!(
            e.contains(&format!("lost daemon {victim} on host")),
            "{name}: the error does not name daemon {victim}: {e}"
        );
        let mut again = self.bench(&["--check-fences", "300"]);
        let out = wait_output(&mut again, Duration::from_secs(120), "the storm on the survivors");
        let (o, e) = text(&out);
        assert!(out.status.success(), "{name}: survivors failed the next storm: {o}{e}");
        assert!(o.contains(&format!("on {} daemons", daemons - 1)), "{name}: {o}");
        self.assert_up();
    }
}
