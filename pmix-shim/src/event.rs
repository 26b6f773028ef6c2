//! Owned events posted by the upcalls. Every field is a copy; the replies are the only link
//! back into libpmix.

use crate::error::Status;
use crate::reply::{FenceReply, InfoReply, LookupReply, ModexReply, Reply, SpawnReply};
use crate::sys;
use crate::types::{find_info, Info, ProcId};

/// A `fence_nb` upcall: all local participants of a fence have contributed.
///
/// With one server for every participant libpmix calls this once for the local collective,
/// with the local procs' data already concatenated in `data`.
#[derive(Debug)]
pub struct FenceRequest {
    /// The fence's participants (Open MPI: one entry, `{nspace, Wildcard}`).
    pub procs: Vec<ProcId>,
    /// `PMIX_COLLECT_DATA` from the info array; false when absent. Never inferred from `data`.
    pub collect: bool,
    /// `PMIX_TIMEOUT` (seconds), if given.
    pub timeout: Option<i32>,
    /// `pmix.loc.col.st` (`PMIX_LOCAL_COLLECTIVE_STATUS`), if given: non-zero (e.g. -52
    /// PARTIAL_SUCCESS) means a local participant died without contributing.
    pub local_status: Option<Status>,
    /// This server's contribution (copied).
    pub data: Vec<u8>,
    /// The whole info array (copied), including libpmix's own `pmix.sorted.parr`.
    pub info: Vec<Info>,
    /// Complete with the collective result (concatenation of every server's `data`).
    pub reply: FenceReply,
}

impl FenceRequest {
    pub(crate) fn new(procs: Vec<ProcId>, info: Vec<Info>, data: Vec<u8>, reply: FenceReply) -> FenceRequest {
        let collect = find_info(&info, sys::PMIX_COLLECT_DATA).and_then(|v| v.as_bool()).unwrap_or(false);
        let timeout = find_info(&info, sys::PMIX_TIMEOUT).and_then(|v| v.as_i64()).map(|t| t as i32);
        let local_status =
            find_info(&info, sys::PMIX_LOCAL_COLLECTIVE_STATUS).and_then(|v| v.as_i64()).map(|s| s as Status);
        FenceRequest { procs, collect, timeout, local_status, data, info, reply }
    }
}

/// One application of a spawn request (`pmix_app_t`, copied).
#[derive(Debug, Clone, PartialEq)]
pub struct SpawnApp {
    /// The executable as the client named it.
    pub cmd: String,
    /// The full argv, argv\[0\] included (Open MPI puts the command there).
    pub argv: Vec<String>,
    /// `NAME=value` entries for the new procs' environment.
    pub env: Vec<String>,
    /// Working directory ("" if none was given).
    pub cwd: String,
    /// How many procs of this app.
    pub maxprocs: i32,
    /// Per-app directives (e.g. `PMIX_WDIR`).
    pub info: Vec<Info>,
}

/// One query of a `PMIx_Query_info` that libpmix could not answer from its own store
/// (`pmix_query_t`, copied): its keys and their qualifiers (e.g. `PMIX_NSPACE`).
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    pub keys: Vec<String>,
    pub qualifiers: Vec<Info>,
}

/// Which group operation a `group` upcall asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupOp {
    /// `PMIx_Group_construct`: every local member arrived.
    Construct,
    /// `PMIx_Group_destruct`: every local member arrived.
    Destruct,
}

/// Everything libpmix asks of the host, plus the answers to the host's own async requests.
#[derive(Debug)]
pub enum PmixEvent {
    /// A registered client connected (called PMIx_Init). Complete with SUCCESS to accept it.
    ClientConnected { proc: ProcId, reply: Reply },
    /// A client called PMIx_Finalize; it stays blocked until `reply` completes.
    ClientFinalized { proc: ProcId, reply: Reply },
    /// A client called PMIx_Abort (MPI_Abort). It stays blocked until `reply` completes and then
    /// exits by itself with `status`. `procs` = None means "every proc of the caller's nspace".
    /// Working order (notes): complete the reply, wait for the aborting rank's exit, then kill.
    Abort { proc: ProcId, status: Status, message: String, procs: Option<Vec<ProcId>>, reply: Reply },
    /// All local participants of a fence contributed.
    FenceNb(FenceRequest),
    /// libpmix needs `proc`'s data from the daemon hosting it (only when the modex did not
    /// collect). Answer with that daemon's `PmixServer::dmodex_request` result.
    DirectModex { proc: ProcId, info: Vec<Info>, reply: ModexReply },
    /// A client called PMIx_Log. `text` is the best-effort rendered message: string values
    /// verbatim, byte values (Open MPI's DSS-packed show_help) reduced to their last string.
    Log { client: ProcId, text: Option<String>, data: Vec<Info>, directives: Vec<Info>, reply: Reply },
    /// A client asked for job control (kill, signal, ...) of `targets`.
    JobControl { requestor: ProcId, targets: Vec<ProcId>, directives: Vec<Info>, reply: InfoReply },
    /// A client called PMIx_Spawn (MPI_Comm_spawn). Complete with the new job's nspace once its
    /// procs are started, or with an error status.
    Spawn { proc: ProcId, job_info: Vec<Info>, apps: Vec<SpawnApp>, reply: SpawnReply },
    /// Every local participant of a PMIx_Connect over `procs` (several nspaces) arrived.
    /// Complete once every participant, on every server, has arrived.
    Connect { procs: Vec<ProcId>, info: Vec<Info>, reply: Reply },
    /// As [`PmixEvent::Connect`], for PMIx_Disconnect.
    Disconnect { procs: Vec<ProcId>, info: Vec<Info>, reply: Reply },
    /// A client published `info` (data and directives such as `PMIX_RANGE`, `PMIX_PERSISTENCE`).
    Publish { proc: ProcId, info: Vec<Info>, reply: Reply },
    /// A client looks up `keys` (directives such as `PMIX_WAIT`, `PMIX_TIMEOUT` in `info`).
    Lookup { proc: ProcId, keys: Vec<String>, info: Vec<Info>, reply: LookupReply },
    /// A client unpublishes `keys` (none: everything it published).
    Unpublish { proc: ProcId, keys: Vec<String>, info: Vec<Info>, reply: Reply },
    /// A client's `PMIx_Query_info` reached the host: libpmix 4.2.2 resolves a query from its
    /// own store first (job-level keys of a registered nspace, ABI versions, attribute
    /// support) and calls the host with every query of the request when any key is not there.
    /// The upcall does not say which client asked. Complete with one info per answered key.
    Query { queries: Vec<Query>, reply: InfoReply },
    /// Every local member of a `PMIx_Group_construct` / `_destruct` over `procs` arrived
    /// (libpmix sorted `procs` on the first construct of `id` and keeps that list until a
    /// destruct of `id` completes). `directives` hold the client's info (e.g.
    /// `PMIX_GROUP_ASSIGN_CONTEXT_ID`) plus libpmix's own: `PMIX_GROUP_ENDPT_DATA` (this
    /// server's members' modex, to be concatenated with every other server's) and
    /// `pmix.loc.col.st`. Complete once every member on every server arrived, with
    /// `PMIX_GROUP_CONTEXT_ID` and the concatenated `PMIX_GROUP_ENDPT_DATA` for a construct.
    Group { op: GroupOp, id: String, procs: Vec<ProcId>, directives: Vec<Info>, reply: InfoReply },
    /// A client's `PMIx_Notify_event` with a range beyond its own server (libpmix has already
    /// delivered it to this server's registered clients): the host carries it to the others.
    /// No reply: the upcall answered `PMIX_OPERATION_SUCCEEDED` (libpmix 4.2.2 crashes when
    /// the host later calls this upcall's cbfunc).
    Notify { status: Status, source: ProcId, range: u8, info: Vec<Info> },
    /// A client registered handlers for system event codes (only those reach the host). No
    /// reply: answered `PMIX_OPERATION_SUCCEEDED` (the DVM raises its events whoever listens;
    /// libpmix delivers them to the clients that registered).
    RegisterEvents { codes: Vec<Status>, info: Vec<Info> },
    /// Answer to `PmixServer::dmodex_request(request)`: `proc`'s data blob on this server.
    DmodexData { request: u64, proc: ProcId, status: Status, data: Vec<u8> },
    /// `PmixServer::deregister_nspace_nb(nspace)` completed.
    NspaceDeregistered { nspace: String, status: Status },
}

impl PmixEvent {
    /// Short name for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            PmixEvent::ClientConnected { .. } => "client_connected",
            PmixEvent::ClientFinalized { .. } => "client_finalized",
            PmixEvent::Abort { .. } => "abort",
            PmixEvent::FenceNb(_) => "fence_nb",
            PmixEvent::DirectModex { .. } => "direct_modex",
            PmixEvent::Log { .. } => "log",
            PmixEvent::JobControl { .. } => "job_control",
            PmixEvent::Spawn { .. } => "spawn",
            PmixEvent::Connect { .. } => "connect",
            PmixEvent::Disconnect { .. } => "disconnect",
            PmixEvent::Publish { .. } => "publish",
            PmixEvent::Lookup { .. } => "lookup",
            PmixEvent::Unpublish { .. } => "unpublish",
            PmixEvent::Query { .. } => "query",
            PmixEvent::Group { op: GroupOp::Construct, .. } => "group_construct",
            PmixEvent::Group { op: GroupOp::Destruct, .. } => "group_destruct",
            PmixEvent::Notify { .. } => "notify_event",
            PmixEvent::RegisterEvents { .. } => "register_events",
            PmixEvent::DmodexData { .. } => "dmodex_data",
            PmixEvent::NspaceDeregistered { .. } => "nspace_deregistered",
        }
    }
}
