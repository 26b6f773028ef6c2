//! The daemon as a PMIx host, decided: what every upcall of the daemon's PMIx server becomes
//! (a grpcomm fence, a command to another daemon or the HNP, an xcast, a reply), the
//! namespaces registered there, who answers a direct modex, requests deferred until a job's
//! maps arrive, groups and queries, and when the worker that runs the server is replaced.
//!
//! Inputs: upcalls in their wire form ([`Pmix::on_upcall`], `dvm.pmixworker.WorkerEvent`, each
//! with the worker's reply id), the loss of the worker, the local jobs' starts and ends
//! ([`With`]), fences finished, daemon commands and events for PMIx. Outputs, in order, in
//! `out`: router inputs and [`PmixEffect`]s (a reply by its id, replace or end the worker).
//! The synchronous calls into the server (register a namespace or clients, a rank's
//! environment, a direct-modex request, an event) go through [`Host`], in the core's order.
//!
//! Never: a socket, a worker process or a reply handle (a reply is its id).
//! Invariants: every upcall with a reply id is answered exactly once, unless the worker is
//! lost (then nothing can reach its clients); a worker is replaced only when idle (no
//! namespace, no fence, no direct modex, spawn, data or deferred request), never under a job;
//! nothing asks for a server after the DVM ends.
//!
//! Files: this one holds the state and the worker's life; `jobs` (namespaces and the ranks'
//! environment), `upcalls` (dispatch, fences, direct modex), `dynamic` (spawn, connect,
//! publish/lookup), `group` (groups, queries), `events`, `info` (reading wire values).

mod dynamic;
mod events;
mod group;
pub mod info;
mod jobs;
#[cfg(test)]
mod tests;
mod upcalls;

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use dvm_grpcomm::{FenceError, FenceSignature};
use dvm_proto::daemon::{daemon_cmd, DataOp, JobFail};
use dvm_rml::Rank;
use tracing::{error, info, warn};

pub use dynamic::{parse_map_by, SpawnMapping};
pub use events::{client_event_scope, event_payload, FROM_DVM};
pub use group::{decode_records, encode_record, group_key};
pub use jobs::With;

use crate::host::Host;
use crate::jobmap::Placement;
use crate::pmixdef::{self as def, Status};
use crate::{FenceOwner, Input};

/// What `auto` prices the first collecting fence over a set of procs with, per proc: Open
/// MPI 4.1's modex with the TCP BTL is 44–68 bytes a rank. Every daemon of the fence derives
/// the same hint from the procs array (or the job's size, for a wildcard).
pub const MODEX_BYTES_PER_PROC: u64 = 64;

/// Open MPI settings a daemon gives its own ranks (its scratch directory). Open MPI 4.1's
/// MPI_Comm_spawn copies every `OMPI_MCA_*` variable of the spawning rank into the child's
/// environment: these are dropped from it, so each child rank gets its own daemon's (a child
/// rank with another daemon's shared-memory directory crashes in its first collective).
pub const PER_DAEMON_VARS: [&str; 2] = ["OMPI_MCA_btl_vader_backing_directory", "OMPI_MCA_orte_tmpdir_base"];

/// The PMIx data store every rank uses (`PMIX_GDS_MODULE`). libpmix 4.2.2 keeps the
/// shared-memory store's per-client records for the daemon's lifetime; the hash store keeps
/// far less (docs/soak.md).
pub const CLIENT_GDS: &str = "hash";

/// The PMIx status a failed fence is answered with.
fn fence_status(e: &FenceError) -> Status {
    match e {
        FenceError::Timeout { .. } => def::ERR_TIMEOUT,
        FenceError::Abandoned { .. } => def::ERR_PROC_ABORTED,
        _ => def::ERROR,
    }
}

/// `PMIX_TIMEOUT` seconds as a fence's ns (0 or less: none).
fn timeout_ns(secs: Option<i64>) -> Option<u64> {
    secs.filter(|&t| t > 0).map(|t| t as u64 * 1_000_000_000)
}

/// What PMIx hosting asks of the shell's worker.
#[derive(Debug, Clone, PartialEq)]
pub enum PmixEffect {
    /// Complete the current worker's upcall `reply`.
    Reply { reply: u64, status: Status, data: Bytes },
    /// Replace the idle worker by a fresh one (it grew, or keeps a group record).
    Replace,
    /// The DVM ends: end the worker now; no server is asked for after this.
    End,
}

/// What PMIx hosting asks of the node, in order.
#[derive(Debug)]
pub(crate) enum PmixOut {
    Router(Input),
    Effect(PmixEffect),
}

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

/// A direct modex this daemon asked another daemon (or itself) for.
#[derive(Debug)]
struct Asked {
    reply: u64,
    owner: Rank,
    nspace: String,
}

/// What a PMIx collective asks of grpcomm (`timeout` in ns).
struct FenceParts {
    sig: FenceSignature,
    collect: bool,
    data: Bytes,
    timeout: Option<u64>,
}

/// Who waits for a fence this daemon runs for libpmix.
#[derive(Debug)]
enum Waiter {
    /// A fence, connect or disconnect upcall: answered with the fence's bytes.
    Upcall(u64),
    /// A group construct or destruct: its answer is derived from the fence's bytes.
    Group(group::GroupWait),
}

/// This daemon's PMIx hosting.
pub struct Pmix {
    me: Rank,
    host: String,
    /// A worker that grew by this many KiB since it was first idle is replaced when idle;
    /// None: the daemon hosts no PMIx server.
    recycle_kib: Option<u64>,
    /// The DVM ends: no server is asked for any more.
    ended: bool,
    jobs: BTreeMap<u32, PmixJob>,
    by_nspace: BTreeMap<String, u32>,
    /// Fences this daemon runs for libpmix, by the key the router returns them with.
    fences: BTreeMap<u64, Waiter>,
    /// Context ids this daemon offered so far (or the highest chosen, if larger): `group`.
    ctx_counter: u64,
    /// Direct modex requests this daemon asked: our id -> the upcall's reply, and the daemon
    /// and namespace asked for (a lost owner or an ended job answers it with an error).
    asked: BTreeMap<u64, Asked>,
    /// Requests this daemon serves: the server's request id -> (asking daemon, its id).
    serving: BTreeMap<u64, (Rank, u64)>,
    next_id: u64,
    pub(crate) out: Vec<PmixOut>,
    /// Every job of the DVM by nspace, hosted here or not, with its hosts (`dynamic`).
    known: BTreeMap<String, (u32, Placement, Vec<String>)>,
    /// Namespaces of jobs with no proc here registered with the server (participants of a
    /// connect or targets of a direct modex).
    foreign: BTreeSet<String>,
    /// Namespaces of jobs whose ranks here have all ended (and were let go), until the job
    /// ends everywhere: a direct modex their dying clients still asked for is refused, and
    /// the namespace is never registered again as another daemon's (libpmix 4.2.2 then hung
    /// in the next job's `register_nspace`).
    done_here: BTreeSet<String>,
    /// Requests naming a job whose maps have not reached this daemon yet (a spawn's answer can
    /// overtake its child's maps broadcast): retried as each job's maps arrive.
    deferred: Vec<dynamic::Deferred>,
    /// The highest job id whose maps reached this daemon: a request naming a job at or below
    /// it that is not known names a job that ended or never was, and is refused at once.
    highest_learned: Option<u32>,
    /// Connect barriers this daemon reports to the HNP when they complete: fence key -> the
    /// jobs joined. Every participating daemon reports, before its clients return from the
    /// connect, so the HNP knows the jobs are joined before it can hear of any failure of
    /// theirs from this daemon (docs/dynamic-mpi.md, "Events").
    connects: BTreeMap<u64, Vec<u32>>,
    /// The sets of jobs this daemon reported joined (each once), until one of them ends.
    reported_connects: BTreeSet<Vec<u32>>,
    /// Ranks the DVM reported dead, by namespace, while their job runs: a group operation
    /// naming one fails (`group`).
    dead: BTreeMap<String, BTreeSet<u32>>,
    /// Group ids the current worker's libpmix keeps a record of: constructed (whatever the
    /// outcome) and not destructed since. libpmix 4.2.2 reuses a recorded id's member list
    /// for any later construct of that id, even by another job, which then waits for members
    /// that are gone; so a worker holding any is replaced once no job uses it.
    group_records: BTreeSet<String>,
    /// Spawns asked of the HNP: our id -> the upcall's reply.
    spawns: BTreeMap<u64, u64>,
    /// Jobs whose ranks must not use PMIx (`--mpi pmi1|pmi2`): a client that connects fails
    /// its job with this sentence.
    refused: BTreeMap<u32, String>,
    /// Data server requests asked of the HNP: our id -> (the operation, the upcall's reply).
    data: BTreeMap<u64, (DataOp, u64)>,
}

impl Pmix {
    pub fn new(me: Rank, host: String) -> Pmix {
        Pmix {
            me,
            host,
            recycle_kib: None,
            ended: false,
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
            done_here: BTreeSet::new(),
            deferred: Vec::new(),
            highest_learned: None,
            connects: BTreeMap::new(),
            reported_connects: BTreeSet::new(),
            dead: BTreeMap::new(),
            group_records: BTreeSet::new(),
            spawns: BTreeMap::new(),
            data: BTreeMap::new(),
            refused: BTreeMap::new(),
        }
    }

    /// A job's ranks must not use PMIx: one that connects fails the job, `why` naming it.
    pub fn refuse_clients(&mut self, jobid: u32, why: String) {
        self.refused.insert(jobid, why);
    }

    /// The daemon hosts a PMIx server; an idle worker that grew by `recycle_kib` is replaced.
    pub fn configure(&mut self, recycle_kib: u64) {
        self.recycle_kib = Some(recycle_kib);
    }

    /// Nothing of any job is left in the worker, and nobody waits on it.
    pub fn idle(&self) -> bool {
        self.jobs.is_empty() && self.serving.is_empty() && self.waiting() == 0
    }

    /// Upcalls waiting for an answer (fences, direct modex, spawns, data requests, deferred).
    pub fn waiting(&self) -> usize {
        self.fences.len() + self.asked.len() + self.spawns.len() + self.data.len() + self.deferred.len()
    }

    fn next_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    fn reply(&mut self, reply: u64, status: Status) {
        self.reply_with(reply, status, Bytes::new());
    }

    fn reply_with(&mut self, reply: u64, status: Status, data: impl Into<Bytes>) {
        if reply != 0 {
            self.out.push(PmixOut::Effect(PmixEffect::Reply { reply, status, data: data.into() }));
        }
    }

    /// Start a grpcomm fence for `waiter` over `sig`, priced (when it collects) for `nprocs`
    /// procs of modex; its key.
    fn start_fence(&mut self, waiter: Waiter, req: FenceParts, nprocs: u64) -> u64 {
        let key = self.next_id();
        self.fences.insert(key, waiter);
        let FenceParts { sig, collect, data, timeout } = req;
        let size_hint = collect.then(|| nprocs * MODEX_BYTES_PER_PROC);
        let req = dvm_grpcomm::FenceRequest { sig, collect, data, timeout, size_hint };
        self.ask(Input::Fence { owner: FenceOwner::Pmix(key), req });
        key
    }

    fn send_cmd(&mut self, dst: Rank, body: daemon_cmd::Body) {
        self.ask(Input::Cmd { dst, body });
    }

    fn ask(&mut self, input: Input) {
        self.out.push(PmixOut::Router(input));
    }

    /// A server for a job: Ok(false) if this daemon hosts none (its jobs run without PMIx),
    /// Err if it should and cannot (the shell ended the broken worker).
    fn ready(&mut self, host: &mut impl Host) -> Result<bool, String> {
        if self.ended || self.recycle_kib.is_none() {
            return Ok(false);
        }
        host.pmix_ready().map(|()| true).inspect_err(|_| self.worker_gone())
    }

    /// Job `jobid` fails, this daemon's PMIx server being the cause (`why` names it).
    fn fail_job(&mut self, jobid: u32, why: &str) {
        let reason = format!("the PMIx server of daemon {} on node {} {why}", self.me, self.host);
        self.send_cmd(0, daemon_cmd::Body::JobFail(JobFail { jobid, code: 1, reason, daemon: self.me }));
    }

    /// What the current worker held is gone (replaced, lost or never started).
    fn worker_gone(&mut self) {
        self.foreign.clear();
        self.group_records.clear();
    }

    /// Replace an idle worker that has grown past the limit, or that keeps a group record a
    /// later job could trip on: ending it frees what libpmix kept of past clients.
    fn maybe_recycle(&mut self, host: &mut impl Host) {
        let Some(limit) = self.recycle_kib.filter(|_| !self.ended && self.idle()) else { return };
        let Some(grown) = host.pmix_growth_kib() else { return };
        if grown < limit && self.group_records.is_empty() {
            return;
        }
        info!(grown_kib = grown, group_records = ?self.group_records, "replacing the idle PMIx worker");
        self.worker_gone();
        self.out.push(PmixOut::Effect(PmixEffect::Replace));
    }

    /// The DVM is terminating: the worker ends now and no server is asked for after this.
    pub(crate) fn end_now(&mut self) {
        if !self.ended {
            self.ended = true;
            self.out.push(PmixOut::Effect(PmixEffect::End));
        }
    }

    /// The worker ended by itself (crashed, killed; `pid`, `how`): every job with ranks here
    /// loses its PMIx server, so each fails naming this node; the next job gets a new worker.
    pub(crate) fn worker_lost(&mut self, pid: u32, how: &str) {
        error!("daemon {} on host {}: its PMIx server process (pid {pid}) ended: {how}", self.me, self.host);
        let jobs: Vec<u32> = self.jobs.keys().copied().collect();
        for jobid in jobs {
            self.fail_job(jobid, &format!("(pid {pid}) ended while job {jobid} ran: {how}"));
        }
        // The jobs keep their entries until their procs end (exits still come), but no reply
        // can reach a client any more.
        for job in self.jobs.values_mut() {
            job.registered = false;
        }
        self.fences.clear();
        self.asked.clear();
        self.serving.clear();
        self.spawns.clear();
        self.data.clear();
        self.deferred.clear();
        self.worker_gone();
    }

    /// These daemons were declared dead: a direct modex asked of one is answered now (its
    /// answer can never come), so no client waits for ever and the worker can go idle.
    pub(crate) fn daemons_lost(&mut self, host: &mut impl Host, failed: &BTreeSet<Rank>) {
        let lost: Vec<u64> = self.asked.iter().filter(|(_, a)| failed.contains(&a.owner)).map(|(id, _)| *id).collect();
        for id in lost {
            let a = self.asked.remove(&id).expect("listed");
            warn!(owner = a.owner, nspace = %a.nspace, "direct modex failed: daemon {} was lost", a.owner);
            self.reply(a.reply, crate::pmixdef::ERR_LOST_CONNECTION);
        }
        self.maybe_recycle(host);
    }

    fn job_of(&self, nspace: &str) -> Option<u32> {
        self.by_nspace.get(nspace).copied()
    }
}
