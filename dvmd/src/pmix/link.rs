//! The daemon's side of its PMIx worker (see [`super::worker`]): starting it, calling it,
//! turning its events into [`HostEvent`]s for the actor, and ending it.
//!
//! Calls are synchronous round trips on the command socket, made from the actor like the
//! libpmix calls they stand for (each is sub-millisecond; `Init` is 15–40 ms and is written at
//! once but read only when the first job needs the server, so a start overlaps other work).
//! Completions are written and not answered. A worker that takes longer than
//! [`WORKER_OP_TIMEOUT`] plus a slack to answer or to take a command breaks the link: the actor
//! is never held longer than that, even by a stopped worker.
//! Events are read by a thread and posted, tagged with the worker's generation, into the
//! actor's channel. A reply handle completes at most once; dropped, it fails its upcall
//! (`PMIX_ERROR`), so no client is left blocked; a reply for a worker that is gone is a no-op.

use std::io::{BufReader, BufWriter};
use std::os::fd::AsRawFd;
use std::os::fd::IntoRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use dvm_proto::pmixworker::{self as wire, worker_cmd::Body as Cmd, worker_event::Body as Ev, WorkerCmd, WorkerReply};
use nix::sys::signal::Signal;
use pmix_shim::{JobInfo, ProcId, Rank, ServerConfig, Status};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::frame::{read_frame, write_frame};

/// What the daemon learns from its worker.
#[derive(Debug)]
pub(crate) enum HostEvent {
    ClientConnected {
        proc: ProcId,
        reply: WorkerReplyHandle,
    },
    ClientFinalized {
        proc: ProcId,
        reply: WorkerReplyHandle,
    },
    Abort {
        proc: ProcId,
        status: Status,
        message: String,
        reply: WorkerReplyHandle,
    },
    FenceNb(FenceUpcall),
    DirectModex {
        proc: ProcId,
        reply: WorkerReplyHandle,
    },
    Log {
        client: ProcId,
        text: Option<String>,
        reply: WorkerReplyHandle,
    },
    JobControl {
        reply: WorkerReplyHandle,
    },
    DmodexData {
        request: u64,
        status: Status,
        data: Bytes,
    },
    /// PMIx_Spawn: the requesting proc and the request as the worker copied it.
    Spawn {
        proc: ProcId,
        spawn: wire::Spawn,
        reply: WorkerReplyHandle,
    },
    /// PMIx_Connect (`connect`) or PMIx_Disconnect: every participant; complete when all have
    /// arrived everywhere.
    Connect {
        connect: bool,
        procs: Vec<ProcId>,
        timeout: Option<i32>,
        reply: WorkerReplyHandle,
    },
    /// PMIx_Publish, PMIx_Lookup, PMIx_Unpublish: the data server's requests.
    Data {
        op: dvm_proto::daemon::DataOp,
        proc: ProcId,
        keys: Vec<String>,
        info: Vec<pmix_shim::Info>,
        reply: WorkerReplyHandle,
    },
    /// PMIx_Query_info that libpmix could not answer itself; complete with an `InfoResult`.
    Query {
        queries: Vec<pmix_shim::Query>,
        reply: WorkerReplyHandle,
    },
    /// PMIx_Group_construct / _destruct: every local member arrived (see
    /// [`pmix_shim::PmixEvent::Group`]).
    Group {
        op: pmix_shim::GroupOp,
        id: String,
        procs: Vec<ProcId>,
        directives: Vec<pmix_shim::Info>,
        reply: WorkerReplyHandle,
    },
    NspaceDeregistered {
        nspace: String,
        status: Status,
    },
    /// A client's PMIx_Notify_event for procs beyond its server (see
    /// [`pmix_shim::PmixEvent::Notify`]).
    Notify {
        event: wire::Notify,
    },
    /// A client registered for system event codes.
    RegisterEvents {
        codes: Vec<Status>,
    },
    /// The worker's event stream ended: it exited or was killed.
    Ended {
        how: String,
    },
}

impl HostEvent {
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            HostEvent::ClientConnected { .. } => "client_connected",
            HostEvent::ClientFinalized { .. } => "client_finalized",
            HostEvent::Abort { .. } => "abort",
            HostEvent::FenceNb(_) => "fence_nb",
            HostEvent::DirectModex { .. } => "direct_modex",
            HostEvent::Log { .. } => "log",
            HostEvent::JobControl { .. } => "job_control",
            HostEvent::DmodexData { .. } => "dmodex_data",
            HostEvent::Spawn { .. } => "spawn",
            HostEvent::Connect { connect: true, .. } => "connect",
            HostEvent::Connect { connect: false, .. } => "disconnect",
            HostEvent::Data { .. } => "data_server",
            HostEvent::Query { .. } => "query",
            HostEvent::Group { op: pmix_shim::GroupOp::Construct, .. } => "group_construct",
            HostEvent::Group { op: pmix_shim::GroupOp::Destruct, .. } => "group_destruct",
            HostEvent::NspaceDeregistered { .. } => "nspace_deregistered",
            HostEvent::Notify { .. } => "notify_event",
            HostEvent::RegisterEvents { .. } => "register_events",
            HostEvent::Ended { .. } => "worker_ended",
        }
    }
}

/// A `fence_nb` upcall: every local participant contributed.
#[derive(Debug)]
pub(crate) struct FenceUpcall {
    pub procs: Vec<ProcId>,
    /// `PMIX_COLLECT_DATA`, false when absent (never inferred from the data).
    pub collect: bool,
    /// `PMIX_TIMEOUT` in seconds, if given.
    pub timeout: Option<i32>,
    /// `pmix.loc.col.st`, if given: non-zero means a local participant died.
    pub local_status: Option<Status>,
    pub data: Bytes,
    pub reply: WorkerReplyHandle,
}

/// Errors of the link to a worker.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("cannot start the PMIx worker process: {0}")]
    Spawn(std::io::Error),
    #[error("the PMIx worker (pid {pid}) stopped answering: {source}")]
    Link { pid: u32, source: std::io::Error },
    #[error("the PMIx worker (pid {pid}) is gone")]
    Gone { pid: u32 },
    #[error("{0}")]
    Pmix(String),
}

/// The command socket of one worker, shared by the actor and the reply handles.
#[derive(Debug)]
pub(crate) struct WorkerLink {
    pid: u32,
    io: Mutex<Option<(BufReader<UnixStream>, BufWriter<UnixStream>)>>,
}

impl WorkerLink {
    /// One command and its answer (the lock held across both: answers come in order).
    fn call(&self, body: Cmd) -> Result<WorkerReply, WorkerError> {
        self.exchange(Some(body), true)?.ok_or(WorkerError::Gone { pid: self.pid })
    }

    /// Write a command without reading anything: a `Complete` (which the worker never
    /// answers), or `Init`, whose answer [`WorkerLink::finish`] reads later.
    fn post(&self, body: Cmd) -> Result<(), WorkerError> {
        self.exchange(Some(body), false).map(drop)
    }

    /// Read the answer to a command posted earlier.
    fn finish(&self) -> Result<WorkerReply, WorkerError> {
        self.exchange(None, true)?.ok_or(WorkerError::Gone { pid: self.pid })
    }

    /// Write `cmd` (if any), then read one answer (if `answer`). Any failure of the stream
    /// closes the link for good: a half-written or half-read frame cannot be resynchronized.
    fn exchange(&self, cmd: Option<Cmd>, answer: bool) -> Result<Option<WorkerReply>, WorkerError> {
        let mut io = self.io.lock().unwrap_or_else(|e| e.into_inner());
        let Some((r, w)) = io.as_mut() else { return Err(WorkerError::Gone { pid: self.pid }) };
        let mut got = cmd.map_or(Ok(()), |body| write_frame(w, &WorkerCmd { body: Some(body) })).map(|()| None);
        if answer {
            got = got.and_then(|_| read_frame::<WorkerReply>(r));
        }
        match got {
            Ok(Some(reply)) if !reply.error.is_empty() => Err(WorkerError::Pmix(reply.error)),
            Ok(Some(reply)) => Ok(Some(reply)),
            Ok(None) if !answer => Ok(None),
            Ok(None) => {
                // The worker closed its end between frames: it exited.
                *io = None;
                Err(WorkerError::Gone { pid: self.pid })
            }
            Err(source) => {
                *io = None;
                Err(WorkerError::Link { pid: self.pid, source })
            }
        }
    }

    fn close(&self) {
        *self.io.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// An upcall waiting for the daemon's answer, in a worker.
#[must_use = "an uncompleted reply leaves a client blocked until it is dropped (then it fails)"]
#[derive(Debug)]
pub(crate) struct WorkerReplyHandle {
    id: u64,
    link: Option<Arc<WorkerLink>>,
}

impl WorkerReplyHandle {
    /// Complete with a status.
    pub fn complete(self, status: Status) {
        self.complete_with(status, &[]);
    }

    /// Complete with a status and infos (a query's answers, a group's context id).
    pub fn complete_with_info(self, status: Status, infos: &[pmix_shim::Info]) {
        use dvm_proto::Message;
        let result = wire::InfoResult { infos: super::value::infos_to_wire(infos) };
        self.complete_with(status, &result.encode_to_vec());
    }

    /// Complete with a status and data (a fence's result, a peer's modex blob).
    pub fn complete_with(mut self, status: Status, data: &[u8]) {
        self.send(status, data);
    }

    fn send(&mut self, status: Status, data: &[u8]) {
        let Some(link) = self.link.take() else { return };
        if self.id == 0 {
            return;
        }
        let cmd = Cmd::Complete(wire::Complete { reply: self.id, status, data: Bytes::copy_from_slice(data) });
        if let Err(e) = link.post(cmd) {
            debug!(reply = self.id, "PMIx reply not delivered: {e}");
        }
    }
}

impl Drop for WorkerReplyHandle {
    fn drop(&mut self) {
        if self.link.is_some() {
            warn!(reply = self.id, "PMIx reply dropped without completion; completing with PMIX_ERROR");
            self.send(pmix_shim::ERROR, &[]);
        }
    }
}

/// Channel items: the worker generation an event came from, and the event.
pub(crate) type EventTx = mpsc::UnboundedSender<(u64, HostEvent)>;

/// A worker's process: started by exec (`dvmd --pmix-worker`), or forked at the daemon's
/// start ([`prefork`]).
enum WorkerProc {
    Spawned(Child),
    Forked { pid: u32, status: Option<ExitStatus> },
}

impl WorkerProc {
    fn id(&self) -> u32 {
        match self {
            WorkerProc::Spawned(c) => c.id(),
            WorkerProc::Forked { pid, .. } => *pid,
        }
    }

    fn kill(&mut self) {
        match self {
            WorkerProc::Spawned(c) => {
                let _ = c.kill();
            }
            // Never after it was reaped: the pid may be someone else's by then.
            WorkerProc::Forked { pid, status: None } => {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid as i32), Signal::SIGKILL);
            }
            WorkerProc::Forked { .. } => {}
        }
    }

    fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        match self {
            WorkerProc::Spawned(c) => c.try_wait(),
            WorkerProc::Forked { pid, status } => {
                if status.is_none() {
                    *status = reap(*pid, false)?;
                }
                Ok(*status)
            }
        }
    }

    fn wait(&mut self) -> std::io::Result<ExitStatus> {
        match self {
            WorkerProc::Spawned(c) => c.wait(),
            WorkerProc::Forked { pid, status } => {
                if status.is_none() {
                    *status = reap(*pid, true)?;
                }
                status.ok_or_else(|| std::io::Error::other("waitpid returned no status"))
            }
        }
    }
}

/// `waitpid` on one child of this process (blocking or not); its status once it has ended.
fn reap(pid: u32, block: bool) -> std::io::Result<Option<ExitStatus>> {
    let mut raw = 0;
    loop {
        // SAFETY: waitpid on a pid this process forked and has not reaped yet.
        let r = unsafe { libc::waitpid(pid as i32, &mut raw, if block { 0 } else { libc::WNOHANG }) };
        match r {
            0 => return Ok(None),
            r if r > 0 => return Ok(Some(ExitStatus::from_raw(raw))),
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
}

/// The worker forked at the daemon's start, not yet taken by [`Worker::spawn`].
struct Preforked {
    pid: u32,
    cmd: UnixStream,
    ev: UnixStream,
    /// The server directory of the `Init` already sent ([`init_preforked`]), if one was.
    init: Option<PathBuf>,
}

static PREFORKED: Mutex<Option<Preforked>> = Mutex::new(None);

/// Fork the daemon's first PMIx worker now, while the process has a single thread, so that
/// worker costs a fork instead of an exec of dvmd (loading its libraries and starting it
/// again: about half of what a worker's start costs). It runs [`super::worker::run`] on its
/// ends of two socket pairs and waits for its `Init`; `Worker::spawn` takes it. Call before
/// any thread exists (the tokio runtime, a reader thread), with SIGINT/SIGTERM still blocked
/// (the worker keeps them blocked, as one started by exec does).
pub fn prefork() -> std::io::Result<()> {
    let (cmd_ours, cmd_theirs) = UnixStream::pair()?;
    let (ev_ours, ev_theirs) = UnixStream::pair()?;
    // SAFETY: single-threaded (the caller's contract), so the child may run any code.
    match unsafe { nix::unistd::fork() }.map_err(std::io::Error::from)? {
        nix::unistd::ForkResult::Child => {
            drop((cmd_ours, ev_ours));
            // What the exec'd worker gets: no stdin, no stdout (the daemon's may be the pipe
            // the secret came on, or srun's); stderr shared with the daemon.
            if let Ok(null) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null") {
                let _ = nix::unistd::dup2(null.as_raw_fd(), 0);
                let _ = nix::unistd::dup2(null.as_raw_fd(), 1);
            }
            let code = super::worker::run(cmd_theirs.into_raw_fd(), ev_theirs.into_raw_fd());
            std::process::exit(code.into())
        }
        nix::unistd::ForkResult::Parent { child } => {
            drop((cmd_theirs, ev_theirs));
            let pid = child.as_raw() as u32;
            debug!(pid, "PMIx worker forked ahead");
            *PREFORKED.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(Preforked { pid, cmd: cmd_ours, ev: ev_ours, init: None });
            Ok(())
        }
    }
}

/// Send the preforked worker its `Init` now, so that its server starts while the daemon still
/// waits for something else (its secret, which Slurm's srun passes on only once every task of
/// the step has started). [`Worker::spawn`] with the same configuration then takes the worker
/// with its server starting or up and reads the `Init` reply as if it had sent it. Nothing
/// happens if no worker was forked ahead; a worker that cannot take the command is ended (the
/// first job then starts one by exec).
pub fn init_preforked(cfg: &ServerConfig) {
    let mut slot = PREFORKED.lock().unwrap_or_else(|e| e.into_inner());
    let Some(p) = slot.as_mut() else { return };
    if p.init.is_some() {
        return;
    }
    match write_frame(&mut &p.cmd, &WorkerCmd { body: Some(init_cmd(cfg)) }) {
        Ok(()) => {
            debug!(pid = p.pid, tmpdir = %cfg.tmpdir.display(), "PMIx worker told to start its server ahead");
            p.init = Some(cfg.tmpdir.clone());
        }
        Err(e) => {
            warn!(pid = p.pid, "cannot start the preforked PMIx worker's server ahead: {e}; ending it");
            drop(slot);
            discard_preforked();
        }
    }
}

/// The preforked worker for a server configured as `cfg`, if one is waiting and still alive
/// (one that ended is reaped here, one started ahead for another directory is ended).
fn take_preforked(cfg: &ServerConfig) -> Option<Preforked> {
    let p = PREFORKED.lock().unwrap_or_else(|e| e.into_inner()).take()?;
    if p.init.as_ref().is_some_and(|dir| *dir != cfg.tmpdir) {
        warn!(pid = p.pid, "the preforked PMIx worker was started for another directory; starting another");
        p.end();
        return None;
    }
    match reap(p.pid, false) {
        Ok(None) => Some(p),
        Ok(Some(st)) => {
            warn!(pid = p.pid, "the preforked PMIx worker ended before its first job ({st}); starting another");
            None
        }
        Err(e) => {
            warn!(pid = p.pid, "cannot check the preforked PMIx worker: {e}; starting another");
            None
        }
    }
}

/// End a preforked worker nobody took (the daemon ends without having needed a server, or
/// failed before it could): killed and reaped here, not left to whoever adopts it.
pub fn discard_preforked() {
    if let Some(p) = PREFORKED.lock().unwrap_or_else(|e| e.into_inner()).take() {
        p.end();
    }
}

impl Preforked {
    /// Kill and reap it.
    fn end(self) {
        drop((self.cmd, self.ev));
        let mut proc = WorkerProc::Forked { pid: self.pid, status: None };
        proc.kill();
        let _ = proc.wait();
    }
}

/// The command that starts a worker's server as `cfg` says.
fn init_cmd(cfg: &ServerConfig) -> Cmd {
    Cmd::Init(wire::Init {
        tmpdir: cfg.tmpdir.display().to_string(),
        hostname: cfg.hostname.clone().unwrap_or_default(),
        share_topology: cfg.share_topology,
        op_timeout_ms: cfg.op_timeout.as_millis() as u64,
    })
}

/// A running worker process.
pub(crate) struct Worker {
    pub gen: u64,
    link: Arc<WorkerLink>,
    proc: WorkerProc,
    tmpdir: PathBuf,
    /// The `Init` reply is still to be read.
    init_pending: bool,
    /// The worker's RSS the first time it was idle after a job: what a worker costs once its
    /// server has served anyone (libpmix's first client costs ~1.5 MiB, once). What it keeps
    /// of each later client shows as growth beyond this.
    baseline_kib: Option<u64>,
}

/// How long a worker may take to finalize once told to end, before it is killed.
pub(crate) const WORKER_GRACE: Duration = Duration::from_secs(2);

/// Bound on each libpmix call a worker makes (register, setup_fork, deregister: all measured
/// well under 50 ms here).
pub(crate) const WORKER_OP_TIMEOUT: Duration = Duration::from_secs(10);

/// What the link waits beyond the op timeout before it declares the worker stuck.
const LINK_SLACK: Duration = Duration::from_secs(5);

impl Worker {
    /// Start a worker and ask it to start its server with `cfg` (the answer is read by
    /// [`Worker::ready`]). Its events arrive on `events`, tagged with `gen`.
    pub fn spawn(cfg: &ServerConfig, gen: u64, events: EventTx) -> Result<Worker, WorkerError> {
        let (proc, cmd_ours, ev_ours, init_sent) = match take_preforked(cfg) {
            Some(p) => (WorkerProc::Forked { pid: p.pid, status: None }, p.cmd, p.ev, p.init.is_some()),
            None => {
                let (proc, cmd, ev) = Self::exec()?;
                (proc, cmd, ev, false)
            }
        };
        Self::link_up(cfg, gen, events, proc, cmd_ours, ev_ours, init_sent)
    }

    /// Start a worker by exec (`dvmd --pmix-worker CMD_FD,EVENT_FD`).
    fn exec() -> Result<(WorkerProc, UnixStream, UnixStream), WorkerError> {
        let (cmd_ours, cmd_theirs) = UnixStream::pair().map_err(WorkerError::Spawn)?;
        let (ev_ours, ev_theirs) = UnixStream::pair().map_err(WorkerError::Spawn)?;
        // The worker stays in its daemon's process group, so whatever kills the DVM's group
        // (a one-shot `prun` tearing its DVM down) kills the worker too, before the session
        // directories are swept; it holds SIGINT/SIGTERM blocked from dvmd's first
        // instruction, so a terminal's Ctrl-C reaches the daemon, which ends it in order.
        let mut c = super::worker::command(
            std::path::Path::new("/proc/self/exe"),
            cmd_theirs.as_raw_fd(),
            ev_theirs.as_raw_fd(),
        );
        let child = c.spawn().map_err(WorkerError::Spawn)?;
        drop((cmd_theirs, ev_theirs));
        Ok((WorkerProc::Spawned(child), cmd_ours, ev_ours))
    }

    /// The daemon's side of a started worker: its command link, its event thread, its `Init`
    /// (unless `init_sent`: then only its reply is still to be read).
    fn link_up(
        cfg: &ServerConfig,
        gen: u64,
        events: EventTx,
        mut proc: WorkerProc,
        cmd_ours: UnixStream,
        ev_ours: UnixStream,
        init_sent: bool,
    ) -> Result<Worker, WorkerError> {
        let pid = proc.id();
        // A worker stuck inside libpmix (or stopped) must not hold the actor for ever: every
        // libpmix call it makes is bounded by the op timeout, so an answer later than that, or
        // a command it does not take in that time, means it is stuck; the link then breaks.
        let bound = Some(cfg.op_timeout + LINK_SLACK);
        let setup = cmd_ours.try_clone().and_then(|reader| {
            reader.set_read_timeout(bound)?;
            cmd_ours.set_write_timeout(bound)?;
            Ok(reader)
        });
        let reader = match setup {
            Ok(r) => r,
            Err(e) => {
                // Nothing this daemon starts is left running.
                proc.kill();
                let _ = proc.wait();
                return Err(WorkerError::Spawn(e));
            }
        };
        let link =
            Arc::new(WorkerLink { pid, io: Mutex::new(Some((BufReader::new(reader), BufWriter::new(cmd_ours)))) });
        let events_link = link.clone();
        let thread = std::thread::Builder::new()
            .name(format!("pmix-worker-{gen}"))
            .spawn(move || read_events(ev_ours, events_link, gen, events));
        if let Err(e) = thread {
            proc.kill();
            let _ = proc.wait();
            return Err(WorkerError::Spawn(e));
        }
        let worker = Worker {
            gen,
            link: link.clone(),
            proc,
            tmpdir: cfg.tmpdir.clone(),
            init_pending: true,
            baseline_kib: None,
        };
        if !init_sent {
            // A failed write breaks the link: the caller's ready() then reports it, and the
            // caller retires (ends, and if need be kills) the worker.
            let _ = link.post(init_cmd(cfg));
        }
        Ok(worker)
    }

    pub fn pid(&self) -> u32 {
        self.link.pid
    }

    /// Wait for the server's start (once); the libpmix version it reports.
    pub fn ready(&mut self) -> Result<Option<String>, WorkerError> {
        if !self.init_pending {
            return Ok(None);
        }
        self.init_pending = false;
        let reply = self.link.finish()?;
        Ok(Some(reply.version))
    }

    /// Resident set size of the worker (Linux), if it is still running.
    pub fn rss_kib(&self) -> Option<u64> {
        crate::sys::rss_kib_of(&format!("/proc/{}/status", self.pid()))
    }

    /// Call when no job uses the worker: what it holds beyond its size the first time this was
    /// called (0 that first time).
    pub fn idle_growth_kib(&mut self) -> u64 {
        let rss = self.rss_kib().unwrap_or(0);
        let base = *self.baseline_kib.get_or_insert(rss);
        rss.saturating_sub(base)
    }

    pub fn register_nspace(&self, nspace: &str, n_local: u32, job: &JobInfo) -> Result<(), WorkerError> {
        let cmd = wire::RegisterNspace {
            nspace: nspace.into(),
            n_local,
            node_map: job.node_map.clone(),
            proc_map: job.proc_map.iter().map(|r| wire::RankList { ranks: r.clone() }).collect(),
            job_size: job.job_size,
            universe_size: job.universe_size,
            appnum: job.appnum,
            jobid: job.jobid.clone().unwrap_or_default(),
        };
        self.link.call(Cmd::RegisterNspace(cmd)).map(drop)
    }

    /// `register_client` of every local rank of a job, before any of them starts.
    pub fn register_clients(&self, nspace: &str, ranks: Vec<u32>, uid: u32, gid: u32) -> Result<(), WorkerError> {
        let cmd = wire::RegisterClients { nspace: nspace.into(), ranks, uid, gid };
        self.link.call(Cmd::RegisterClients(cmd)).map(drop)
    }

    /// `register_client` (unless `registered` by [`Worker::register_clients`]) + `setup_fork`
    /// of one local rank: its PMIx environment.
    pub fn prepare_client(
        &self,
        nspace: &str,
        rank: u32,
        uid: u32,
        gid: u32,
        registered: bool,
    ) -> Result<Vec<(String, String)>, WorkerError> {
        let cmd = wire::PrepareClient { nspace: nspace.into(), rank, uid, gid, registered };
        let reply = self.link.call(Cmd::PrepareClient(cmd))?;
        Ok(reply.env.into_iter().map(|v| (v.key, v.value)).collect())
    }

    pub fn deregister_nspace_nb(&self, nspace: &str) -> Result<(), WorkerError> {
        self.link.call(Cmd::DeregisterNspace(wire::DeregisterNspace { nspace: nspace.into() })).map(drop)
    }

    /// Hand an event to the worker's server (PMIx_Notify_event): its registered clients in
    /// range get it.
    pub fn notify(&self, event: wire::Notify) -> Result<(), WorkerError> {
        self.link.call(Cmd::Notify(event)).map(drop)
    }

    /// Ask for a local proc's modex blob; the id its [`HostEvent::DmodexData`] will carry.
    pub fn dmodex_request(&self, nspace: &str, rank: u32) -> Result<u64, WorkerError> {
        let reply = self.link.call(Cmd::DmodexRequest(wire::DmodexRequest { nspace: nspace.into(), rank }))?;
        Ok(reply.request)
    }

    /// End the worker: close its command stream (it finalizes its server and exits), kill it
    /// if it has not ended within [`WORKER_GRACE`], reap it and remove its directory. Runs on a
    /// thread; join the handle to wait for it.
    /// `hurry` set (now or later): kill it at once instead (the daemon itself is ending: nothing
    /// the worker holds matters any more, and the daemon must not outlast its HNP's patience).
    pub fn retire(self, hurry: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
        let Worker { link, proc: mut child, tmpdir, gen, .. } = self;
        link.close();
        std::thread::spawn(move || {
            let pid = child.id();
            let deadline = Instant::now() + WORKER_GRACE;
            let status = loop {
                let late = Instant::now() >= deadline;
                match child.try_wait() {
                    Ok(Some(st)) => break Some(st),
                    Ok(None) if !late && !hurry.load(Ordering::Relaxed) => std::thread::sleep(Duration::from_millis(5)),
                    Ok(None) => {
                        if late {
                            warn!(pid, gen, "PMIx worker did not end within {WORKER_GRACE:?}; killing it");
                        }
                        child.kill();
                        break child.wait().ok();
                    }
                    Err(e) => {
                        warn!(pid, gen, "cannot wait for the PMIx worker: {e}");
                        break None;
                    }
                }
            };
            debug!(pid, gen, ?status, "PMIx worker ended");
            let _ = std::fs::remove_dir_all(&tmpdir);
        })
    }
}

fn proc_from(p: Option<wire::Proc>) -> ProcId {
    let p = p.unwrap_or_default();
    ProcId::new(p.nspace, Rank::from_raw(p.rank))
}

/// The event thread of one worker: every frame becomes a [`HostEvent`]; the end of the
/// stream becomes [`HostEvent::Ended`].
fn read_events(sock: UnixStream, link: Arc<WorkerLink>, gen: u64, tx: EventTx) {
    let mut r = BufReader::new(sock);
    let how = loop {
        let ev = match read_frame::<wire::WorkerEvent>(&mut r) {
            Ok(Some(ev)) => ev,
            Ok(None) => break "its event stream ended".to_string(),
            Err(e) => break format!("its event stream broke: {e}"),
        };
        let reply = WorkerReplyHandle { id: ev.reply, link: (ev.reply != 0).then(|| link.clone()) };
        let event = match ev.body {
            Some(Ev::ClientConnected(p)) => HostEvent::ClientConnected { proc: proc_from(Some(p)), reply },
            Some(Ev::ClientFinalized(p)) => HostEvent::ClientFinalized { proc: proc_from(Some(p)), reply },
            Some(Ev::Abort(a)) => {
                HostEvent::Abort { proc: proc_from(a.proc), status: a.status, message: a.message, reply }
            }
            Some(Ev::Fence(f)) => HostEvent::FenceNb(FenceUpcall {
                procs: f.procs.into_iter().map(|p| proc_from(Some(p))).collect(),
                collect: f.collect,
                timeout: (f.timeout != 0).then_some(f.timeout),
                local_status: f.has_local_status.then_some(f.local_status),
                data: f.data,
                reply,
            }),
            Some(Ev::DirectModex(p)) => HostEvent::DirectModex { proc: proc_from(Some(p)), reply },
            Some(Ev::Log(l)) => {
                HostEvent::Log { client: proc_from(l.client), text: l.has_text.then_some(l.text), reply }
            }
            Some(Ev::JobControl(_)) => HostEvent::JobControl { reply },
            Some(Ev::DmodexData(d)) => HostEvent::DmodexData { request: d.request, status: d.status, data: d.data },
            Some(Ev::NspaceDeregistered(n)) => HostEvent::NspaceDeregistered { nspace: n.nspace, status: n.status },
            Some(Ev::Spawn(sp)) => HostEvent::Spawn { proc: proc_from(sp.proc.clone()), spawn: sp, reply },
            Some(Ev::Connect(set)) => HostEvent::Connect {
                connect: true,
                procs: set.procs.into_iter().map(|p| proc_from(Some(p))).collect(),
                timeout: (set.timeout > 0).then_some(set.timeout),
                reply,
            },
            Some(Ev::Disconnect(set)) => HostEvent::Connect {
                connect: false,
                procs: set.procs.into_iter().map(|p| proc_from(Some(p))).collect(),
                timeout: (set.timeout > 0).then_some(set.timeout),
                reply,
            },
            Some(Ev::Publish(p)) => HostEvent::Data {
                op: dvm_proto::daemon::DataOp::DataPublish,
                proc: proc_from(p.proc),
                keys: Vec::new(),
                info: super::value::infos_from_wire(&p.info),
                reply,
            },
            Some(Ev::Lookup(l)) => HostEvent::Data {
                op: dvm_proto::daemon::DataOp::DataLookup,
                proc: proc_from(l.proc),
                keys: l.keys,
                info: super::value::infos_from_wire(&l.info),
                reply,
            },
            Some(Ev::Unpublish(l)) => HostEvent::Data {
                op: dvm_proto::daemon::DataOp::DataUnpublish,
                proc: proc_from(l.proc),
                keys: l.keys,
                info: super::value::infos_from_wire(&l.info),
                reply,
            },
            Some(Ev::Query(q)) => HostEvent::Query {
                queries: q
                    .queries
                    .into_iter()
                    .map(|q| pmix_shim::Query {
                        keys: q.keys,
                        qualifiers: super::value::infos_from_wire(&q.qualifiers),
                    })
                    .collect(),
                reply,
            },
            Some(Ev::Group(g)) => HostEvent::Group {
                op: if g.construct { pmix_shim::GroupOp::Construct } else { pmix_shim::GroupOp::Destruct },
                id: g.id,
                procs: g.procs.into_iter().map(|p| proc_from(Some(p))).collect(),
                directives: super::value::infos_from_wire(&g.directives),
                reply,
            },
            Some(Ev::Notify(event)) => HostEvent::Notify { event },
            Some(Ev::RegisterEvents(r)) => HostEvent::RegisterEvents { codes: r.codes },
            None => {
                // Unknown to this daemon: fail the upcall rather than leave a client waiting.
                reply.complete(pmix_shim::ERR_NOT_SUPPORTED);
                continue;
            }
        };
        if tx.send((gen, event)).is_err() {
            return;
        }
    };
    let _ = tx.send((gen, HostEvent::Ended { how }));
}
