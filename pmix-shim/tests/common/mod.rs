//! Test host: one real libpmix server in this test process, real client processes.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use pmix_shim::{Info, JobInfo, PmixEvent, PmixServer, ServerConfig};

pub const HOST_ALIAS: &str = "dvm-test-node0";
pub const DEADLINE: Duration = Duration::from_secs(60);

pub struct Host {
    pub server: Option<PmixServer>,
    pub rx: Receiver<PmixEvent>,
    pub tmp: tempfile::TempDir,
    pub init_ms: f64,
}

impl Host {
    /// Starts the server with fence_nb upcalls enabled even for all-local fences.
    pub fn start() -> Host {
        Host::start_as(Some(HOST_ALIAS))
    }

    /// As `start`, with `hostname` as PMIX_HOSTNAME (None: the real hostname, no map check).
    pub fn start_as(hostname: Option<&str>) -> Host {
        // Before init, and before any other thread exists in this test binary's single test.
        std::env::set_var("PMIX_MCA_pmix_server_fence_localonly_opt", "0");
        let tmp = tempfile::Builder::new().prefix("pmix-shim-test").tempdir().expect("tempdir");
        let mut cfg = ServerConfig::new(tmp.path().join("srv"));
        cfg.hostname = hostname.map(String::from);
        let (tx, rx) = channel();
        let t0 = Instant::now();
        let server = PmixServer::init(&cfg, move |ev| {
            let _ = tx.send(ev);
        })
        .expect("PMIx server init");
        let init_ms = t0.elapsed().as_secs_f64() * 1e3;
        eprintln!("timing: PmixServer::init {init_ms:.1} ms (libpmix {})", PmixServer::version());
        Host { server: Some(server), rx, tmp, init_ms }
    }

    pub fn server(&self) -> &PmixServer {
        self.server.as_ref().expect("server running")
    }

    /// Registers a one-node job of `n` ranks on this host and its clients; returns each rank's env.
    pub fn launch_job(&self, nspace: &str, n: u32) -> Vec<Vec<(String, String)>> {
        self.launch_job_on(nspace, n, HOST_ALIAS)
    }

    /// As `launch_job`, with the job's single node named `node` in the maps.
    pub fn launch_job_on(&self, nspace: &str, n: u32, node: &str) -> Vec<Vec<(String, String)>> {
        self.launch_job_with(nspace, n, node, Vec::new())
    }

    /// As `launch_job_on`, with `extra` job-level infos.
    pub fn launch_job_with(&self, nspace: &str, n: u32, node: &str, extra: Vec<Info>) -> Vec<Vec<(String, String)>> {
        let job = JobInfo {
            extra,
            node_map: vec![node.into()],
            proc_map: vec![(0..n).collect()],
            job_size: n,
            universe_size: n,
            appnum: 0,
            jobid: Some(nspace.into()),
            ..Default::default()
        };
        let took = self.server().register_nspace(nspace, n, &job).expect("register_nspace");
        eprintln!("timing: register_nspace({nspace}, {n} procs) {:.2} ms", took.as_secs_f64() * 1e3);
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        (0..n)
            .map(|r| {
                let took = self.server().register_client(nspace, r, uid, gid).expect("register_client");
                let t0 = Instant::now();
                let mut env = self.server().setup_fork(nspace, r).expect("setup_fork");
                // Open MPI's session directories go under this test's tmpdir (removed by
                // `stop`), not /tmp: a rank that aborts leaves its own behind.
                env.push(("OMPI_MCA_orte_tmpdir_base".into(), self.tmp.path().display().to_string()));
                eprintln!(
                    "timing: register_client {:.2} ms, setup_fork {:.2} ms ({} vars)",
                    took.as_secs_f64() * 1e3,
                    t0.elapsed().as_secs_f64() * 1e3,
                    env.len()
                );
                assert!(env.iter().any(|(k, v)| k == "PMIX_NAMESPACE" && v == nspace), "setup_fork env: {env:?}");
                assert!(env.iter().any(|(k, v)| k == "PMIX_RANK" && *v == r.to_string()), "setup_fork env: {env:?}");
                env
            })
            .collect()
    }

    pub fn finish_job(&self, nspace: &str, n: u32) {
        for r in 0..n {
            let took = self.server().deregister_client(nspace, r).expect("deregister_client");
            eprintln!("timing: deregister_client {:.2} ms", took.as_secs_f64() * 1e3);
        }
        let took = self.server().deregister_nspace(nspace).expect("deregister_nspace");
        eprintln!("timing: deregister_nspace({nspace}) {:.2} ms", took.as_secs_f64() * 1e3);
    }

    pub fn stop(mut self) {
        if let Some(s) = self.server.take() {
            s.finalize().expect("finalize");
        }
        let srv = self.tmp.path().join("srv");
        self.tmp.close().expect("remove tmpdir");
        assert!(!srv.exists());
    }
}

/// A child process killed by PID (SIGKILL + reap) unless it exited already.
pub struct Proc {
    pub child: Child,
    pub rank: u32,
    pub exit: Option<i32>,
}

impl Proc {
    pub fn spawn(program: &str, args: &[&str], env: &[(String, String)], rank: u32) -> Proc {
        let child = Command::new(program)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {program}: {e}"));
        Proc { child, rank, exit: None }
    }

    /// Polls for exit; returns the exit code (signal n reported as 128+n) once exited.
    pub fn poll(&mut self) -> Option<i32> {
        if self.exit.is_none() {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                use std::os::unix::process::ExitStatusExt;
                self.exit = Some(st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0)));
            }
        }
        self.exit
    }

    pub fn output(&mut self) -> (String, String) {
        let mut out = String::new();
        let mut err = String::new();
        if let Some(mut o) = self.child.stdout.take() {
            o.read_to_string(&mut out).ok();
        }
        if let Some(mut e) = self.child.stderr.take() {
            e.read_to_string(&mut err).ok();
        }
        (out, err)
    }

    /// `key=value` lines of stdout.
    pub fn values(out: &str) -> BTreeMap<String, String> {
        out.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.to_owned(), v.to_owned())).collect()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.poll().is_none() {
            // SAFETY: kill by the PID of our own unreaped child.
            unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGKILL) };
            let _ = self.child.wait();
        }
    }
}

/// Runs the host loop: hands every event to `handle` until `done` says so or the deadline hits
/// (then panics with `what`).
/// Answers what every test answers the same way (a client connecting or finalizing: success;
/// a fence: success with the caller's own data, as a one-daemon fence returns) and hands back
/// any other event.
pub fn answer_routine(ev: PmixEvent) -> Option<PmixEvent> {
    match ev {
        PmixEvent::ClientConnected { reply, .. } | PmixEvent::ClientFinalized { reply, .. } => {
            reply.complete(pmix_shim::SUCCESS);
            None
        }
        PmixEvent::FenceNb(f) => {
            let data = f.data.clone();
            f.reply.complete(pmix_shim::SUCCESS, &data);
            None
        }
        other => Some(other),
    }
}

pub fn drive(
    rx: &Receiver<PmixEvent>,
    procs: &mut [Proc],
    what: &str,
    mut handle: impl FnMut(PmixEvent),
    mut done: impl FnMut(&mut [Proc]) -> bool,
) {
    let t0 = Instant::now();
    loop {
        match rx.recv_timeout(Duration::from_millis(20)) {
            Ok(ev) => handle(ev),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => panic!("{what}: event channel closed"),
        }
        for p in procs.iter_mut() {
            p.poll();
        }
        if done(procs) {
            return;
        }
        if t0.elapsed() > DEADLINE {
            let states: Vec<_> = procs.iter().map(|p| (p.rank, p.exit)).collect();
            panic!("{what}: not done after {DEADLINE:?}; procs (rank, exit) {states:?}");
        }
    }
}

/// Open MPI 4.1 env for ranks started by a non-ORTE launcher on one host (PMIX-NOTES.md).
pub const OMPI_ENV: [(&str, &str); 4] = [
    ("OMPI_MCA_schizo", "^orte"),
    ("OMPI_MCA_pml", "ob1"),
    ("OMPI_MCA_btl", "self,tcp"),
    ("OMPI_MCA_btl_tcp_if_include", "lo"),
];

/// Compiles a C MPI program with mpicc into the host's temp dir.
pub fn build_mpi_program(host: &Host, name: &str, source: &str) -> std::path::PathBuf {
    let src = host.tmp.path().join(format!("{name}.c"));
    let exe = host.tmp.path().join(name);
    std::fs::write(&src, source).unwrap();
    let cc = Command::new("mpicc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("mpicc not runnable ({e}): apt-get install -y openmpi-bin libopenmpi-dev"));
    assert!(cc.status.success(), "mpicc failed: {}", String::from_utf8_lossy(&cc.stderr));
    exe
}

/// Start one Open MPI rank per environment (rank = position), each with `OMPI_ENV` added.
pub fn spawn_mpi_ranks(exe: &std::path::Path, envs: Vec<Vec<(String, String)>>) -> Vec<Proc> {
    envs.into_iter()
        .enumerate()
        .map(|(r, mut env)| {
            env.extend(OMPI_ENV.iter().map(|(k, v)| (k.to_string(), v.to_string())));
            Proc::spawn(exe.to_str().unwrap(), &[], &env, r as u32)
        })
        .collect()
}
