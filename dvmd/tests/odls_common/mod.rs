//! Shared by the odls_* tests: a harness that owns an `Odls`, reads its events and checks the
//! per-proc ordering contract on every event it hands out.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use dvmd::odls::{ExitKind, Odls, OdlsEvent, ProcSpec, Stream};
use tokio::sync::mpsc;

pub const NODE: &str = "n3";
/// Only a guard against a hung test; never what decides pass or fail.
const HANG_GUARD: Duration = Duration::from_secs(120);

pub fn spec(jobid: u32, rank: u32, argv: &[&str]) -> ProcSpec {
    ProcSpec {
        jobid,
        rank,
        argv: argv.iter().map(|s| s.to_string()).collect(),
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        wdir: "/".into(),
        stdin: false,
        timer_slack_us: 0,
        cpus: None,
        timestamp: false,
        pmi_fd: None,
    }
}

pub fn sh(jobid: u32, rank: u32, script: &str) -> ProcSpec {
    spec(jobid, rank, &["sh", "-c", script])
}

/// What happened to one proc.
#[derive(Default, Debug)]
pub struct ProcLog {
    pub pid: Option<u32>,
    pub out: Vec<u8>,
    pub err: Vec<u8>,
    pub closed: BTreeSet<Stream>,
    pub status: Option<ExitKind>,
    pub failed: Option<String>,
}

impl ProcLog {
    pub fn done(&self) -> bool {
        self.status.is_some() || self.failed.is_some()
    }
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out).into_owned()
    }
}

pub struct Harness {
    pub odls: Odls,
    rx: mpsc::UnboundedReceiver<OdlsEvent>,
    pub procs: BTreeMap<(u32, u32), ProcLog>,
    /// Ack every Output as soon as it is read.
    pub auto_ack: bool,
}

impl Harness {
    pub fn new(window: usize) -> Harness {
        let (tx, rx) = mpsc::unbounded_channel();
        Harness { odls: Odls::new(NODE.into(), tx, window), rx, procs: BTreeMap::new(), auto_ack: true }
    }

    /// The next event, after checking it against the ordering contract and logging it.
    pub async fn next(&mut self) -> OdlsEvent {
        let ev = self.next_raw().await;
        self.check_and_log(&ev);
        if let (true, OdlsEvent::Output { jobid, data, .. }) = (self.auto_ack, &ev) {
            self.odls.ack_output(*jobid, data.len());
        }
        ev
    }

    /// The next event, unchecked and unlogged.
    pub async fn next_raw(&mut self) -> OdlsEvent {
        tokio::time::timeout(HANG_GUARD, self.rx.recv())
            .await
            .expect("hang guard: no odls event")
            .expect("odls event channel closed")
    }

    fn check_and_log(&mut self, ev: &OdlsEvent) {
        let (jobid, rank) = match ev {
            OdlsEvent::Started { jobid, rank, .. }
            | OdlsEvent::Output { jobid, rank, .. }
            | OdlsEvent::OutputClosed { jobid, rank, .. }
            | OdlsEvent::Exited { jobid, rank, .. }
            | OdlsEvent::LaunchFailed { jobid, rank, .. } => (*jobid, *rank),
            // Not a proc's event: these tests never ask for stacks.
            OdlsEvent::Stacks { .. } => panic!("stacks nobody asked for: {ev:?}"),
            // Their procs get no PMI connection.
            OdlsEvent::PmiData { .. } | OdlsEvent::PmiClosed { .. } => panic!("PMI nobody asked for: {ev:?}"),
        };
        let p = self.procs.entry((jobid, rank)).or_default();
        let started = p.pid.is_some();
        assert!(!p.done(), "event after the proc's last event: {ev:?}");
        match ev {
            OdlsEvent::Started { pid, .. } => {
                assert!(!started, "second Started: {ev:?}");
                p.pid = Some(*pid);
            }
            OdlsEvent::Output { stream, data, .. } => {
                assert!(started, "Output before Started: {ev:?}");
                assert!(!p.closed.contains(stream), "Output after OutputClosed: {ev:?}");
                assert!(!data.is_empty() && data.len() <= dvmd::odls::IOF_CHUNK, "chunk of {} bytes", data.len());
                match stream {
                    Stream::Stdout => p.out.extend_from_slice(data),
                    Stream::Stderr => p.err.extend_from_slice(data),
                }
            }
            OdlsEvent::OutputClosed { stream, .. } => {
                assert!(started, "OutputClosed before Started: {ev:?}");
                assert!(p.closed.insert(*stream), "second OutputClosed: {ev:?}");
            }
            OdlsEvent::Exited { pid, status, .. } => {
                assert_eq!(Some(*pid), p.pid, "Exited for another pid: {ev:?}");
                assert_eq!(p.closed.len(), 2, "Exited before both streams closed: {ev:?}");
                p.status = Some(*status);
            }
            OdlsEvent::LaunchFailed { error, .. } => {
                assert!(!started, "LaunchFailed after Started: {ev:?}");
                p.failed = Some(error.clone());
            }
            OdlsEvent::Stacks { .. } | OdlsEvent::PmiData { .. } | OdlsEvent::PmiClosed { .. } => {
                unreachable!("refused above")
            }
        }
    }

    /// Read events until every listed proc has had its last event.
    pub async fn wait_done(&mut self, procs: &[(u32, u32)]) {
        while !procs.iter().all(|k| self.procs.get(k).is_some_and(|p| p.done())) {
            self.next().await;
        }
    }

    /// Read events until the proc's stdout contains `needle`.
    pub async fn wait_stdout(&mut self, key: (u32, u32), needle: &str) {
        while !self.procs.get(&key).is_some_and(|p| p.stdout().contains(needle)) {
            assert!(!self.procs.get(&key).is_some_and(|p| p.done()), "{key:?} ended before printing {needle:?}");
            self.next().await;
        }
    }

    /// Spawn and run one proc to its end.
    pub async fn run(&mut self, spec: ProcSpec) -> &ProcLog {
        let key = (spec.jobid, spec.rank);
        self.odls.spawn(spec);
        self.wait_done(&[key]).await;
        &self.procs[&key]
    }

    pub async fn exit_of(&mut self, spec: ProcSpec) -> ExitKind {
        let key = (spec.jobid, spec.rank);
        self.odls.spawn(spec);
        self.run_to_end(key).await
    }

    /// Read events until the (started) proc exits; its exit.
    pub async fn run_to_end(&mut self, key: (u32, u32)) -> ExitKind {
        self.wait_done(&[key]).await;
        let p = &self.procs[&key];
        p.status.unwrap_or_else(|| panic!("{key:?} failed to launch: {:?}", p.failed))
    }

    pub async fn launch_error(&mut self, spec: ProcSpec) -> String {
        let p = self.run(spec).await;
        assert!(p.pid.is_none() && p.status.is_none(), "expected a launch failure, got {p:?}");
        p.failed.clone().unwrap()
    }
}

/// A scratch directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "odls-test-{}-{tag}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p.canonicalize().unwrap())
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
    pub fn file(&self, name: &str, content: &[u8], mode: u32) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = self.0.join(name);
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(&p, content).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Deterministic pseudo-random bytes (xorshift64*), for stdin payloads.
pub fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
        })
        .collect()
}

/// The state letter of /proc/<pid>/stat ('Z' for a zombie), or None if gone.
pub fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next())
}
