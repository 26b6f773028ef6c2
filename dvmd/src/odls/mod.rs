//! odls: the daemon's local procs — fork/exec, reaping, signals, output forwarding under a
//! per-job window, and stdin.
//!
//! Owns: every proc this daemon started, tracked by pid until reaped. Reports everything as
//! [`OdlsEvent`]s on one channel; the actor (single-threaded, never blocks) calls the
//! methods and reads the events.
//! Never: decides job policy (which rank fails the job, 128+signo, tagging) — the caller does.
//!
//! Ordering, per proc: `Started` (or a lone `LaunchFailed`) comes first; `Output` events of one
//! stream are in byte order; each stream ends with one `OutputClosed`; `Exited` is the proc's
//! last event, after both `OutputClosed`, so the actor can forward all output before it reports
//! the exit. Nothing is ordered between different procs or between a proc's two streams.
//!
//! Invariants: a proc is signalled (always as its whole process group) only while it is not
//! reaped; it is reaped only after its output streams closed (the zombie keeps the pid from
//! being recycled — see `reap`). Output emitted and not acknowledged never exceeds the
//! window (see `iof`).
//!
//! Traps:
//! - PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, not the process:
//!   call `spawn` from the actor's own long-lived thread, never from `spawn_blocking`.
//! - Hence `spawn` starts the child inline: it returns once the child has exec'd (the
//!   vfork-style clone suspends the calling thread until then), which is what turns exec
//!   failures into `LaunchFailed` instead of exit 127.
//! - Every method that starts work spawns tokio tasks: call them inside the runtime.
//! - A proc whose background children keep its stdout open has not finished: `Exited` waits
//!   for their EOF (as in PRRTE); `kill_job` still reaches them through the process group.

mod cgroup;
mod exec;
mod iof;
mod pmi;
mod priority;
mod reap;
mod stacks;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::net::unix::pipe;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use iof::IofWindow;
pub use iof::CHUNK as IOF_CHUNK;
pub use priority::{RankPriority, RANK_PRIORITY_VAR};
use reap::Life;

pub use dvm_core::jobs::{ExitKind, ProcEvent as OdlsEvent, ProcSpec, Stream, TIMER_SLACK_VAR};

struct Proc {
    life: Arc<Life>,
    /// Queue of the stdin writer; `None` without a stdin pipe or after `close_stdin`.
    stdin: Option<mpsc::UnboundedSender<Bytes>>,
    /// Queue of its PMI connection's writer; `None` without one or after `pmi_close`.
    pmi: Option<mpsc::UnboundedSender<Bytes>>,
}

struct Job {
    procs: BTreeMap<u32, Proc>,
    window: Arc<IofWindow>,
}

/// The local procs of one daemon.
pub struct Odls {
    node: String,
    events: mpsc::UnboundedSender<OdlsEvent>,
    iof_window: usize,
    jobs: HashMap<u32, Job>,
    /// How procs run against this daemon (`--rank-priority`), unless a job says otherwise.
    priority: RankPriority,
    /// Per-job cpu groups, made when a proc first asks for `group`.
    groups: Groups,
    /// The DVM's name for its cpu groups (its HNP's address): the daemons of one DVM on one
    /// machine share a job's group.
    dvm: String,
}

/// Whether this daemon has per-job cpu groups.
enum Groups {
    Untried,
    Ready(cgroup::CpuGroups),
    /// It could not make them (said once): `group` runs procs under SCHED_IDLE.
    Unavailable,
}

impl Odls {
    /// `node` names this daemon in launch-failure sentences; `iof_window` (> 0) is the number of
    /// output bytes each job may have emitted and not yet acknowledged.
    pub fn new(node: String, events: mpsc::UnboundedSender<OdlsEvent>, iof_window: usize) -> Odls {
        assert!(iof_window > 0, "node {node}: the IOF window must be at least 1 byte");
        Odls {
            node,
            events,
            iof_window,
            jobs: HashMap::new(),
            priority: RankPriority::DEFAULT,
            groups: Groups::Untried,
            dvm: String::new(),
        }
    }

    /// How procs run against this daemon: when they spin on every core, its heartbeats,
    /// fences and launches still get the cpu first. Among themselves the procs keep equal
    /// shares, so an idle daemon costs them nothing. `dvm` names the DVM (its HNP's address):
    /// with `group`, its daemons on one machine put a job's procs in one cpu group.
    pub fn set_rank_priority(&mut self, p: RankPriority, dvm: &str) {
        self.priority = p;
        self.dvm = dvm.to_string();
    }

    /// Start a proc. Sends `Started` (before any of its other events) or `LaunchFailed`.
    /// Does not wait for the proc; forks inline (see the module traps). Starting a (job, rank)
    /// that is still live is a caller bug: refused with `LaunchFailed`, the running proc untouched.
    pub fn spawn(&mut self, spec: ProcSpec) {
        let (jobid, rank) = (spec.jobid, spec.rank);
        let priority = self.priority.for_proc(&spec.env);
        let has_groups = priority == Ok(RankPriority::Group) && self.has_groups();
        let fail = |why: String| OdlsEvent::LaunchFailed {
            jobid,
            rank,
            error: format!("node {}: cannot start rank {rank} of job {jobid}: {why}", self.node),
        };
        let window = self.iof_window;
        let job = self
            .jobs
            .entry(jobid)
            .or_insert_with(|| Job { procs: BTreeMap::new(), window: Arc::new(IofWindow::new(window)) });
        if job.procs.get(&rank).is_some_and(|p| p.life.is_live()) {
            let _ = self.events.send(fail("that rank is already running here".into()));
            return;
        }
        let child = priority.map(|p| p.child(has_groups));
        let launched = match child.and_then(|c| exec::launch(&spec, c).map(|l| (l, c))) {
            Ok(l) => l,
            Err(why) => {
                debug!(jobid, rank, "launch failed: {why}");
                let _ = self.events.send(fail(why));
                return;
            }
        };
        let (launched, child) = launched;
        let pid = launched.pid;
        if child.group {
            join_group(&mut self.groups, &spec, pid);
        }
        let life = Arc::new(Life::new(pid));
        let pipes = (|| -> std::io::Result<_> {
            let out = pipe::Receiver::from_owned_fd(launched.stdout)?;
            let err = pipe::Receiver::from_owned_fd(launched.stderr)?;
            let inp = launched.stdin.map(pipe::Sender::from_owned_fd).transpose()?;
            Ok((out, err, inp))
        })();
        let pmi_sock = match launched.pmi.map(pmi::Conn::new).transpose() {
            Ok(c) => c,
            Err(e) => {
                warn!(jobid, rank, pid, "cannot register the proc's PMI connection: {e}");
                None
            }
        };
        let (out, err, inp) = match pipes {
            Ok(p) => p,
            Err(e) => {
                // Cannot forward its I/O: it must not run. Still reaped by the task below.
                warn!(jobid, rank, pid, "cannot register the proc's pipes: {e}; killing it");
                life.signal_group(libc::SIGKILL);
                let _ = self.events.send(fail(format!("cannot register its output pipes: {e}")));
                let life = life.clone();
                tokio::spawn(async move {
                    life.reap().await;
                });
                return;
            }
        };
        let _ = self.events.send(OdlsEvent::Started { jobid, rank, pid: pid as u32 });
        debug!(jobid, rank, pid, "proc started");

        let stdin = inp.map(|tx| {
            let (qtx, qrx) = mpsc::unbounded_channel();
            tokio::spawn(iof::feed_stdin(tx, qrx, life.done.clone(), jobid, rank));
            qtx
        });
        let pmi = pmi_sock.map(|c| c.run(jobid, rank, self.events.clone()));
        let events = self.events.clone();
        let window = job.window.clone();
        let l = life.clone();
        let stamp = spec.timestamp;
        tokio::spawn(async move {
            let stdout = iof::pump(out, Stream::Stdout, jobid, rank, window.clone(), events.clone(), stamp);
            let stderr = iof::pump(err, Stream::Stderr, jobid, rank, window, events.clone(), stamp);
            tokio::join!(stdout, stderr, l.exited());
            let status = l.reap().await;
            debug!(jobid, rank, pid, ?status, "proc reaped");
            let _ = events.send(OdlsEvent::Exited { jobid, rank, pid: pid as u32, status });
        });
        job.procs.insert(rank, Proc { life, stdin, pmi });
    }

    /// Deliver `sig` to the process group of every live proc of the job.
    pub fn signal_job(&self, jobid: u32, sig: i32) {
        for life in self.live_procs(jobid) {
            life.signal_group(sig);
        }
    }

    /// SIGTERM (and SIGCONT, so a stopped proc sees it) to every live proc's group now; after
    /// `grace`, SIGKILL to those still not reaped and close the job's output window, discarding
    /// output nobody acked (a dead consumer must not keep the exits from being reported).
    pub fn kill_job(&mut self, jobid: u32, grace: Duration) {
        let lives: Vec<Arc<Life>> = self.live_procs(jobid).cloned().collect();
        let Some(window) = self.jobs.get(&jobid).map(|j| j.window.clone()) else { return };
        if lives.is_empty() {
            return;
        }
        for life in &lives {
            life.signal_group(libc::SIGTERM);
            life.signal_group(libc::SIGCONT);
        }
        let deadline = tokio::time::Instant::now() + grace;
        tokio::spawn(async move {
            for life in &lives {
                if tokio::time::timeout_at(deadline, life.done.cancelled()).await.is_err() {
                    break;
                }
            }
            if lives.iter().all(|l| !l.is_live()) {
                return;
            }
            for life in &lives {
                if life.signal_group(libc::SIGKILL) {
                    debug!(jobid, pid = life.pid, "proc outlived the grace period: SIGKILL");
                }
            }
            window.close();
        });
    }

    /// Queue bytes for the proc's stdin (written in order). Dropped quietly if the proc has
    /// no stdin pipe, its stdin was closed, or it is gone.
    pub fn write_stdin(&mut self, jobid: u32, rank: u32, data: Bytes) {
        match self.jobs.get(&jobid).and_then(|j| j.procs.get(&rank)).and_then(|p| p.stdin.as_ref()) {
            Some(q) => {
                let _ = q.send(data);
            }
            None => debug!(jobid, rank, len = data.len(), "stdin for a proc without stdin dropped"),
        }
    }

    /// Write bytes on the proc's PMI connection (in order; dropped once it is closed).
    pub fn pmi_write(&mut self, jobid: u32, rank: u32, data: Bytes) {
        if let Some(q) = self.jobs.get(&jobid).and_then(|j| j.procs.get(&rank)).and_then(|p| p.pmi.as_ref()) {
            let _ = q.send(data);
        }
    }

    /// Close our end of the proc's PMI connection once the queued bytes are written.
    pub fn pmi_close(&mut self, jobid: u32, rank: u32) {
        if let Some(p) = self.jobs.get_mut(&jobid).and_then(|j| j.procs.get_mut(&rank)) {
            p.pmi = None;
        }
    }

    /// EOF on the proc's stdin once the queued bytes are written.
    pub fn close_stdin(&mut self, jobid: u32, rank: u32) {
        if let Some(p) = self.jobs.get_mut(&jobid).and_then(|j| j.procs.get_mut(&rank)) {
            p.stdin = None;
        }
    }

    /// Credit for `bytes` of the job's output forwarded by the HNP (clamped to what is
    /// outstanding; unknown jobs are ignored).
    pub fn ack_output(&self, jobid: u32, bytes: usize) {
        if let Some(j) = self.jobs.get(&jobid) {
            let returned = j.window.ack(bytes);
            if returned < bytes {
                debug!(jobid, bytes, returned, "output ack exceeds what is outstanding");
            }
        }
    }

    /// Output bytes of the job emitted and not yet acknowledged (<= the window).
    pub fn unacked_output(&self, jobid: u32) -> usize {
        self.jobs.get(&jobid).map_or(0, |j| j.window.outstanding())
    }

    /// Procs of the job started and not yet reaped. A reaped proc's `Exited` may still be
    /// queued on the channel: count `Exited` events to know the job is done locally.
    pub fn live(&self, jobid: u32) -> usize {
        self.live_procs(jobid).count()
    }

    /// Forget a finished job (its window, stdin queues and cpu group). Any proc of it still
    /// live is SIGKILLed and its unread output discarded; its remaining events still arrive.
    pub fn forget_job(&mut self, jobid: u32) {
        if let Some(job) = self.jobs.remove(&jobid) {
            for p in job.procs.values() {
                p.life.signal_group(libc::SIGKILL);
            }
            job.window.close();
        }
        if let Groups::Ready(g) = &mut self.groups {
            g.forget(jobid);
        }
    }

    /// Whether this daemon has per-job cpu groups, making them on first use.
    fn has_groups(&mut self) -> bool {
        if let Groups::Untried = self.groups {
            self.groups = match cgroup::CpuGroups::create(&self.dvm) {
                Ok(g) => Groups::Ready(g),
                Err(why) => {
                    tracing::info!("node {}: no per-job cpu groups ({why}); ranks run under SCHED_IDLE", self.node);
                    Groups::Unavailable
                }
            };
        }
        matches!(self.groups, Groups::Ready(_))
    }

    /// Daemon exit: SIGKILL every live proc's group. Also done on drop.
    pub fn kill_all(&mut self) {
        for job in self.jobs.values() {
            for p in job.procs.values() {
                p.life.signal_group(libc::SIGKILL);
            }
        }
    }

    /// The stack traces of the job's live procs, answered by one `Stacks` event.
    pub fn dump_stacks(&self, id: u64, jobid: u32) {
        let procs: Vec<(u32, u32)> = self
            .jobs
            .get(&jobid)
            .into_iter()
            .flat_map(|j| j.procs.iter())
            .filter(|(_, p)| p.life.is_live())
            .map(|(&rank, p)| (rank, p.life.pid as u32))
            .collect();
        stacks::dump(self.node.clone(), id, jobid, procs, self.events.clone());
    }

    fn live_procs(&self, jobid: u32) -> impl Iterator<Item = &Arc<Life>> {
        self.jobs.get(&jobid).into_iter().flat_map(|j| j.procs.values()).map(|p| &p.life).filter(|l| l.is_live())
    }
}

/// Move a proc that has exec'd into its job's cpu group, else run it under SCHED_IDLE.
fn join_group(groups: &mut Groups, spec: &ProcSpec, pid: libc::pid_t) {
    let moved = match groups {
        Groups::Ready(g) => g.join(spec.jobid, pid),
        _ => Err("this daemon has no cpu groups".into()),
    };
    if let Err(why) = moved {
        debug!(pid, "rank {} of job {} runs under SCHED_IDLE: {why}", spec.rank, spec.jobid);
        let idle = priority::ChildPriority { group: false, idle: true, nicer: None };
        exec::lower_priority(pid, idle, spec);
    }
}

impl Drop for Odls {
    fn drop(&mut self) {
        self.kill_all();
    }
}
