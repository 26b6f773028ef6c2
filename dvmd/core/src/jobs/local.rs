//! A daemon's part of each job: the maps (broadcast) and its residual (scattered) in, the
//! specs of its local procs out, then their exits reported to the HNP.
//!
//! Launch: the procs start once both the maps and the residual are here (they may arrive in
//! either order). A proc's environment is, in this order (later wins): the daemon's own
//! (minus its `DVM_*`), the app's `-x`/`--env`, the DVM's `DVM_*` facts of the rank, then the
//! PMIx environment (unless the app set the same key). A job with more procs on this machine
//! than it has cores, counting the other jobs running there, is oversubscribed: its ranks are
//! told to yield when idle (unless the environment says otherwise) and get a coarser timer
//! slack.
//!
//! Never: a process. Specs leave as [`ProcCmd::Spawn`], in rank order; the PMIx server is
//! asked through [`crate::pmix::With`] in the order the job needs (learn, register, each rank's env).
//! Invariants: a job's procs start at most once; a daemon that cannot start its part reports
//! every rank of its residual failed, so no job waits for procs that never start.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use dvm_proto::daemon::{daemon_cmd, BindingReport, LaunchReport, StackResp, StackTrace};
use dvm_proto::job::{IofChunk, JobControl, JobMap, MpiInterface, ProcStatus, Residual, StdinChunk, StdinTarget};
use dvm_proto::Message;
use dvm_rml::Rank;
use tracing::{debug, warn};

use super::{nspace_of, ExitKind, ProcCmd, ProcEvent, ProcSpec};
use crate::host::Host;
use crate::host::JobStart;
use crate::jobmap::{self, place_node, Bind, BindError, Level, NodeTopo, Placement, Plan};
use crate::pmix::With;
use crate::Core;

/// Timer slack (µs) of the procs on a machine the job oversubscribes (more of its procs than
/// cores): a waiting rank that sleeps in short steps then wakes with other timers instead of
/// alone (docs/slurm.md). `-x DVM_TIMER_SLACK_US=N` sets another value (0: the kernel's).
pub const OVERSUBSCRIBED_TIMER_SLACK_US: u64 = 2_000;

/// The Open MPI setting that makes a waiting rank yield its core instead of busy-polling.
pub const YIELD_VAR: &str = "OMPI_MCA_mpi_yield_when_idle";

/// Intel MPI's: its ranks wait in the kernel instead of spinning.
pub const INTEL_WAIT_VAR: &str = "I_MPI_WAIT_MODE";

/// Whether a job's ranks on a machine are told to yield when idle: more of its procs there
/// than the machine has cores (Open MPI's own launcher decides the same way).
pub fn oversubscribed(procs_on_machine: u32, cores: u32) -> bool {
    procs_on_machine > cores
}

/// The signal a proc of a job killed before it started here is reported ended by (SIGTERM,
/// what the kill would have sent it).
const KILLED_BEFORE_START: i32 = 15;

/// A proc's binding: the level and the PUs' OS indices.
type Bound = (Level, Vec<u32>);

/// A rankfile's cpus for this daemon's procs (from the residual, in rank order), checked:
/// one valid cpu list per proc.
fn pinned(cpus: &[String], n: usize) -> Result<Vec<Option<Bound>>, String> {
    if cpus.len() != n {
        return Err(format!("the residual gives cpus for {} of its {n} ranks", cpus.len()));
    }
    cpus.iter()
        .map(|c| match jobmap::topo::parse_list(c) {
            Some(os) if !os.is_empty() => Ok(Some((Level::Hwthread, os))),
            _ => Err(format!("the residual's cpu list '{c}' is malformed")),
        })
        .collect()
}

/// What a daemon's launch depends on besides the job.
#[derive(Debug, Clone, Default)]
pub struct LocalConfig {
    /// The daemon's own environment minus its `DVM_*` variables: every proc's base.
    pub base_env: Vec<(String, String)>,
    /// The daemon's scratch directory for its ranks.
    pub session_dir: Option<String>,
    /// The daemon listens on loopback: every daemon of the DVM is on this machine.
    pub loopback: bool,
    /// Cores the ranks may run on.
    pub cores: u32,
    /// This node's hardware (binding needs it; without it every proc runs unbound).
    pub topo: Option<std::sync::Arc<NodeTopo>>,
    /// The interface a job gets when it asks for none (`dvmd --mpi`; `MPI_DEFAULT`: both).
    pub mpi: MpiInterface,
    /// The PMIx client library, for MPIs that load one when told to (Intel MPI's
    /// `I_MPI_PMI_LIBRARY` under `--mpi pmix`).
    pub pmix_library: Option<String>,
}

/// What the local jobs ask of the node, in order.
#[derive(Debug)]
pub enum LocalOut {
    /// Of the process layer.
    Proc(ProcCmd),
    /// A command to the HNP.
    ToHnp(daemon_cmd::Body),
}

#[derive(Debug, Default)]
struct LocalJob {
    map: Option<JobMap>,
    residual: Option<Residual>,
    started: bool,
    live: u32,
    /// This daemon's ranks of the job, as `jobmap::local_procs` derived them.
    ranks: Vec<u32>,
    /// Procs not yet reported started or failed, when the map asks for a `LaunchReport`.
    unstarted: Option<u32>,
    /// The job was killed before its procs started here: they never start.
    killed: bool,
}

/// Jobs cleaned up here that are remembered, so a late copy of their launch is ignored.
const REMEMBER_ENDED: usize = 4096;

/// This daemon's jobs.
#[derive(Debug, Default)]
pub struct LocalJobs {
    cfg: LocalConfig,
    jobs: BTreeMap<u32, LocalJob>,
    /// The most recent jobs cleaned up here: their maps or residuals arriving late (a
    /// residual sent again after a loss) start nothing.
    ended: BTreeSet<u32>,
    /// The slot each live proc here holds, (job, rank) -> index: the lowest free one when it
    /// started (`DVM_SLOT`), so no two live procs share one; past the node's slots only when
    /// oversubscribed.
    slot_of: BTreeMap<(u32, u32), u32>,
    /// The PUs (OS indices) each live bound proc here holds: a later job's procs are bound
    /// to free ones first.
    cpus_of: BTreeMap<(u32, u32), Vec<u32>>,
    pub(crate) out: Vec<LocalOut>,
}

impl LocalJobs {
    pub fn new(cfg: LocalConfig) -> LocalJobs {
        LocalJobs {
            cfg,
            jobs: BTreeMap::new(),
            ended: BTreeSet::new(),
            slot_of: BTreeMap::new(),
            cpus_of: BTreeMap::new(),
            out: Vec::new(),
        }
    }

    /// Jobs with state on this daemon.
    pub fn len(&self) -> usize {
        self.jobs.len()
    }
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }
    /// Procs of `jobid` this daemon started that have not ended.
    pub fn live(&self, jobid: u32) -> u32 {
        self.jobs.get(&jobid).map_or(0, |j| j.live)
    }

    pub(crate) fn on_map(&mut self, r: &Core, host: &mut With<'_, impl Host>, payload: Bytes) {
        let map = match JobMap::decode(payload) {
            Ok(m) => m,
            Err(e) => return warn!("undecodable launch map: {e}"),
        };
        let jobid = map.jobid;
        if self.ended.contains(&jobid) {
            return;
        }
        // Every daemon knows every job's placement (a peer of another job after a connect, a
        // spawned job's participants).
        match Placement::from_job_map(&map) {
            Ok(p) => {
                let hosts = p.daemons().map(|d| r.host_of(d)).collect();
                host.pmix_learn_job(jobid, nspace_of(&r.dvm_id(), jobid), p, hosts)
            }
            Err(e) => warn!(jobid, "job map unusable: {e}"),
        }
        self.jobs.entry(jobid).or_default().map = Some(map);
        self.maybe_start(r, host, jobid);
    }

    pub(crate) fn on_residual(&mut self, r: &Core, host: &mut With<'_, impl Host>, data: Bytes) {
        match Residual::decode(data) {
            Ok(res) => {
                let jobid = res.jobid;
                if self.ended.contains(&jobid) {
                    return;
                }
                self.jobs.entry(jobid).or_default().residual = Some(res);
                self.maybe_start(r, host, jobid);
            }
            Err(e) => warn!("undecodable launch residual: {e}"),
        }
    }

    fn maybe_start(&mut self, r: &Core, host: &mut With<'_, impl Host>, jobid: u32) {
        let me = r.me();
        let Some(lj) = self.jobs.get(&jobid) else { return };
        let (Some(map), Some(residual), false) = (lj.map.clone(), lj.residual.clone(), lj.started) else { return };
        let node = r.host_of(me);
        let placed = jobmap::local_procs(&map, &residual, me).map_err(|e| e.to_string()).and_then(|procs| {
            let bound = if residual.cpus.is_empty() {
                self.bindings(&node, jobid, &map, procs.len() as u32).map_err(|e| e.to_string())?
            } else {
                pinned(&residual.cpus, procs.len())?
            };
            Ok((procs, bound))
        });
        let (procs, bound) = match placed {
            Ok(p) => p,
            Err(e) => {
                // Never leave the job waiting for procs that will not start: report every rank
                // the residual names as failed, with the reason.
                warn!(jobid, "daemon {me} cannot start its part of job {jobid}: {e}");
                self.jobs.remove(&jobid);
                let error = format!("node {node}: cannot start job {jobid}: {e}");
                let ranks = residual.ranks.iter().flat_map(|rr| {
                    (0..rr.count).map(move |i| rr.first.saturating_add(i.saturating_mul(rr.stride.max(1))))
                });
                for rank in ranks {
                    let st = ProcStatus {
                        jobid,
                        rank,
                        exit_code: 127,
                        error: error.clone(),
                        daemon: me,
                        ..Default::default()
                    };
                    self.out.push(LocalOut::ToHnp(daemon_cmd::Body::ProcStatus(st)));
                }
                return;
            }
        };
        let lj = self.jobs.get_mut(&jobid).expect("present");
        if lj.killed {
            // Killed before its launch reached this daemon whole (a residual sent again after
            // a loss): its procs are reported ended by the kill, and never start.
            lj.started = true;
            for p in &procs {
                let st =
                    ProcStatus { jobid, rank: p.rank, signal: KILLED_BEFORE_START, daemon: me, ..Default::default() };
                self.out.push(LocalOut::ToHnp(daemon_cmd::Body::ProcStatus(st)));
            }
            return;
        }
        lj.started = true;
        lj.live = procs.len() as u32;
        lj.ranks = procs.iter().map(|p| p.rank).collect();
        if map.report_launch {
            lj.unstarted = Some(procs.len() as u32);
        }
        let places = procs
            .iter()
            .zip(&bound)
            .filter_map(|(p, b)| b.as_ref().map(|(_, os)| (p.rank, jobmap::topo::list_text(os), self.locality(os))))
            .collect();
        let mpi = super::mpi::Interface::of(map.mpi, self.cfg.mpi);
        let pmix = mpi.pmix() && Self::pmix_job_start(r, host, jobid, &map, procs.len() as u32, places);
        if let (true, Some(why)) = (pmix, mpi.pmix_refusal()) {
            host.pmix.refuse_clients(jobid, why);
        }
        if mpi.pmi_fd() {
            Self::pmi_job_start(r, host, jobid, &map, mpi);
        }
        let env = self.cfg.base_env.clone();
        // Procs of this job competing for this machine's cores. A loopback DVM (`--local`) has
        // every daemon on this machine: all of the job's procs; otherwise this daemon's own.
        // A setting in the daemon's environment (inherited by the ranks) or `-x` wins.
        // Other jobs running here compete too (a shared or explicitly oversubscribed DVM).
        let others: u32 = self
            .jobs
            .iter()
            .filter(|(&id, j)| id != jobid && !j.killed)
            .map(|(_, j)| if self.cfg.loopback { j.map.as_ref().map_or(0, |m| m.nprocs) } else { j.live })
            .sum();
        let on_machine = others + if self.cfg.loopback { map.nprocs } else { procs.len() as u32 };
        let over = oversubscribed(on_machine, self.cfg.cores);
        let yield_idle = over && !env.iter().any(|(k, _)| k == YIELD_VAR);
        let timer_slack_us = if over { OVERSUBSCRIBED_TIMER_SLACK_US } else { 0 };
        let stdin_rank = match StdinTarget::try_from(map.stdin_target) {
            Ok(StdinTarget::All) => None,
            Ok(StdinTarget::None) => Some(u32::MAX),
            _ => Some(map.stdin_rank),
        };
        if map.report_bindings {
            let lines = procs.iter().zip(&bound).map(|(p, b)| self.binding_line(&node, p.rank, b.as_ref())).collect();
            let report = BindingReport { jobid, daemon: me, lines };
            self.out.push(LocalOut::ToHnp(daemon_cmd::Body::BindingReport(report)));
        }
        for (p, bound) in procs.into_iter().zip(bound) {
            let app = &map.apps[p.app as usize];
            let mut penv = env.clone();
            for kv in &app.env {
                if let Some((k, v)) = kv.split_once('=') {
                    penv.retain(|(ek, _)| ek != k);
                    penv.push((k.to_string(), v.to_string()));
                }
            }
            for (k, v) in [
                ("DVM_JOBID", jobid.to_string()),
                ("DVM_RANK", p.rank.to_string()),
                ("DVM_SIZE", map.nprocs.to_string()),
                ("DVM_LOCAL_RANK", p.local_rank.to_string()),
                ("DVM_NODE_RANK", p.node_rank.to_string()),
                ("DVM_APPNUM", p.app.to_string()),
                ("DVM_NODE", node.clone()),
                ("DVM_DAEMON", me.to_string()),
                ("DVM_SLOT", self.take_slot(jobid, p.rank).to_string()),
            ] {
                penv.push((k.to_string(), v));
            }
            let mut interface_env = mpi.env(self.cfg.pmix_library.as_deref());
            if over && mpi.pmi_fd() && !env.iter().any(|(k, _)| k == INTEL_WAIT_VAR) {
                // Intel MPI's ranks spin while they wait unless told otherwise (a 4-rank
                // Allreduce on 2 cores: 106 s spinning, 1.1 s waiting).
                interface_env.push((INTEL_WAIT_VAR.into(), "1".into()));
            }
            let pmi_env = if mpi.pmi_fd() { host.pmi.proc_env(jobid, p.rank) } else { Vec::new() };
            for (k, v) in interface_env.into_iter().chain(pmi_env) {
                if !app.env.iter().any(|kv| kv.split_once('=').is_some_and(|(ak, _)| ak == k)) {
                    penv.retain(|(ek, _)| *ek != k);
                    penv.push((k, v));
                }
            }
            if pmix {
                let session = self.cfg.session_dir.clone();
                for (k, v) in host.pmix_proc_env(jobid, p.rank, session, self.cfg.loopback, yield_idle) {
                    if !app.env.iter().any(|kv| kv.split_once('=').is_some_and(|(ak, _)| ak == k)) {
                        penv.retain(|(ek, _)| *ek != k);
                        penv.push((k, v));
                    }
                }
            }
            self.out.push(LocalOut::Proc(ProcCmd::Spawn(ProcSpec {
                jobid,
                rank: p.rank,
                argv: match (&self.cfg.session_dir, app.preload_binary, app.argv.first()) {
                    (Some(session), true, Some(argv0)) => {
                        let mut argv = app.argv.clone();
                        argv[0] = super::preload::binary_path(session, jobid, argv0);
                        argv
                    }
                    _ => app.argv.clone(),
                },
                env: penv,
                wdir: app.wdir.clone().into(),
                stdin: stdin_rank.is_none_or(|r| r == p.rank),
                timer_slack_us,
                timestamp: map.timestamp_output,
                pmi_fd: mpi.pmi_fd().then_some(crate::pmi::PMI_CHILD_FD),
                cpus: bound.map(|(_, os)| {
                    self.cpus_of.insert((jobid, p.rank), os.clone());
                    os
                }),
            })));
        }
        if self.jobs.get(&jobid).is_some_and(|j| j.live == 0) {
            self.jobs.remove(&jobid);
            host.pmix_job_done(jobid);
            host.pmi.job_done(jobid);
        }
    }

    /// Serve a job's PMI wire to its local ranks (or, under `--mpi pmix`, watch for ranks
    /// that speak it, to fail the job by name instead of letting them run as singletons).
    fn pmi_job_start(r: &Core, host: &mut With<'_, impl Host>, jobid: u32, map: &JobMap, mpi: super::mpi::Interface) {
        let placement = match Placement::from_job_map(map) {
            Ok(p) => p,
            Err(e) => return warn!(jobid, "job map unusable for PMI: {e}"),
        };
        let start = crate::pmi::PmiJobStart {
            jobid,
            kvsname: nspace_of(&r.dvm_id(), jobid),
            universe: map.universe.max(placement.nprocs()),
            placement,
            spawned: map.report_launch,
            refuse: mpi.pmi_refusal(),
            mpi: mpi.get(),
            cwd: map.apps.first().map(|a| a.wdir.clone()).unwrap_or_default(),
            app_env: map.apps.iter().map(|a| a.env.clone()).collect(),
            preput: map.pmi_preput.clone(),
        };
        host.pmi.job_start(start);
    }

    /// Where each of `n` local procs of a job is bound, in local rank order: the level and the
    /// PUs' OS indices (`None`: unbound). On a DVM whose daemons share this machine
    /// (loopback), nothing is bound unless the job asked (a binding, an object mapping or
    /// cpus per rank): each daemon would bind its procs to the same first cores.
    fn bindings(&self, node: &str, jobid: u32, map: &JobMap, n: u32) -> Result<Vec<Option<Bound>>, BindError> {
        let (Some(topo), Some(plan)) = (self.cfg.topo.as_ref(), map.plan.as_ref()) else {
            return Ok(vec![None; n as usize]);
        };
        let mut plan = Plan::from_wire(plan, map.nprocs);
        if self.cfg.loopback && plan.bind == Bind::Default && plan.map_obj.is_none() && plan.pe <= 1 {
            plan.bind = Bind::None;
        }
        let busy: BTreeSet<u32> =
            self.cpus_of.iter().filter(|((j, _), _)| *j != jobid).flat_map(|(_, c)| c.iter().copied()).collect();
        // Busy cpus only reorder choices; where that order overloads an object the HNP's did
        // not (objects of unequal size), the HNP's own placement is taken.
        let placed =
            place_node(topo, &plan, n, &busy, node).or_else(|_| place_node(topo, &plan, n, &BTreeSet::new(), node))?;
        Ok(placed.into_iter().map(|p| p.bound.map(|(l, pus)| (l, topo.os_set(&pus)))).collect())
    }

    /// PMIx's locality string of a set of PUs (OS indices) of this node.
    fn locality(&self, os: &[u32]) -> String {
        let Some(topo) = self.cfg.topo.as_ref() else { return String::new() };
        let pus: Vec<u32> = (0..topo.num_pus()).filter(|&p| os.contains(&topo.os_index(p))).collect();
        topo.locality_string(&pus)
    }

    /// `--report-bindings`: `[host:rank] bound to package[0][core:0-1] (cpus 0-3)`.
    fn binding_line(&self, node: &str, rank: u32, bound: Option<&(Level, Vec<u32>)>) -> String {
        let (Some((level, os)), Some(topo)) = (bound, self.cfg.topo.as_ref()) else {
            return format!("[{node}:{rank}] is not bound (any cpu of the node)");
        };
        let pus: Vec<u32> = (0..topo.num_pus()).filter(|&p| os.contains(&topo.os_index(p))).collect();
        let objs = |l: Level| -> String {
            let mut v: Vec<u32> = pus.iter().filter_map(|&p| topo.object_of(p, l)).collect();
            v.sort_unstable();
            v.dedup();
            jobmap::topo::list_text(&v)
        };
        let package =
            if topo.count(Level::Package) > 0 { format!("package[{}]", objs(Level::Package)) } else { String::new() };
        let inner = match level {
            Level::Package | Level::Node => String::new(),
            Level::Hwthread => format!("[hwt:{}]", objs(Level::Hwthread)),
            Level::L3 => format!("[l3cache:{}]", objs(Level::L3)),
            Level::Numa => format!("[numa:{}]", objs(Level::Numa)),
            Level::Core => format!("[core:{}]", objs(Level::Core)),
        };
        format!("[{node}:{rank}] bound to {package}{inner} (cpus {})", jobmap::topo::list_text(os))
    }

    /// Register a job's PMIx namespace on this daemon (what the job map says, with the hosts
    /// from the contact table); false: the job runs without PMIx.
    fn pmix_job_start(
        r: &Core,
        host: &mut With<'_, impl Host>,
        jobid: u32,
        map: &JobMap,
        nlocal: u32,
        bound: Vec<(u32, String, String)>,
    ) -> bool {
        let placement = match Placement::from_job_map(map) {
            Ok(p) => p,
            Err(e) => {
                warn!(jobid, "job map unusable for PMIx: {e}");
                return false;
            }
        };
        let hosts: Vec<String> = placement.daemons().map(|d| r.host_of(d)).collect();
        let nspace = nspace_of(&r.dvm_id(), jobid);
        host.pmix_job_start(JobStart {
            jobid,
            nspace,
            placement,
            hosts: &hosts,
            nprocs: map.nprocs,
            nlocal,
            bound,
            map,
        })
    }

    /// A `JOB_CONTROL` broadcast: kill, signal, or forget a job that ended. True when the
    /// daemon has no local job left after a cleanup.
    pub(crate) fn on_control(&mut self, host: &mut With<'_, impl Host>, payload: Bytes) -> bool {
        let Ok(ctl) = JobControl::decode(payload) else {
            warn!("undecodable job control");
            return false;
        };
        if ctl.cleanup {
            self.jobs.remove(&ctl.jobid);
            self.ended.insert(ctl.jobid);
            if self.ended.len() > REMEMBER_ENDED {
                self.ended.pop_first();
            }
            host.pmix_forget_job(ctl.jobid);
            host.pmi.job_done(ctl.jobid);
            self.out.push(LocalOut::Proc(ProcCmd::ForgetJob(ctl.jobid)));
            return self.jobs.is_empty();
        }
        if ctl.kill {
            self.jobs.entry(ctl.jobid).or_default().killed = true;
            self.out.push(LocalOut::Proc(ProcCmd::KillJob { jobid: ctl.jobid, grace_ms: ctl.grace_ms }));
        } else if ctl.signal != 0 {
            self.out.push(LocalOut::Proc(ProcCmd::SignalJob { jobid: ctl.jobid, signal: ctl.signal }));
        }
        false
    }

    /// prun's stdin for this daemon's ranks of a job.
    pub(crate) fn on_stdin(&mut self, chunk: StdinChunk) {
        let Some(lj) = self.jobs.get(&chunk.jobid) else { return };
        let Some(map) = lj.map.as_ref() else { return };
        let ranks: Vec<u32> = match StdinTarget::try_from(map.stdin_target) {
            Ok(StdinTarget::All) => lj.ranks.clone(),
            Ok(StdinTarget::None) => Vec::new(),
            _ => vec![map.stdin_rank],
        };
        for rank in ranks {
            let jobid = chunk.jobid;
            self.out.push(LocalOut::Proc(if chunk.eof {
                ProcCmd::CloseStdin { jobid, rank }
            } else {
                ProcCmd::WriteStdin { jobid, rank, data: chunk.data.clone() }
            }));
        }
    }

    /// An event of one of this daemon's processes.
    pub(crate) fn on_proc(&mut self, me: Rank, host: &mut With<'_, impl Host>, ev: ProcEvent) {
        match ev {
            ProcEvent::Started { jobid, rank, pid } => {
                debug!(jobid, rank, pid, "proc started");
                self.launch_progress(me, jobid, None);
            }
            ProcEvent::Output { jobid, rank, stream, data, read_at_us } => {
                let chunk = IofChunk { jobid, rank, stream: stream.wire(), data, eof: false, read_at_us };
                self.out.push(LocalOut::ToHnp(daemon_cmd::Body::Iof(chunk)));
            }
            ProcEvent::OutputClosed { .. } => {}
            ProcEvent::PmiData { jobid, rank, data } => host.pmi.on_data(jobid, rank, &data),
            ProcEvent::PmiClosed { jobid, rank } => host.pmi.on_closed(jobid, rank),
            ProcEvent::Exited { jobid, rank, pid, status } => {
                let (exit_code, signal) = match status {
                    ExitKind::Code(c) => (c, 0),
                    ExitKind::Signal(s) => (0, s),
                };
                let mut st = ProcStatus { jobid, rank, pid, exit_code, signal, error: String::new(), daemon: me };
                let pmi = host.pmi.proc_exit(jobid, rank);
                if let Some(why) = host.pmix_proc_exit(jobid, rank).or(pmi) {
                    if signal == 0 && exit_code == 0 {
                        st.exit_code = 1;
                        st.error = why;
                    }
                }
                self.proc_done(host, st);
            }
            ProcEvent::Stacks { id, jobid, traces, error } => {
                let traces = traces.into_iter().map(|(rank, pid, text)| StackTrace { rank, pid, text }).collect();
                let resp = StackResp { id, jobid, daemon: me, traces, error: error.unwrap_or_default() };
                self.out.push(LocalOut::ToHnp(daemon_cmd::Body::StackResp(resp)));
            }
            ProcEvent::LaunchFailed { jobid, rank, error } => {
                self.launch_progress(me, jobid, Some(error.clone()));
                self.proc_done(host, ProcStatus { jobid, rank, pid: 0, exit_code: 127, signal: 0, error, daemon: me });
            }
        }
    }

    /// A proc of a job whose map asks for a `LaunchReport` started (or failed to): report
    /// once every local proc did, or at the first failure.
    fn launch_progress(&mut self, me: Rank, jobid: u32, error: Option<String>) {
        let Some(lj) = self.jobs.get_mut(&jobid) else { return };
        let Some(left) = lj.unstarted.as_mut() else { return };
        *left = left.saturating_sub(1);
        if error.is_none() && *left > 0 {
            return;
        }
        lj.unstarted = None;
        let started = lj.ranks.len() as u32;
        let report = LaunchReport { jobid, daemon: me, started, error: error.unwrap_or_default() };
        self.out.push(LocalOut::ToHnp(daemon_cmd::Body::LaunchReport(report)));
    }

    /// The lowest slot index no live proc here holds, now held by (job, rank).
    fn take_slot(&mut self, jobid: u32, rank: u32) -> u32 {
        let held: BTreeSet<u32> = self.slot_of.values().copied().collect();
        let free = (0..).find(|i| !held.contains(i)).expect("fewer live procs than u32 values");
        self.slot_of.insert((jobid, rank), free);
        free
    }

    fn proc_done(&mut self, host: &mut With<'_, impl Host>, st: ProcStatus) {
        let jobid = st.jobid;
        self.slot_of.remove(&(jobid, st.rank));
        self.cpus_of.remove(&(jobid, st.rank));
        let mut done = false;
        if let Some(lj) = self.jobs.get_mut(&jobid) {
            lj.live = lj.live.saturating_sub(1);
            done = lj.live == 0;
        }
        self.out.push(LocalOut::ToHnp(daemon_cmd::Body::ProcStatus(st)));
        if done {
            host.pmix_job_done(jobid);
            host.pmi.job_done(jobid);
        }
    }
}
