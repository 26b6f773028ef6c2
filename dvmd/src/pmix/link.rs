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
//! actor's channel. An upcall is answered by its reply id ([`Worker::complete`]); an answer
//! for a worker that is gone is a no-op.
//!
//! Split by concept: `process` (the worker's process and the prefork), `protocol` (the command
//! socket's request/reply), `host_event` (the event stream). This file
//! is [`Worker`]: starting one, its calls, ending it.

mod host_event;
mod process;
mod protocol;

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dvm_proto::pmixworker::{self as wire, worker_cmd::Body as Cmd};
use pmix_shim::{JobInfo, ServerConfig};
use tracing::{debug, warn};

use host_event::read_events;
pub(crate) use host_event::{EventTx, HostEvent};
pub use process::{discard_preforked, init_preforked, prefork};
use process::{init_cmd, take_preforked, WorkerProc};
pub use protocol::WorkerError;
use protocol::WorkerLink;

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
        let link = match WorkerLink::new(pid, reader, cmd_ours) {
            Ok(l) => Arc::new(l),
            Err(e) => {
                proc.kill();
                let _ = proc.wait();
                return Err(WorkerError::Spawn(e));
            }
        };
        let thread = std::thread::Builder::new()
            .name(format!("pmix-worker-{gen}"))
            .spawn(move || read_events(ev_ours, gen, events));
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

    /// `bound`: (rank, cpu list, locality) of each bound local rank (see [`JobStart::bound`]).
    pub fn register_nspace(
        &self,
        nspace: &str,
        n_local: u32,
        job: &JobInfo,
        bound: &[(u32, String, String)],
    ) -> Result<(), WorkerError> {
        let cmd = wire::RegisterNspace {
            nspace: nspace.into(),
            n_local,
            node_map: job.node_map.clone(),
            proc_map: job.proc_map.iter().map(|r| wire::RankList { ranks: r.clone() }).collect(),
            job_size: job.job_size,
            universe_size: job.universe_size,
            appnum: job.appnum,
            jobid: job.jobid.clone().unwrap_or_default(),
            places: bound
                .iter()
                .map(|(rank, cpus, locality)| wire::ProcPlace {
                    rank: *rank,
                    cpuset: format!("hwloc:{cpus}"),
                    locality: locality.clone(),
                })
                .collect(),
            apps: job
                .apps
                .iter()
                .map(|a| wire::AppDesc { first_rank: a.first_rank, argv: a.argv.clone(), wdir: a.wdir.clone() })
                .collect(),
            extra: job.extra.iter().filter_map(super::value::to_wire).collect(),
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

    /// Answer upcall `reply` (posted, not waited for; the bytes are handed on as they are: a
    /// fence's result may be tens of MiB). Reply id 0 asks for no answer.
    pub fn complete(&self, reply: u64, status: i32, data: bytes::Bytes) {
        if reply == 0 {
            return;
        }
        if let Err(e) = self.link.post(Cmd::Complete(wire::Complete { reply, status, data })) {
            debug!(reply, "PMIx reply not delivered: {e}");
        }
    }

    /// Ask for a local proc's modex blob; the id its `DmodexData` event will carry.
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
