//! The daemon as a PMIx host: every daemon runs libpmix's server in a worker process of its
//! own ([`worker`], driven through `link`), registers each job's namespace from the job map,
//! gives every local rank the environment `setup_fork` returns, and answers the upcalls from
//! its actor loop — never inside them.
//!
//! - fence_nb -> grpcomm fence: participants from the procs array (wildcard = every daemon
//!   hosting the job), movement from `PMIX_COLLECT_DATA` only, `PMIX_TIMEOUT` honoured; the
//!   k-th fence over a participant set is fence k (grpcomm numbers them).
//! - direct_modex -> asked of the daemon hosting the proc (routed on the tree), which answers
//!   with `PMIx_server_dmodex_request`.
//! - abort: reply first, then the job fails once the aborting rank has exited (the order that
//!   keeps libpmix healthy); log: the text reaches prun.
//! - spawn, connect/disconnect, publish/lookup/unpublish: `dynamic` (docs/dynamic-mpi.md).
//! - group construct/destruct (a grpcomm allgather / barrier over the members' daemons) and
//!   query: `group`.
//! - events: a client's event for other servers, and the DVM's own (a rank or a daemon
//!   lost), reach every daemon hosting a proc in range as one xcast: `events`.
//! - topology: libpmix discovers the node's hardware topology once, in `PMIx_server_init`;
//!   the daemon asks it to share it ([`share_topology`]), so every namespace carries it as
//!   job-level data and Open MPI 4.1's ranks adopt it instead of each discovering it again.
//!   The worker itself loads it from the user's topology cache ([`topo_cache`]) rather than
//!   discovering it, so a machine's topology is discovered once per boot and cgroup, not once per server.
//!
//! Why a worker process (libpmix 4.2.2, measured in docs/soak.md): the server never frees what
//! it holds for a client once the client has connected — not when it disconnects, not on
//! `deregister_client` or `deregister_nspace`; only `PMIx_server_finalize` does, and the server
//! cannot be started again in the same process (its listener is set up once per process). So
//! the server lives in a child process, and a worker that has grown by more than
//! [`PmixSettings::recycle_kib`] is ended when no job uses it and a fresh one started: the
//! daemon's memory stays flat however many jobs it serves. Ranks also use the hash store
//! ([`CLIENT_GDS`]), which makes libpmix keep far less per client than its shared-memory store.
//! A job may still choose with `-x PMIX_GDS_MODULE=...`.
//!
//! Shape: `PmixHost` is a plain struct the shell owns. The shell calls it (a job's launch,
//! a proc's exit, a fence's completion, a worker event) and drains what it asks of the daemon
//! core — fences to start, commands to other daemons — with `PmixHost::drain`, in order,
//! in the shell's one drain loop.
//!
//! Traps: a worker's upcall replies are only valid for that worker (events carry its
//! generation; a stale one is dropped, which fails its upcall); a worker is replaced only when
//! idle (no namespace, no fence, no direct modex in flight), never under a running job.

mod dynamic;
mod events;
mod frame;
mod group;
mod link;
pub mod topo_cache;
pub mod value;
pub mod worker;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use bytes::Bytes;
use dvm_core::Input as CoreInput;
use dvm_grpcomm::{FenceError, FenceRequest as GFence, FenceSignature, Participants};
use dvm_proto::daemon::{daemon_cmd, DmodexReq, DmodexResp, JobAbort, JobFail, JobLog};
use dvm_rml::Rank;
use pmix_shim::{JobInfo, ProcId, ServerConfig};
use tracing::{debug, error, info, warn};

use crate::jobmap::Placement;
pub use events::{event_payload, FROM_DVM};
pub use link::{discard_preforked, prefork};
pub(crate) use link::{EventTx, HostEvent};
use link::{FenceUpcall, Worker, WorkerReplyHandle};

/// What `auto` prices the first collecting fence over a set of procs with, per proc: Open
/// MPI 4.1's modex with the TCP BTL is 44–68 bytes a rank. Every daemon of the fence derives
/// the same hint from the procs array (or the job's size, for a wildcard).
pub(crate) const MODEX_BYTES_PER_PROC: u64 = 64;

/// One job's namespace on this daemon.
struct PmixJob {
    nspace: String,
    placement: Placement,
    registered: bool,
    /// Every local rank was registered with `register_client` when the job started.
    clients_registered: bool,
    connected: BTreeSet<u32>,
    finalized: BTreeSet<u32>,
    sigs: BTreeSet<FenceSignature>,
}

/// Who waits for a fence this daemon runs for libpmix (recorded when the fence starts).
#[derive(Debug)]
pub(crate) enum FenceWaiter {
    /// A fence, connect or disconnect upcall: completed with the fence's bytes.
    Upcall(WorkerReplyHandle),
    /// A group construct or destruct: its answer is derived from the fence's bytes.
    Group(group::GroupWait),
}

/// This daemon's PMIx hosting: its worker, the namespaces registered there and the upcalls
/// waiting for an answer.
pub(crate) struct PmixHost {
    me: Rank,
    host: String,
    /// None: this daemon hosts no PMIx server.
    settings: Option<PmixSettings>,
    events: EventTx,
    /// Generation of the last worker started.
    gen: u64,
    worker: Option<Worker>,
    /// Workers being ended (finalizing, or killed after a grace); joined at shutdown.
    retiring: Vec<std::thread::JoinHandle<()>>,
    /// Set at shutdown: workers still ending are killed at once.
    hurry: std::sync::Arc<std::sync::atomic::AtomicBool>,
    jobs: BTreeMap<u32, PmixJob>,
    by_nspace: BTreeMap<String, u32>,
    /// Fences this daemon runs for libpmix, by the key the core returns them with.
    fences: BTreeMap<u64, FenceWaiter>,
    /// Context ids this daemon offered so far (or the highest chosen, if larger): see
    /// [`group`].
    ctx_counter: u64,
    /// Direct modex requests this daemon asked of others (by our id).
    asked: BTreeMap<u64, WorkerReplyHandle>,
    /// Requests this daemon serves: worker request id -> (asking daemon, its id).
    serving: BTreeMap<u64, (Rank, u64)>,
    next_id: u64,
    /// What this asks of the daemon core, in order (see [`PmixHost::drain`]).
    out: Vec<CoreInput>,
    /// Every job of the DVM by nspace, hosted here or not, with its hosts ([`dynamic`]).
    known: BTreeMap<String, (u32, Placement, Vec<String>)>,
    /// Namespaces of jobs with no proc here that this daemon registered with its server
    /// (participants of a connect or targets of a direct modex).
    foreign: BTreeSet<String>,
    /// Requests naming a job whose maps have not reached this daemon yet (a spawn's answer
    /// can overtake its child's maps broadcast): retried as each job's maps arrive.
    deferred: Vec<dynamic::Deferred>,
    /// The highest job id whose maps reached this daemon: a request naming a job at or below
    /// it that is not known names a job that ended or never was, and is refused at once.
    highest_learned: Option<u32>,
    /// Connect barriers this daemon reports to the HNP when they complete: fence key -> the
    /// jobs joined. Every participating daemon reports, before its clients return from the
    /// connect, so the HNP knows the jobs are joined before it can hear of any failure of
    /// theirs from this daemon (a report from one daemon raced with a failure reported by
    /// another, and the joined job was never told: docs/dynamic-mpi.md, "Events").
    connects: BTreeMap<u64, Vec<u32>>,
    /// The sets of jobs this daemon reported joined (each once), until one of them ends.
    reported_connects: BTreeSet<Vec<u32>>,
    /// Ranks the DVM reported dead (`PMIX_ERR_PROC_ABORTED`), by namespace, while their job
    /// runs: a group operation naming one fails ([`group`]).
    dead: BTreeMap<String, BTreeSet<u32>>,
    /// Group ids the current worker's libpmix keeps a record of: constructed (whatever the
    /// outcome) and not destructed since. libpmix 4.2.2 reuses a recorded id's member list
    /// for any later construct of that id, even by another job, which then waits for members
    /// that are gone; so a worker holding any is replaced once no job uses it.
    group_records: BTreeSet<String>,
    /// Spawns asked of the HNP, by our id.
    spawns: BTreeMap<u64, WorkerReplyHandle>,
    /// Data server requests asked of the HNP, by our id.
    data: BTreeMap<u64, (dvm_proto::daemon::DataOp, WorkerReplyHandle)>,
}

pub(crate) use dvm_core::JobStart;

/// How this daemon runs its PMIx workers.
#[derive(Debug, Clone)]
pub struct PmixSettings {
    /// Where the workers keep their files (a directory per worker, removed when it ends).
    pub dir: PathBuf,
    /// A worker that has grown by at least this many KiB since it was first idle after a job
    /// is replaced the next time no job uses it (0: after every job).
    pub recycle_kib: u64,
}

/// Default of `dvmd --pmix-recycle-kib`: what a worker may keep of past jobs before it is
/// replaced (libpmix 4.2.2 keeps ~5 KiB per rank it served; docs/soak.md).
pub const DEFAULT_RECYCLE_KIB: u64 = 512;

/// Namespace of a job: unique per DVM (HNP host and pid), so two DVMs on one host never share
/// one (Open MPI derives its job id and session paths from it).
pub use dvm_core::jobs::nspace_of;

/// The PMIx data store every rank uses (`PMIX_GDS_MODULE`). libpmix 4.2.2 keeps the
/// shared-memory store's per-client records for the daemon's lifetime; the hash store keeps
/// far less (docs/soak.md).
pub const CLIENT_GDS: &str = "hash";

/// The data stores the server itself opens (`PMIX_MCA_gds` in the worker's environment, unless
/// dvmd's environment sets it). Its ranks use [`CLIENT_GDS`], so the shared-memory stores
/// would only cost the server their segments: creating them at `PMIx_server_init` (median
/// 20 → 14 ms with four servers starting together) and tearing them down per namespace. A
/// job that picks `-x PMIX_GDS_MODULE=ds21` still runs (its ranks fall back to the hash
/// store); a DVM started with `PMIX_MCA_gds=ds21,hash` serves it from shared memory.
pub const SERVER_GDS: &str = "hash";

/// Open MPI settings a daemon gives its own ranks (its scratch directory). Open MPI 4.1's
/// MPI_Comm_spawn copies every `OMPI_MCA_*` variable of the spawning rank into the child's
/// environment: these are dropped from it, so each child rank gets its own daemon's (a child
/// rank with another daemon's shared-memory directory crashes in its first collective).
pub const PER_DAEMON_VARS: [&str; 2] = ["OMPI_MCA_btl_vader_backing_directory", "OMPI_MCA_orte_tmpdir_base"];

pub use dvm_core::jobs::local::{oversubscribed, YIELD_VAR};

/// Cores this daemon's ranks may run on: the CPUs of the daemon's affinity mask (ranks inherit
/// it), capped by a cgroup CPU quota, as `std::thread::available_parallelism` counts them.
pub fn node_cores() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX))
}

/// Set (non-empty, not `0`) in dvmd's environment: the daemon's PMIx server does not hand its
/// hardware topology to the ranks, and every rank discovers it again (the behaviour before
/// topology sharing; for comparisons such as scripts/bench_topo.sh).
pub const NO_TOPO_VAR: &str = "DVM_NO_TOPO";

/// Whether this daemon's PMIx server shares the node's topology with its ranks (see
/// [`ServerConfig::share_topology`]): yes unless [`NO_TOPO_VAR`] says otherwise.
pub fn share_topology() -> bool {
    std::env::var_os(NO_TOPO_VAR).is_none_or(|v| v.is_empty() || v == "0")
}

/// The job-level facts of a job as registered with a server (the maps; libpmix derives the
/// rest).
fn job_info(nspace: &str, placement: &Placement, hosts: &[String], nprocs: u32) -> JobInfo {
    let proc_map: Vec<Vec<u32>> = placement.daemons().map(|d| placement.procs_on(d).iter().collect()).collect();
    JobInfo {
        node_map: hosts.to_vec(),
        proc_map,
        job_size: nprocs,
        universe_size: nprocs,
        appnum: 0,
        jobid: Some(nspace.to_owned()),
        max_procs: None,
        extra: Vec::new(),
    }
}

fn fence_status(e: &FenceError) -> pmix_shim::Status {
    match e {
        FenceError::Timeout { .. } => pmix_shim::ERR_TIMEOUT,
        FenceError::Abandoned { .. } => pmix_shim::ERR_PROC_ABORTED,
        _ => pmix_shim::ERROR,
    }
}

/// The server of a daemon's `gen`-th worker on `host`.
fn server_config(settings: &PmixSettings, host: &str, gen: u64) -> ServerConfig {
    let mut cfg = ServerConfig::new(settings.dir.join(format!("w{gen}")));
    cfg.hostname = Some(host.to_string());
    cfg.op_timeout = link::WORKER_OP_TIMEOUT;
    // libpmix discovers the topology in PMIx_server_init either way; shared, each rank
    // adopts it (shared memory, else XML) instead of discovering it again.
    cfg.share_topology = share_topology();
    cfg
}

/// Start the server of the worker forked ahead ([`prefork`]) now, as the daemon's first
/// worker on `host` with `settings` (what the daemon will configure), before the daemon itself
/// is up: a daemon of an srun step waits for its secret until srun has started every task,
/// and its server starts meanwhile instead of after. The daemon's first worker then takes it.
pub fn start_preforked(settings: &PmixSettings, host: &str) {
    link::init_preforked(&server_config(settings, host, 1));
}

impl PmixHost {
    pub(crate) fn new(me: Rank, host: String, events: EventTx) -> PmixHost {
        PmixHost {
            me,
            host,
            settings: None,
            events,
            gen: 0,
            worker: None,
            retiring: Vec::new(),
            hurry: Default::default(),
            jobs: BTreeMap::new(),
            by_nspace: BTreeMap::new(),
            fences: BTreeMap::new(),
            ctx_counter: 0,
            asked: BTreeMap::new(),
            serving: BTreeMap::new(),
            next_id: 1,
            out: Vec::new(),
            known: BTreeMap::new(),
            foreign: BTreeSet::new(),
            deferred: Vec::new(),
            highest_learned: None,
            connects: BTreeMap::new(),
            reported_connects: BTreeSet::new(),
            dead: BTreeMap::new(),
            group_records: BTreeSet::new(),
            spawns: BTreeMap::new(),
            data: BTreeMap::new(),
        }
    }

    /// Where the workers keep their files and when one is replaced. The first worker starts
    /// when the first job needs it (an idle daemon stays small and boots fast), or at once
    /// with [`PmixHost::start_background`].
    pub(crate) fn configure(&mut self, settings: PmixSettings) {
        self.settings = Some(settings);
    }

    /// What this asks of the daemon core since the last drain, in order.
    pub(crate) fn drain(&mut self) -> std::vec::Drain<'_, CoreInput> {
        self.out.drain(..)
    }

    fn send_cmd(&mut self, dst: Rank, body: daemon_cmd::Body) {
        self.out.push(CoreInput::Cmd { dst, body });
    }

    /// Resident set size of the worker process (KiB; 0 when none runs).
    pub(crate) fn worker_rss_kib(&self) -> u64 {
        self.worker.as_ref().and_then(Worker::rss_kib).unwrap_or(0)
    }

    /// Nothing of any job is left in the worker, and nobody waits on it.
    fn idle(&self) -> bool {
        self.jobs.is_empty()
            && self.fences.is_empty()
            && self.asked.is_empty()
            && self.serving.is_empty()
            && self.spawns.is_empty()
            && self.data.is_empty()
            && self.deferred.is_empty()
    }

    fn config(&self, settings: &PmixSettings, gen: u64) -> ServerConfig {
        server_config(settings, &self.host, gen)
    }

    /// Start a worker now without waiting for its server, so it is ready (or nearly) when a
    /// job arrives. Nothing happens if one runs or PMIx is not configured.
    pub(crate) fn start_background(&mut self) {
        if self.worker.is_some() {
            return;
        }
        let Some(settings) = self.settings.clone() else { return };
        self.gen += 1;
        let cfg = self.config(&settings, self.gen);
        match Worker::spawn(&cfg, self.gen, self.events.clone()) {
            Ok(w) => {
                debug!(pid = w.pid(), gen = self.gen, "PMIx worker started");
                self.worker = Some(w);
            }
            Err(e) => error!("daemon {} on host {}: {e}; MPI ranks will fail", self.me, self.host),
        }
    }

    /// A server ready for a job: the running worker once its server is up, else a new worker.
    /// False (logged) if there is none: MPI ranks then fail at MPI_Init, other jobs run.
    fn ensure(&mut self) -> bool {
        self.start_background();
        let Some(w) = self.worker.as_mut() else { return false };
        match w.ready() {
            Ok(Some(version)) => {
                info!(%version, pid = w.pid(), topology_shared = share_topology(), "PMIx server up");
                true
            }
            Ok(None) => true,
            Err(e) => {
                error!("daemon {} on host {}: PMIx server unavailable, MPI ranks will fail: {e}", self.me, self.host);
                self.retire_worker();
                false
            }
        }
    }

    /// End the current worker in the background.
    fn retire_worker(&mut self) {
        self.foreign.clear();
        self.group_records.clear();
        if let Some(w) = self.worker.take() {
            self.retiring.retain(|h| !h.is_finished());
            self.retiring.push(w.retire(self.hurry.clone()));
        }
    }

    /// Replace an idle worker that has grown past the limit, or that keeps a group record a
    /// later job could trip on: ending it frees what libpmix kept of past clients, and a fresh
    /// one is started for the next job.
    fn maybe_recycle(&mut self) {
        let Some(limit) = self.settings.as_ref().map(|s| s.recycle_kib) else { return };
        if !self.idle() {
            return;
        }
        let Some(w) = self.worker.as_mut() else { return };
        let grown = w.idle_growth_kib();
        if grown < limit && self.group_records.is_empty() {
            return;
        }
        info!(
            pid = w.pid(),
            gen = w.gen,
            grown_kib = grown,
            group_records = ?self.group_records,
            "replacing the idle PMIx worker"
        );
        self.retire_worker();
        self.start_background();
    }

    /// The DVM is terminating: the worker is killed now, without waiting for it (its exit
    /// overlaps the rest of the termination; [`PmixHost::shutdown`] reaps it). No server is
    /// started after this.
    pub(crate) fn end_now(&mut self) {
        self.hurry.store(true, std::sync::atomic::Ordering::Relaxed);
        self.settings = None;
        link::discard_preforked();
        self.retire_worker();
    }

    /// The daemon ends: every worker is killed at once and reaped, its directory removed (the
    /// session directory goes next; the HNP kills a daemon that lingers).
    pub(crate) fn shutdown(&mut self) {
        self.end_now();
        for h in self.retiring.drain(..) {
            let _ = h.join();
        }
    }

    /// Register a job's namespace before its first local rank starts. Returns false (the job
    /// runs without PMIx) if there is no server or it refuses the namespace.
    pub(crate) fn job_start(&mut self, job: JobStart<'_>) -> bool {
        if !self.ensure() {
            return false;
        }
        let JobStart { jobid, nspace, placement, hosts, nprocs, nlocal } = job;
        let info = job_info(&nspace, &placement, hosts, nprocs);
        let w = self.worker.as_ref().expect("ensured above");
        let registered = match w.register_nspace(&nspace, nlocal, &info) {
            Ok(()) => {
                debug!(jobid, %nspace, "PMIx namespace registered");
                true
            }
            Err(e) => {
                warn!(jobid, %nspace, "cannot register the PMIx namespace: {e}");
                false
            }
        };
        // Every local client is registered before the first one starts: libpmix 4.2.2 drops
        // a group construct that a fast client sends while another local client of its
        // namespace is still unregistered (its re-check of pending collectives knows fences
        // and connects only), and the construct then never completes.
        let (uid, gid) = (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw());
        let clients_registered = registered
            && match w.register_clients(&nspace, placement.procs_on(self.me).iter().collect(), uid, gid) {
                Ok(()) => true,
                Err(e) => {
                    warn!(jobid, %nspace, "cannot register the local PMIx clients at once: {e}");
                    false
                }
            };
        self.by_nspace.insert(nspace.clone(), jobid);
        let job = PmixJob {
            nspace,
            placement,
            registered,
            clients_registered,
            connected: BTreeSet::new(),
            finalized: BTreeSet::new(),
            sigs: BTreeSet::new(),
        };
        self.jobs.insert(jobid, job);
        registered
    }

    /// The PMIx environment of one local rank (register_client + setup_fork + Open MPI's
    /// settings for running under a non-mpirun launcher). `session`: the daemon's scratch
    /// directory; `yield_idle`: the rank's machine is oversubscribed (see [`oversubscribed`]),
    /// so it is told to yield while it waits.
    pub(crate) fn proc_env(
        &mut self,
        jobid: u32,
        rank: u32,
        session: Option<String>,
        loopback: bool,
        yield_idle: bool,
    ) -> Vec<(String, String)> {
        let (Some(w), Some(job)) = (self.worker.as_ref(), self.jobs.get(&jobid).filter(|j| j.registered)) else {
            return Vec::new();
        };
        let (uid, gid) = (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw());
        let mut env = match w.prepare_client(&job.nspace, rank, uid, gid, job.clients_registered) {
            Ok(env) => env,
            Err(e) => {
                warn!(jobid, rank, "cannot prepare the PMIx client: {e}");
                return Vec::new();
            }
        };
        // setup_fork offers every store libpmix has (the client picks the first): offer one.
        env.retain(|(k, _)| k != "PMIX_GDS_MODULE");
        env.push(("PMIX_GDS_MODULE".into(), CLIENT_GDS.into()));
        // Open MPI 4.1 treats a rank it did not start as a singleton without this: its `orte`
        // component wants its own mpirun, and its `slurm` component forces a singleton when it
        // sees a Slurm job (SLURM_JOB_ID) but no srun step (no SLURM_STEP_ID), as in a batch
        // script.
        env.push(("OMPI_MCA_schizo".into(), "^orte,slurm".into()));
        if let Some(dir) = session {
            // Several daemons per host: shared-memory segments and Open MPI's session
            // directories must not collide.
            env.push(("OMPI_MCA_btl_vader_backing_directory".into(), dir.clone()));
            env.push(("OMPI_MCA_orte_tmpdir_base".into(), dir));
        }
        if loopback {
            env.push(("OMPI_MCA_btl_tcp_if_include".into(), "lo".into()));
            env.push(("OMPI_MCA_oob_tcp_if_include".into(), "lo".into()));
        }
        if yield_idle {
            env.push((YIELD_VAR.into(), "1".into()));
        }
        env
    }

    /// A local rank ended: was it an MPI rank that never finalized?
    pub(crate) fn proc_exit(&self, jobid: u32, rank: u32) -> Option<String> {
        let job = self.jobs.get(&jobid)?;
        (job.connected.contains(&rank) && !job.finalized.contains(&rank))
            .then(|| format!("rank {rank} on node {} exited without calling MPI_Finalize", self.host))
    }

    /// Every local rank of a job is gone: drop its namespace and fence signatures.
    pub(crate) fn job_done(&mut self, jobid: u32) {
        let Some(job) = self.jobs.remove(&jobid) else { return };
        self.by_nspace.remove(&job.nspace);
        // The worker may be replaced once libpmix has let go of the namespace
        // (NspaceDeregistered), or now if it never held it.
        let mut recycle_now = true;
        if let (true, Some(w)) = (job.registered, self.worker.as_ref()) {
            match w.deregister_nspace_nb(&job.nspace) {
                Ok(()) => recycle_now = false,
                Err(e) => warn!(jobid, "deregister_nspace: {e}"),
            }
        }
        // A fence still in flight over one of them can never complete (this daemon's ranks are
        // gone): abandon it on every daemon that holds it, then forget the signature.
        for sig in job.sigs {
            self.out.push(CoreInput::AbandonFence(sig.clone()));
            self.out.push(CoreInput::ForgetFence(sig));
        }
        if recycle_now {
            self.maybe_recycle();
        }
    }

    /// A fence this daemon runs for PMIx completed: answer libpmix.
    pub(crate) fn fence_done(&mut self, key: u64, result: Result<Bytes, FenceError>) {
        if let (Some(jobids), true) = (self.connects.remove(&key), result.is_ok()) {
            if self.reported_connects.insert(jobids.clone()) {
                self.send_cmd(0, daemon_cmd::Body::JobsConnected(dvm_proto::daemon::JobsConnected { jobids }));
            }
        }
        let reply = match self.fences.remove(&key) {
            Some(FenceWaiter::Upcall(reply)) => reply,
            Some(FenceWaiter::Group(wait)) => {
                self.group_done(wait, result);
                self.maybe_recycle();
                return;
            }
            // A group operation answered when a member died, whose fence was then abandoned.
            None if matches!(result, Err(FenceError::Abandoned { .. })) => {
                debug!(key, "an abandoned fence ended");
                return;
            }
            None => {
                warn!(key, "a PMIx fence completed with no upcall waiting for it");
                return;
            }
        };
        match result {
            Ok(data) => reply.complete_with(pmix_shim::SUCCESS, &data),
            Err(e) => {
                warn!(key, "PMIx fence failed: {e}");
                reply.complete(fence_status(&e));
            }
        }
        self.maybe_recycle();
    }

    /// An event from worker generation `gen`.
    pub(crate) fn on_event(&mut self, gen: u64, ev: HostEvent) {
        debug!(kind = ev.kind(), gen, "PMIx upcall");
        if self.worker.as_ref().map(|w| w.gen) != Some(gen) {
            // From a worker already replaced or lost: its replies cannot reach a client any
            // more (dropping them is a no-op on a closed link).
            debug!(kind = ev.kind(), gen, "event from a former PMIx worker dropped");
            return;
        }
        match ev {
            HostEvent::ClientConnected { proc, reply } => {
                if let Some((j, r)) = self.job_rank_mut(&proc) {
                    j.connected.insert(r);
                }
                reply.complete(pmix_shim::SUCCESS);
            }
            HostEvent::ClientFinalized { proc, reply } => {
                if let Some((j, r)) = self.job_rank_mut(&proc) {
                    j.finalized.insert(r);
                }
                reply.complete(pmix_shim::SUCCESS);
            }
            HostEvent::Abort { proc, status, message, reply } => {
                // Reply first; the job fails when the aborting rank has exited.
                reply.complete(pmix_shim::SUCCESS);
                let (Some(jobid), Some(rank)) = (self.job_of(&proc.nspace), proc_rank(&proc)) else { return };
                let abort = JobAbort { jobid, rank, code: status, message, daemon: self.me };
                self.send_cmd(0, daemon_cmd::Body::JobAbort(abort));
            }
            HostEvent::Log { client, text, reply } => {
                reply.complete(pmix_shim::SUCCESS);
                if let (Some(jobid), Some(text)) = (self.job_of(&client.nspace), text) {
                    let rank = proc_rank(&client).unwrap_or(u32::MAX);
                    self.send_cmd(0, daemon_cmd::Body::JobLog(JobLog { jobid, rank, text, daemon: self.me }));
                }
            }
            HostEvent::FenceNb(req) => self.fence(req),
            HostEvent::DirectModex { proc, reply } => self.direct_modex(proc, reply),
            HostEvent::DmodexData { request, status, data } => {
                let Some((asker, id)) = self.serving.remove(&request) else { return };
                let resp = DmodexResp { id, status, data };
                if asker == self.me {
                    self.on_dmodex_resp(resp);
                } else {
                    self.send_cmd(asker, daemon_cmd::Body::DmodexResp(resp));
                    self.maybe_recycle();
                }
            }
            HostEvent::JobControl { reply } => reply.complete(pmix_shim::ERR_NOT_SUPPORTED),
            HostEvent::NspaceDeregistered { nspace, status } => {
                debug!(%nspace, status, "PMIx namespace deregistered");
                self.maybe_recycle();
            }
            HostEvent::Spawn { proc, spawn, reply } => self.spawn(proc, spawn, reply),
            HostEvent::Connect { connect, procs, timeout, reply } => {
                let what = if connect { "connect" } else { "disconnect" };
                self.union_fence(what, &procs, false, Bytes::new(), timeout, reply)
            }
            HostEvent::Data { op, proc, keys, info, reply } => self.data_request(op, proc, keys, info, reply),
            HostEvent::Query { queries, reply } => self.query(queries, reply),
            HostEvent::Group { op, id, procs, directives, reply } => self.group(op, id, procs, directives, reply),
            HostEvent::Notify { event } => self.client_event(event),
            HostEvent::RegisterEvents { codes } => {
                // Nothing to set up: the DVM raises its events whoever listens, and libpmix
                // delivers them to the clients that registered.
                debug!(?codes, "a client registered for system events");
            }
            HostEvent::Ended { how } => self.worker_lost(&how),
        }
    }

    /// The current worker ended by itself (crashed, killed): every job with ranks here loses
    /// its PMIx server, so each fails naming this node; the next job gets a new worker.
    fn worker_lost(&mut self, how: &str) {
        let pid = self.worker.as_ref().map_or(0, Worker::pid);
        error!("daemon {} on host {}: its PMIx server process (pid {pid}) ended: {how}", self.me, self.host);
        let jobs: Vec<u32> = self.jobs.keys().copied().collect();
        for jobid in jobs {
            let reason = format!(
                "the PMIx server of daemon {} on node {} (pid {pid}) ended while job {jobid} ran: {how}",
                self.me, self.host
            );
            self.send_cmd(0, daemon_cmd::Body::JobFail(JobFail { jobid, code: 1, reason, daemon: self.me }));
        }
        // What the lost worker held is gone with it; the jobs keep their entries until their
        // procs end (exits still need `proc_exit`), but no reply can be answered any more.
        for job in self.jobs.values_mut() {
            job.registered = false;
        }
        self.fences.clear();
        self.asked.clear();
        self.serving.clear();
        self.spawns.clear();
        self.data.clear();
        self.deferred.clear();
        self.retire_worker();
    }

    fn job_of(&self, nspace: &str) -> Option<u32> {
        self.by_nspace.get(nspace).copied()
    }

    fn job_rank_mut(&mut self, proc: &ProcId) -> Option<(&mut PmixJob, u32)> {
        let rank = proc_rank(proc)?;
        let job = self.job_of(&proc.nspace)?;
        Some((self.jobs.get_mut(&job)?, rank))
    }

    fn fence(&mut self, req: FenceUpcall) {
        let nspace = req.procs.first().map(|p| p.nspace.clone()).unwrap_or_default();
        if req.procs.iter().any(|p| p.nspace != nspace) {
            // Across jobs (Open MPI's MPI_Comm_disconnect is such a fence).
            if let Some(st) = req.local_status.filter(|&s| s != pmix_shim::SUCCESS) {
                warn!(status = st, node = %self.host, "a local participant left a fence across jobs (status {st})");
                req.reply.complete(st);
                return;
            }
            let FenceUpcall { procs, collect, timeout, data, reply, .. } = req;
            self.union_fence("fence", &procs, collect, data, timeout, reply);
            return;
        }
        let Some(jobid) = self.job_of(&nspace) else {
            warn!(%nspace, "fence for an unknown namespace");
            req.reply.complete(pmix_shim::ERR_NOT_FOUND);
            return;
        };
        if let Some(st) = req.local_status.filter(|&s| s != pmix_shim::SUCCESS) {
            warn!(jobid, status = st, node = %self.host, "a local rank of job {jobid} left a fence (status {st})");
            req.reply.complete(st);
            return;
        }
        let job = self.jobs.get_mut(&jobid).expect("indexed by by_nspace");
        let wildcard = req.procs.iter().any(|p| proc_rank(p).is_none());
        let (key, mut daemons): (String, Vec<Rank>) = if wildcard {
            (format!("{nspace}:*"), job.placement.daemons().collect())
        } else {
            let mut ranks: Vec<u32> = req.procs.iter().filter_map(proc_rank).collect();
            ranks.sort_unstable();
            ranks.dedup();
            let ds = ranks.iter().filter_map(|&r| job.placement.node_of(r)).collect();
            (format!("{nspace}:{}", ranks.iter().map(u32::to_string).collect::<Vec<_>>().join(",")), ds)
        };
        daemons.sort_unstable();
        daemons.dedup();
        let sig = FenceSignature::new(key.into_bytes(), Participants::Daemons(daemons));
        job.sigs.insert(sig.clone());
        let timeout = req.timeout.filter(|&t| t > 0).map(|t| t as u64 * 1_000_000_000);
        let key = self.next_id;
        self.next_id += 1;
        self.fences.insert(key, FenceWaiter::Upcall(req.reply));
        debug!(jobid, %nspace, collect = req.collect, key, "PMIx fence upcall -> grpcomm fence");
        let nprocs = if wildcard { u64::from(job.placement.nprocs()) } else { req.procs.len() as u64 };
        let size_hint = req.collect.then(|| nprocs * MODEX_BYTES_PER_PROC);
        let fence = GFence { sig, collect: req.collect, data: req.data, timeout, size_hint };
        self.out.push(CoreInput::Fence { owner: dvm_core::FenceOwner::Pmix(key), req: fence });
    }

    fn direct_modex(&mut self, proc: ProcId, reply: WorkerReplyHandle) {
        // Any job of the DVM: after a connect, peers of another job are asked for too.
        let owner = match (self.job_of(&proc.nspace), proc_rank(&proc)) {
            (Some(jobid), Some(rank)) => self.jobs[&jobid].placement.node_of(rank).map(|o| (o, jobid, rank)),
            _ => self.host_of_proc(&proc).map(|(jobid, rank, owner)| (owner, jobid, rank)),
        };
        if owner.is_none()
            && proc_rank(&proc).is_some()
            && !self.known.contains_key(&proc.nspace)
            && dynamic::may_still_come(&proc.nspace, self.highest_learned)
        {
            debug!(%proc, "direct modex for a job whose maps have not arrived yet: deferred");
            self.deferred.push(dynamic::Deferred::Modex { proc, reply });
            return;
        }
        if owner.is_some() {
            self.register_foreign(std::slice::from_ref(&proc));
        }
        let Some((owner, jobid, rank)) = owner else {
            reply.complete(pmix_shim::ERR_NOT_FOUND);
            return;
        };
        let id = self.next_id;
        self.next_id += 1;
        self.asked.insert(id, reply);
        info!(jobid, rank, owner, "direct modex: asking daemon {owner} for rank {rank}");
        let req = DmodexReq { id, nspace: proc.nspace, rank };
        if owner == self.me {
            self.serve_dmodex(self.me, req);
        } else {
            self.send_cmd(owner, daemon_cmd::Body::DmodexReq(req));
        }
    }

    /// Another daemon (or this one) asks for the modex blob of a rank hosted here.
    pub(crate) fn serve_dmodex(&mut self, asker: Rank, req: DmodexReq) {
        let requested = match self.worker.as_ref() {
            Some(w) => w.dmodex_request(&req.nspace, req.rank).map_err(|e| e.to_string()),
            None => Err("no PMIx server runs here".to_string()),
        };
        match requested {
            Ok(request) => {
                self.serving.insert(request, (asker, req.id));
                info!(nspace = %req.nspace, rank = req.rank, asker, "direct modex served");
            }
            Err(e) => {
                warn!(rank = req.rank, "dmodex_request failed: {e}");
                let resp = DmodexResp { id: req.id, status: pmix_shim::ERROR, data: Bytes::new() };
                if asker == self.me {
                    self.on_dmodex_resp(resp);
                } else {
                    self.send_cmd(asker, daemon_cmd::Body::DmodexResp(resp));
                }
            }
        }
    }

    /// The answer to a direct modex this daemon asked for.
    pub(crate) fn on_dmodex_resp(&mut self, resp: DmodexResp) {
        debug!(id = resp.id, status = resp.status, bytes = resp.data.len(), "direct modex answer");
        if let Some(reply) = self.asked.remove(&resp.id) {
            reply.complete_with(resp.status, &resp.data);
        }
        self.maybe_recycle();
    }
}

/// A concrete rank of a proc name (None for the wildcard and libpmix's other reserved ranks).
fn proc_rank(p: &ProcId) -> Option<u32> {
    match p.rank {
        pmix_shim::Rank::Id(r) => Some(r),
        _ => None,
    }
}
