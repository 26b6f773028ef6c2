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
//! Files: this one holds `PmixHost`'s state and the settings; `lifecycle` (start, recycle, end
//! or lose the worker), `jobs` (a job's namespace and its ranks' environment), `upcalls`
//! (answering the worker's upcalls, fences and direct modex), and `dynamic`, `group`, `events`.
//! `lifecycle`, `jobs` and `upcalls` each implement part of `PmixHost` and import from here;
//! this file imports nothing from them (it only re-exports a few items of `link` and `events`).
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
mod jobs;
mod lifecycle;
mod link;
pub mod topo_cache;
mod upcalls;
pub mod value;
pub mod worker;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use dvm_core::Input as CoreInput;
use dvm_grpcomm::{FenceError, FenceSignature};
use dvm_proto::daemon::daemon_cmd;
use dvm_rml::Rank;
use pmix_shim::{JobInfo, ProcId, ServerConfig};

use crate::jobmap::Placement;
pub use events::{event_payload, FROM_DVM};
pub use link::{discard_preforked, prefork};
pub(crate) use link::{EventTx, HostEvent};
use link::{Worker, WorkerReplyHandle};

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
}

/// A concrete rank of a proc name (None for the wildcard and libpmix's other reserved ranks).
fn proc_rank(p: &ProcId) -> Option<u32> {
    match p.rank {
        pmix_shim::Rank::Id(r) => Some(r),
        _ => None,
    }
}

/// `procs` as the core's rules take them (`dvm_core::pmixops`): a rank, or all of them.
fn procs_view(procs: &[ProcId]) -> Vec<dvm_core::pmixops::Proc<'_>> {
    procs.iter().map(|p| dvm_core::pmixops::Proc { nspace: &p.nspace, rank: proc_rank(p) }).collect()
}
