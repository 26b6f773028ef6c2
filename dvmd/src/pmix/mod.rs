//! The daemon's PMIx server, carried out: every daemon runs libpmix's server in a worker
//! process of its own ([`worker`], driven through `link`). What each upcall becomes is decided
//! in the core (`dvm_core::pmix`); this module starts, calls, answers and ends the worker.
//!
//! - The node's synchronous calls (register a namespace and its clients, a rank's environment,
//!   a direct-modex request, an event) are the worker's calls (`PmixHost`, behind
//!   `dvm_core::Host`, `crate::host`).
//! - Upcalls arrive as the worker's wire events, tagged with its generation: the shell hands
//!   those of the current worker to the node and drops the others (their replies cannot reach
//!   a client). Answers leave as the node's `PmixEffect::Reply`, by the upcall's reply id.
//! - topology: libpmix discovers the node's hardware topology once, in `PMIx_server_init`;
//!   the daemon asks it to share it ([`share_topology`]), so every namespace carries it and
//!   Open MPI 4.1's ranks adopt it. The worker loads it from the user's topology cache
//!   ([`topo_cache`]) rather than discovering it, once per boot and cgroup.
//!
//! Why a worker process (libpmix 4.2.2, measured in docs/soak.md): the server never frees what
//! it holds for a client once the client has connected, and cannot be started again in the
//! same process. So the server lives in a child process, and a worker that grew by more than
//! [`PmixSettings::recycle_kib`] is replaced when no job uses it (the node decides when).
//! Ranks use the hash store ([`CLIENT_GDS`]), which makes libpmix keep far less per client.
//!
//! Files: this one (the worker's calls), `lifecycle` (start, replace, end), `link` (the
//! worker's sockets), `worker` (the worker process itself), `value`, `frame`, `topo_cache`.
//!
//! Traps: a worker is replaced only when the node says so (idle), never under a running job;
//! no server starts after `end_now`.

mod frame;
mod lifecycle;
mod link;
pub mod topo_cache;
pub mod value;
pub mod worker;

use std::path::PathBuf;

use bytes::Bytes;
use dvm_core::Namespace;
use dvm_proto::pmixworker as wire;
use dvm_rml::Rank;
use pmix_shim::{JobInfo, ServerConfig};

pub use dvm_core::pmix::{CLIENT_GDS, PER_DAEMON_VARS};
pub use link::{discard_preforked, prefork};
pub(crate) use link::{EventTx, HostEvent};
use link::{Worker, WorkerError};

/// This daemon's PMIx worker: the one running, those ending.
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
}

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

/// The data stores the server itself opens (`PMIX_MCA_gds` in the worker's environment, unless
/// dvmd's environment sets it). Its ranks use [`CLIENT_GDS`], so the shared-memory stores
/// would only cost the server their segments: creating them at `PMIx_server_init` (median
/// 20 → 14 ms with four servers starting together) and tearing them down per namespace. A
/// job that picks `-x PMIX_GDS_MODULE=ds21` still runs (its ranks fall back to the hash
/// store); a DVM started with `PMIX_MCA_gds=ds21,hash` serves it from shared memory.
pub const SERVER_GDS: &str = "hash";

pub use dvm_core::jobs::local::{oversubscribed, YIELD_VAR};

/// The PMIx client library the daemon was built against (`libpmix.so.2` in pkg-config's
/// libdir), for ranks that load one when told to (Intel MPI's `I_MPI_PMI_LIBRARY`).
pub fn client_library() -> Option<String> {
    let dir = pmix_shim::LIBDIR?;
    ["libpmix.so.2", "libpmix.so"]
        .iter()
        .map(|name| std::path::Path::new(dir).join(name))
        .find(|p| p.exists())
        .map(|p| p.display().to_string())
}

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

/// A job as registered with a server: its maps, its apps (each app's argv and wdir from the
/// job map; a job known only by its placement has none) and its policies. From these the shim
/// derives every rank's proc data and each app's and node's info (`JobInfo`).
fn job_info(ns: &Namespace<'_>) -> JobInfo {
    let p = ns.placement;
    let proc_map: Vec<Vec<u32>> = p.daemons().map(|d| p.procs_on(d).iter().collect()).collect();
    let described = ns.map.map_or(&[][..], |m| &m.apps[..]);
    let apps = p
        .app_first_rank()
        .iter()
        .enumerate()
        .map(|(i, &first_rank)| {
            let (argv, wdir) = described.get(i).map_or_else(Default::default, |a| (a.argv.clone(), a.wdir.clone()));
            pmix_shim::AppInfo { first_rank, argv, wdir }
        })
        .collect();
    let extra = ns.map.map_or_else(Vec::new, |m| policies(m, !ns.bound.is_empty()));
    JobInfo {
        node_map: ns.hosts.to_vec(),
        proc_map,
        job_size: ns.nprocs,
        universe_size: ns.map.map_or(ns.nprocs, |m| m.universe.max(ns.nprocs)),
        appnum: 0,
        jobid: Some(ns.nspace.to_owned()),
        max_procs: None,
        extra,
        apps,
        proc_extra: Default::default(),
    }
}

/// `PMIX_MAPBY`, `PMIX_RANKBY` and `PMIX_BINDTO` of a job, spelled as PRRTE spells its
/// policies ("BYSLOT", "PPR:2:PACKAGE", "NODE", "CORE"). `bound_here`: this daemon bound its
/// ranks (the default binding is decided per node: none when oversubscribed).
fn policies(map: &dvm_proto::job::JobMap, bound_here: bool) -> Vec<pmix_shim::Info> {
    use dvm_core::jobmap::{Bind, Layout, Placement, Plan};
    use pmix_shim::{key_str, sys, Info, InfoValue};
    let plan = map.plan.as_ref().map(|w| Plan::from_wire(w, map.nprocs)).unwrap_or_default();
    let layout = Placement::from_job_map(map).map(|p| p.layout().clone()).ok();
    let up = |l: dvm_core::jobmap::Level| l.name().to_ascii_uppercase();
    let mapby = match (plan.map_obj, plan.per_obj, &layout) {
        (Some(l), n, _) if n > 0 => format!("PPR:{n}:{}", up(l)),
        (None, n, _) if n > 0 => format!("PPR:{n}:NODE"),
        (Some(l), _, _) => format!("BY{}", up(l)),
        (None, _, Some(Layout::RoundRobin)) => "BYNODE".to_string(),
        (None, _, Some(Layout::Explicit { .. })) => "BYUSER".to_string(),
        _ => "BYSLOT".to_string(),
    };
    let rankby = match (plan.rank_obj, &layout) {
        (Some(l), _) => up(l),
        (None, Some(Layout::RoundRobin)) => "NODE".to_string(),
        _ => "SLOT".to_string(),
    };
    let bindto = match plan.bind {
        Bind::None => "NONE".to_string(),
        Bind::To(l) => up(l),
        Bind::Default if !bound_here => "NONE".to_string(),
        Bind::Default => match plan.map_obj {
            Some(l) => up(l),
            None if plan.pe > 1 || map.nprocs <= 2 => "CORE".to_string(),
            None => "PACKAGE".to_string(),
        },
    };
    [(&sys::PMIX_MAPBY[..], mapby), (&sys::PMIX_RANKBY[..], rankby), (&sys::PMIX_BINDTO[..], bindto)]
        .into_iter()
        .map(|(k, v)| Info::new(key_str(k), InfoValue::String(v)))
        .collect()
}

/// The user and group the daemon's ranks run as (they are the daemon's).
fn ids() -> (u32, u32) {
    (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw())
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
        }
    }

    /// Where the workers keep their files and when one is replaced. The first worker starts
    /// when the first job needs it (an idle daemon stays small and boots fast), or at once
    /// with [`PmixHost::start_background`].
    pub(crate) fn configure(&mut self, settings: PmixSettings) {
        self.settings = Some(settings);
    }

    /// The generation of the running worker (its events carry it).
    pub(crate) fn current_gen(&self) -> Option<u64> {
        self.worker.as_ref().map(|w| w.gen)
    }

    fn running(&self) -> Result<&Worker, String> {
        self.worker.as_ref().ok_or_else(|| "no PMIx server runs here".to_string())
    }

    pub(crate) fn register_nspace(&self, ns: &Namespace<'_>) -> Result<(), String> {
        let w = self.running()?;
        w.register_nspace(ns.nspace, ns.nlocal, &job_info(ns), ns.bound).map_err(|e| e.to_string())
    }

    pub(crate) fn register_clients(&self, nspace: &str, ranks: Vec<u32>) -> Result<(), String> {
        let (uid, gid) = ids();
        self.running()?.register_clients(nspace, ranks, uid, gid).map_err(|e| e.to_string())
    }

    pub(crate) fn prepare_client(
        &self,
        nspace: &str,
        rank: u32,
        registered: bool,
    ) -> Result<Vec<(String, String)>, String> {
        let (uid, gid) = ids();
        self.running()?.prepare_client(nspace, rank, uid, gid, registered).map_err(|e| e.to_string())
    }

    pub(crate) fn deregister_nspace(&self, nspace: &str) -> Result<(), String> {
        self.running()?.deregister_nspace_nb(nspace).map_err(|e| e.to_string())
    }

    pub(crate) fn dmodex_request(&self, nspace: &str, rank: u32) -> Result<u64, String> {
        self.running()?.dmodex_request(nspace, rank).map_err(|e| e.to_string())
    }

    pub(crate) fn notify(&self, event: wire::Notify) -> Result<(), String> {
        self.running()?.notify(event).map_err(|e: WorkerError| e.to_string())
    }

    /// How much the running worker grew since it was first idle (None: none runs).
    pub(crate) fn growth_kib(&mut self) -> Option<u64> {
        self.worker.as_mut().map(Worker::idle_growth_kib)
    }

    /// Answer the running worker's upcall `reply` (a no-op if the worker is gone).
    pub(crate) fn complete(&self, reply: u64, status: i32, data: Bytes) {
        if let Some(w) = self.worker.as_ref() {
            w.complete(reply, status, data);
        }
    }
}

#[cfg(test)]
mod tests {
    use dvm_core::pmixdef::{self as def, key, range};
    use pmix_shim::{key_str, sys};

    /// The core decides with PMIx's values without linking libpmix: each is the library's.
    #[test]
    fn the_cores_pmix_values_are_the_librarys() {
        let statuses = [
            (def::ERROR, sys::PMIX_ERROR),
            (def::ERR_TIMEOUT, sys::PMIX_ERR_TIMEOUT),
            (def::ERR_BAD_PARAM, sys::PMIX_ERR_BAD_PARAM),
            (def::ERR_NOT_FOUND, sys::PMIX_ERR_NOT_FOUND),
            (def::ERR_NOT_SUPPORTED, sys::PMIX_ERR_NOT_SUPPORTED),
            (def::ERR_PARTIAL_SUCCESS, sys::PMIX_ERR_PARTIAL_SUCCESS),
            (def::ERR_DUPLICATE_KEY, sys::PMIX_ERR_DUPLICATE_KEY),
            (def::ERR_LOST_CONNECTION, sys::PMIX_ERR_LOST_CONNECTION),
            (def::ERR_JOB_FAILED_TO_MAP, sys::PMIX_ERR_JOB_FAILED_TO_MAP),
            (def::ERR_JOB_FAILED_TO_LAUNCH, sys::PMIX_ERR_JOB_FAILED_TO_LAUNCH),
            (def::EVENT_NODE_DOWN, sys::PMIX_EVENT_NODE_DOWN),
        ];
        for (ours, lib) in statuses {
            assert_eq!(ours, lib);
        }
        assert_eq!(i64::from(def::SUCCESS), i64::from(sys::PMIX_SUCCESS));
        assert_eq!(def::ERR_PROC_ABORTED, pmix_shim::ERR_PROC_ABORTED);
        assert_eq!((def::RANK_WILDCARD, def::RANK_VALID), (sys::PMIX_RANK_WILDCARD, sys::PMIX_RANK_VALID));
        let ranges = [
            (range::RM, sys::PMIX_RANGE_RM),
            (range::LOCAL, sys::PMIX_RANGE_LOCAL),
            (range::NAMESPACE, sys::PMIX_RANGE_NAMESPACE),
            (range::SESSION, sys::PMIX_RANGE_SESSION),
            (range::CUSTOM, sys::PMIX_RANGE_CUSTOM),
            (range::PROC_LOCAL, sys::PMIX_RANGE_PROC_LOCAL),
        ];
        for (ours, lib) in ranges {
            assert_eq!(ours, u32::from(lib as u8));
        }
        let keys: [(&str, &[u8]); 23] = [
            (key::MAPBY, sys::PMIX_MAPBY),
            (key::WDIR, sys::PMIX_WDIR),
            (key::RANGE, sys::PMIX_RANGE),
            (key::PERSISTENCE, sys::PMIX_PERSISTENCE),
            (key::USERID, sys::PMIX_USERID),
            (key::GRPID, sys::PMIX_GRPID),
            (key::TIMEOUT, sys::PMIX_TIMEOUT),
            (key::WAIT, sys::PMIX_WAIT),
            (key::LOCAL_COLLECTIVE_STATUS, sys::PMIX_LOCAL_COLLECTIVE_STATUS),
            (key::GROUP_ASSIGN_CONTEXT_ID, sys::PMIX_GROUP_ASSIGN_CONTEXT_ID),
            (key::GROUP_ENDPT_DATA, sys::PMIX_GROUP_ENDPT_DATA),
            (key::GROUP_CONTEXT_ID, sys::PMIX_GROUP_CONTEXT_ID),
            (key::QUERY_NUM_PSETS, sys::PMIX_QUERY_NUM_PSETS),
            (key::QUERY_NAMESPACES, sys::PMIX_QUERY_NAMESPACES),
            (key::JOB_SIZE, sys::PMIX_JOB_SIZE),
            (key::NSPACE, sys::PMIX_NSPACE),
            (key::PROCID, sys::PMIX_PROCID),
            (key::EVENT_CUSTOM_RANGE, sys::PMIX_EVENT_CUSTOM_RANGE),
            (def::KEY_EVENT_AFFECTED_PROC, sys::PMIX_EVENT_AFFECTED_PROC),
            (def::KEY_EVENT_AFFECTED_PROCS, sys::PMIX_EVENT_AFFECTED_PROCS),
            (def::KEY_EXIT_CODE, sys::PMIX_EXIT_CODE),
            (def::KEY_EVENT_TEXT_MESSAGE, sys::PMIX_EVENT_TEXT_MESSAGE),
            (def::KEY_HOSTNAME, sys::PMIX_HOSTNAME),
        ];
        for (ours, lib) in keys {
            assert_eq!(ours, key_str(lib));
        }
    }
}
