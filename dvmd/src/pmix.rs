//! The daemon as a PMIx host: every daemon runs libpmix's server (through `pmix-shim`),
//! registers each job's namespace from the job map, gives every local rank the environment
//! `setup_fork` returns, and answers the upcalls from its actor loop — never inside them.
//!
//! - fence_nb -> grpcomm fence: participants from the procs array (wildcard = every daemon
//!   hosting the job), movement from `PMIX_COLLECT_DATA` only, `PMIX_TIMEOUT` honoured; the
//!   k-th fence over a participant set is fence k (grpcomm numbers them).
//! - direct_modex -> asked of the daemon hosting the proc (routed on the tree), which answers
//!   with `PMIx_server_dmodex_request`.
//! - abort: reply first, then the job fails once the aborting rank has exited (the order that
//!   keeps libpmix healthy); log: the text reaches prun.
//! - topology: libpmix discovers the node's hardware topology once, in `PMIx_server_init`;
//!   the daemon asks it to share it ([`share_topology`]), so every namespace carries it as
//!   job-level data and Open MPI 4.1's ranks adopt it instead of each discovering it again.
//!
//! Trap (libpmix 4.2.2, measured in docs/soak.md): the server never frees what it holds for a
//! client once the client has connected — not when it disconnects, not on `deregister_client`
//! or `deregister_nspace`; only `PMIx_server_finalize` does, and the server cannot be started
//! again in the same process (its listener is set up once per process). With the shared-memory
//! store (ds21, libpmix's default) that is ~39 KiB per 8-rank job on every daemon; ranks are
//! therefore told to use the hash store ([`CLIENT_GDS`]), which leaves ~15 KiB. A job may
//! still choose with `-x PMIX_GDS_MODULE=...`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use bytes::Bytes;
use dvm_grpcomm::{FenceError, FenceRequest as GFence, FenceSignature, Participants};
use dvm_proto::daemon::{daemon_cmd, DmodexReq, DmodexResp, JobAbort, JobLog};
use dvm_proto::job::JobMap;
use dvm_rml::Rank;
use pmix_shim::{FenceReply, JobInfo, ModexReply, PmixEvent, PmixServer, ProcId, ServerConfig};
use tracing::{debug, error, info, warn};

use crate::daemon::Daemon;
use crate::jobmap::Placement;

/// One job's namespace on this daemon.
struct PmixJob {
    nspace: String,
    placement: Placement,
    registered: bool,
    connected: BTreeSet<u32>,
    finalized: BTreeSet<u32>,
    sigs: BTreeSet<FenceSignature>,
}

/// This daemon's PMIx server and the upcalls waiting for an answer.
pub(crate) struct PmixHost {
    server: PmixServer,
    jobs: BTreeMap<u32, PmixJob>,
    by_nspace: BTreeMap<String, u32>,
    /// Fences this daemon runs for libpmix, by the key the core returns them with.
    fences: BTreeMap<u64, FenceReply>,
    /// Direct modex requests this daemon asked of others (by our id).
    asked: BTreeMap<u64, ModexReply>,
    /// Requests this daemon serves: shim request id -> (asking daemon, its id).
    serving: BTreeMap<u64, (Rank, u64)>,
    next_id: u64,
}

/// Namespace of a job: unique per DVM (HNP host and pid), so two DVMs on one host never share
/// one (Open MPI derives its job id and session paths from it).
pub fn nspace_of(dvm: &str, jobid: u32) -> String {
    format!("dvm-{dvm}-job{jobid}")
}

/// The PMIx data store every rank uses (`PMIX_GDS_MODULE`). libpmix 4.2.2 keeps the
/// shared-memory store's per-client records for the daemon's lifetime; the hash store keeps
/// far less (docs/soak.md).
pub const CLIENT_GDS: &str = "hash";

/// The Open MPI setting that makes a waiting rank yield its core instead of busy-polling.
pub const YIELD_VAR: &str = "OMPI_MCA_mpi_yield_when_idle";

/// Cores this daemon's ranks may run on: the CPUs of the daemon's affinity mask (ranks inherit
/// it), capped by a cgroup CPU quota, as `std::thread::available_parallelism` counts them.
pub fn node_cores() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX))
}

/// Whether a job's ranks on a machine are told to yield when idle: more of its procs there
/// than the machine has cores (Open MPI's own launcher decides the same way). Waiting ranks
/// that busy-poll otherwise take the cores their peers need to make progress.
pub fn oversubscribed(procs_on_machine: u32, cores: u32) -> bool {
    procs_on_machine > cores
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

fn fence_status(e: &FenceError) -> pmix_shim::Status {
    match e {
        FenceError::Timeout { .. } => pmix_shim::ERR_TIMEOUT,
        _ => pmix_shim::ERROR,
    }
}

impl Daemon {
    /// Where this daemon's PMIx server will keep its files. The server itself starts when
    /// the first job reaches this daemon: an idle daemon stays small and boots fast.
    pub fn set_pmix_dir(&mut self, tmpdir: &Path) {
        self.pmix_dir = Some(tmpdir.to_path_buf());
    }

    fn pmix_config(&self, dir: std::path::PathBuf) -> ServerConfig {
        let mut cfg = ServerConfig::new(dir);
        cfg.hostname = Some(self.host.clone());
        // libpmix discovers the topology in PMIx_server_init either way; shared, each rank
        // adopts it (shared memory, else XML) instead of discovering it again.
        cfg.share_topology = share_topology();
        cfg
    }

    /// Start the PMIx server now on a helper thread, so it is ready when a job arrives (a
    /// one-shot DVM knows one is coming); the boot does not wait for it.
    pub fn start_pmix_background(&mut self) {
        let Some(dir) = self.pmix_dir.take() else { return };
        let cfg = self.pmix_config(dir);
        let tx = self.pmix_tx.clone();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new().name("pmix-start".into()).spawn(move || {
            let r = PmixServer::init(&cfg, move |ev| {
                let _ = tx.send(ev);
            });
            let _ = done_tx.send(r);
        });
        match spawned {
            Ok(_) => self.pmix_pending = Some(done_rx),
            Err(e) => error!("cannot start the PMIx server thread: {e}"),
        }
    }

    /// Start the PMIx server if it is not running yet (once; a failure is logged and MPI
    /// ranks then fail at MPI_Init, other jobs run).
    pub(crate) fn ensure_pmix(&mut self) -> bool {
        if self.pmix_ref().is_some() {
            return true;
        }
        let started = if let Some(rx) = self.pmix_pending.take() {
            // Started in the background: wait for the rest of its start-up.
            rx.recv().unwrap_or_else(|_| {
                Err(pmix_shim::PmixError::InvalidArgument { op: "init", detail: "the PMIx start thread died".into() })
            })
        } else {
            let Some(dir) = self.pmix_dir.take() else { return false };
            let cfg = self.pmix_config(dir);
            let tx = self.pmix_tx.clone();
            PmixServer::init(&cfg, move |ev| {
                let _ = tx.send(ev);
            })
        };
        match started {
            Ok(server) => {
                info!(version = %PmixServer::version(), topology_shared = share_topology(), "PMIx server up");
                self.set_pmix(PmixHost {
                    server,
                    jobs: BTreeMap::new(),
                    by_nspace: BTreeMap::new(),
                    fences: BTreeMap::new(),
                    asked: BTreeMap::new(),
                    serving: BTreeMap::new(),
                    next_id: 1,
                });
                true
            }
            Err(e) => {
                error!("daemon {} on host {}: PMIx server unavailable, MPI ranks will fail: {e}", self.me, self.host);
                false
            }
        }
    }

    /// Register a job's namespace before its first local rank starts. Returns false (job
    /// runs without PMIx) if the server refuses it.
    pub(crate) fn pmix_job_start(&mut self, jobid: u32, map: &JobMap, nlocal: u32) -> bool {
        if !self.ensure_pmix() {
            return false;
        }
        let hosts: Vec<(Rank, String)> = match Placement::from_job_map(map) {
            Ok(p) => p.daemons().map(|d| (d, self.host_of(d))).collect(),
            Err(e) => {
                warn!(jobid, "job map unusable for PMIx: {e}");
                return false;
            }
        };
        let nspace = nspace_of(&self.dvm_id(), jobid);
        let Some(px) = self.pmix_mut() else { return false };
        let Ok(placement) = Placement::from_job_map(map) else { return false };
        let proc_map: Vec<Vec<u32>> = hosts.iter().map(|(d, _)| placement.procs_on(*d).iter().collect()).collect();
        let info = JobInfo {
            node_map: hosts.iter().map(|(_, h)| h.clone()).collect(),
            proc_map,
            job_size: map.nprocs,
            universe_size: map.nprocs,
            appnum: 0,
            jobid: Some(nspace.clone()),
            max_procs: None,
            extra: Vec::new(),
        };
        let registered = match px.server.register_nspace(&nspace, nlocal, &info) {
            Ok(took) => {
                debug!(jobid, %nspace, ?took, "PMIx namespace registered");
                true
            }
            Err(e) => {
                warn!(jobid, %nspace, "cannot register the PMIx namespace: {e}");
                false
            }
        };
        px.by_nspace.insert(nspace.clone(), jobid);
        px.jobs.insert(
            jobid,
            PmixJob {
                nspace,
                placement,
                registered,
                connected: BTreeSet::new(),
                finalized: BTreeSet::new(),
                sigs: BTreeSet::new(),
            },
        );
        registered
    }

    /// The PMIx environment of one local rank (register_client + setup_fork + Open MPI's
    /// settings for running under a non-mpirun launcher). `yield_idle`: the rank's machine is
    /// oversubscribed (see [`oversubscribed`]), so it is told to yield while it waits.
    pub(crate) fn pmix_proc_env(
        &mut self,
        jobid: u32,
        rank: u32,
        loopback: bool,
        yield_idle: bool,
    ) -> Vec<(String, String)> {
        let session = self.session_dir();
        let Some(px) = self.pmix_mut() else { return Vec::new() };
        let Some(job) = px.jobs.get(&jobid).filter(|j| j.registered) else { return Vec::new() };
        let (uid, gid) = (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw());
        if let Err(e) = px.server.register_client(&job.nspace, rank, uid, gid) {
            warn!(jobid, rank, "cannot register PMIx client: {e}");
            return Vec::new();
        }
        let mut env = match px.server.setup_fork(&job.nspace, rank) {
            Ok(env) => env,
            Err(e) => {
                warn!(jobid, rank, "PMIx setup_fork failed: {e}");
                return Vec::new();
            }
        };
        // setup_fork offers every store libpmix has (the client picks the first): offer one.
        env.retain(|(k, _)| k != "PMIX_GDS_MODULE");
        env.push(("PMIX_GDS_MODULE".into(), CLIENT_GDS.into()));
        // Open MPI 4.1 treats a rank it did not start as a singleton without this.
        env.push(("OMPI_MCA_schizo".into(), "^orte".into()));
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
    pub(crate) fn pmix_proc_exit(&mut self, jobid: u32, rank: u32) -> Option<String> {
        let host = self.host.clone();
        let px = self.pmix_mut()?;
        let job = px.jobs.get(&jobid)?;
        (job.connected.contains(&rank) && !job.finalized.contains(&rank))
            .then(|| format!("rank {rank} on node {host} exited without calling MPI_Finalize"))
    }

    /// Every local rank of a job is gone: drop its namespace and fence signatures.
    pub(crate) fn pmix_job_done(&mut self, jobid: u32) {
        let Some(px) = self.pmix_mut() else { return };
        let Some(job) = px.jobs.remove(&jobid) else { return };
        px.by_nspace.remove(&job.nspace);
        if job.registered {
            if let Err(e) = px.server.deregister_nspace_nb(&job.nspace) {
                warn!(jobid, "deregister_nspace: {e}");
            }
        }
        for sig in job.sigs {
            self.submit(dvm_core::Input::ForgetFence(sig));
        }
    }

    /// A fence this daemon runs for PMIx completed: answer libpmix.
    pub(crate) fn pmix_fence_done(&mut self, key: u64, result: Result<Bytes, FenceError>) {
        let Some(reply) = self.pmix_mut().and_then(|px| px.fences.remove(&key)) else {
            warn!(key, "a PMIx fence completed with no upcall waiting for it");
            return;
        };
        match result {
            Ok(data) => reply.complete(pmix_shim::SUCCESS, &data),
            Err(e) => {
                warn!(key, "PMIx fence failed: {e}");
                reply.complete(fence_status(&e), &[]);
            }
        }
    }

    pub(crate) fn on_pmix(&mut self, ev: PmixEvent) {
        debug!(kind = ev.kind(), "PMIx upcall");
        match ev {
            PmixEvent::ClientConnected { proc, reply } => {
                if let (Some(job), pmix_shim::Rank::Id(r)) = (self.pmix_job_of(&proc.nspace), proc.rank) {
                    if let Some(j) = self.pmix_mut().and_then(|p| p.jobs.get_mut(&job)) {
                        j.connected.insert(r);
                    }
                }
                reply.complete(pmix_shim::SUCCESS);
            }
            PmixEvent::ClientFinalized { proc, reply } => {
                if let (Some(job), pmix_shim::Rank::Id(r)) = (self.pmix_job_of(&proc.nspace), proc.rank) {
                    if let Some(j) = self.pmix_mut().and_then(|p| p.jobs.get_mut(&job)) {
                        j.finalized.insert(r);
                    }
                }
                reply.complete(pmix_shim::SUCCESS);
            }
            PmixEvent::Abort { proc, status, message, reply, .. } => {
                // Reply first; the job fails when the aborting rank has exited.
                reply.complete(pmix_shim::SUCCESS);
                let (Some(jobid), pmix_shim::Rank::Id(rank)) = (self.pmix_job_of(&proc.nspace), proc.rank) else {
                    return;
                };
                let abort = JobAbort { jobid, rank, code: status, message, daemon: self.me };
                self.send_job_cmd(0, daemon_cmd::Body::JobAbort(abort));
            }
            PmixEvent::Log { client, text, reply, .. } => {
                reply.complete(pmix_shim::SUCCESS);
                if let (Some(jobid), Some(text)) = (self.pmix_job_of(&client.nspace), text) {
                    let rank = match client.rank {
                        pmix_shim::Rank::Id(r) => r,
                        _ => u32::MAX,
                    };
                    self.send_job_cmd(0, daemon_cmd::Body::JobLog(JobLog { jobid, rank, text, daemon: self.me }));
                }
            }
            PmixEvent::FenceNb(req) => self.pmix_fence(req),
            PmixEvent::DirectModex { proc, reply, .. } => self.pmix_direct_modex(proc, reply),
            PmixEvent::DmodexData { request, status, data, .. } => {
                let Some(px) = self.pmix_mut() else { return };
                let Some((asker, id)) = px.serving.remove(&request) else { return };
                if asker == self.me {
                    if let Some(reply) = self.pmix_mut().and_then(|p| p.asked.remove(&id)) {
                        reply.complete(status, &data);
                    }
                } else {
                    let resp = DmodexResp { id, status, data: data.into() };
                    self.send_job_cmd(asker, daemon_cmd::Body::DmodexResp(resp));
                }
            }
            PmixEvent::JobControl { reply, .. } => reply.complete(pmix_shim::ERR_NOT_SUPPORTED),
            PmixEvent::NspaceDeregistered { nspace, status } => debug!(%nspace, status, "PMIx namespace deregistered"),
        }
    }

    fn pmix_job_of(&self, nspace: &str) -> Option<u32> {
        self.pmix_ref()?.by_nspace.get(nspace).copied()
    }

    fn pmix_fence(&mut self, req: pmix_shim::FenceRequest) {
        let nspace = req.procs.first().map(|p| p.nspace.clone()).unwrap_or_default();
        let Some(jobid) = self.pmix_job_of(&nspace) else {
            warn!(%nspace, "fence for an unknown namespace");
            req.reply.complete(pmix_shim::ERR_NOT_FOUND, &[]);
            return;
        };
        if let Some(st) = req.local_status.filter(|&s| s != pmix_shim::SUCCESS) {
            warn!(jobid, status = st, node = %self.host, "a local rank of job {jobid} left a fence (status {st})");
            req.reply.complete(st, &[]);
            return;
        }
        let px = self.pmix_ref().expect("job known");
        let job = &px.jobs[&jobid];
        let wildcard = req.procs.iter().any(|p| !matches!(p.rank, pmix_shim::Rank::Id(_)));
        let (key, mut daemons): (String, Vec<Rank>) = if wildcard {
            (format!("{nspace}:*"), job.placement.daemons().collect())
        } else {
            let mut ranks: Vec<u32> = req
                .procs
                .iter()
                .filter_map(|p| match p.rank {
                    pmix_shim::Rank::Id(r) => Some(r),
                    _ => None,
                })
                .collect();
            ranks.sort_unstable();
            ranks.dedup();
            let ds = ranks.iter().filter_map(|&r| job.placement.node_of(r)).collect();
            (format!("{nspace}:{}", ranks.iter().map(u32::to_string).collect::<Vec<_>>().join(",")), ds)
        };
        daemons.sort_unstable();
        daemons.dedup();
        let sig = FenceSignature::new(key.into_bytes(), Participants::Daemons(daemons));
        let timeout = req.timeout.filter(|&t| t > 0).map(|t| t as u64 * 1_000_000_000);
        let Some(px) = self.pmix_mut() else { return };
        let key = px.next_id;
        px.next_id += 1;
        if let Some(job) = px.jobs.get_mut(&jobid) {
            job.sigs.insert(sig.clone());
        }
        px.fences.insert(key, req.reply);
        debug!(jobid, %nspace, collect = req.collect, key, "PMIx fence upcall -> grpcomm fence");
        let fence = GFence { sig, collect: req.collect, data: Bytes::from(req.data), timeout };
        self.submit(dvm_core::Input::Fence { owner: dvm_core::FenceOwner::Pmix(key), req: fence });
    }

    fn pmix_direct_modex(&mut self, proc: ProcId, reply: ModexReply) {
        let (Some(jobid), pmix_shim::Rank::Id(rank)) = (self.pmix_job_of(&proc.nspace), proc.rank) else {
            reply.complete(pmix_shim::ERR_NOT_FOUND, &[]);
            return;
        };
        let me = self.me;
        let px = self.pmix_mut().expect("job known");
        let Some(owner) = px.jobs[&jobid].placement.node_of(rank) else {
            reply.complete(pmix_shim::ERR_NOT_FOUND, &[]);
            return;
        };
        let id = px.next_id;
        px.next_id += 1;
        px.asked.insert(id, reply);
        info!(jobid, rank, owner, "direct modex: asking daemon {owner} for rank {rank}");
        let req = DmodexReq { id, nspace: proc.nspace, rank };
        if owner == me {
            self.serve_dmodex(me, req);
        } else {
            self.send_job_cmd(owner, daemon_cmd::Body::DmodexReq(req));
        }
    }

    pub(crate) fn serve_dmodex(&mut self, asker: Rank, req: DmodexReq) {
        let Some(px) = self.pmix_mut() else { return };
        match px.server.dmodex_request(&req.nspace, req.rank) {
            Ok(request) => {
                px.serving.insert(request, (asker, req.id));
                info!(nspace = %req.nspace, rank = req.rank, asker, "direct modex served");
            }
            Err(e) => {
                warn!(rank = req.rank, "dmodex_request failed: {e}");
                let resp = DmodexResp { id: req.id, status: pmix_shim::ERROR, data: Bytes::new() };
                if asker == self.me {
                    self.on_dmodex_resp(resp);
                } else {
                    self.send_job_cmd(asker, daemon_cmd::Body::DmodexResp(resp));
                }
            }
        }
    }

    pub(crate) fn on_dmodex_resp(&mut self, resp: DmodexResp) {
        if let Some(reply) = self.pmix_mut().and_then(|p| p.asked.remove(&resp.id)) {
            reply.complete(resp.status, &resp.data);
        }
    }
}
