//! Jobs on the DVM: the HNP's job table (map, launch, exits, output, kill, timeout) and each
//! daemon's local part (launch message in, processes out). Placement comes from `jobmap`,
//! processes from `odls`; this module decides and routes.
//!
//! Launch: the HNP maps the job, xcasts the maps (`LAUNCH`) and scatters the residuals
//! (`LAUNCH_RESIDUALS`) to the daemons that fork procs; each daemon starts its procs once it
//! holds both (they may arrive in either order). Procs report their exit to the HNP; the first
//! failure names rank, node, pid and status and kills the rest of the job (never the DVM).
//! Output travels daemon -> HNP -> prun with a credit window per daemon and job, so a slow
//! prun stalls the procs' pipes instead of making any daemon buffer without bound.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bytes::Bytes;
use dvm_grpcomm::tags;
use dvm_proto::control::{
    job_event, JobEnded, JobEvent, JobNotice, JobOutput, JobStarted, LaunchPlanReply, SignalReply,
};
use dvm_proto::daemon::daemon_cmd;
use dvm_proto::job::{IofAck, IofChunk, JobControl, JobMap, JobSpec, ProcStatus, Residual, StdinChunk, StdinTarget};
use dvm_proto::Message;
use dvm_rml::Rank;
use tokio::sync::mpsc;
use tonic::Status;
use tracing::{debug, info, warn};

use crate::control::ControlCmd;
use crate::daemon::{Daemon, Input};
use crate::jobmap::{self, NodeSlots, Placement};
use crate::odls::{ExitKind, OdlsEvent, ProcSpec, Stream};
use dvm_core::Input as CoreInput;

/// Output bytes a daemon may have in flight to the HNP per job before it stops reading.
pub const IOF_WINDOW: u32 = 1 << 20;
/// Grace between SIGTERM and SIGKILL when a job is killed.
pub const KILL_GRACE: Duration = Duration::from_secs(2);
/// Exit status of a job ended by `--timeout`.
pub const TIMEOUT_EXIT: i32 = 124;
/// Exit status of a job the DVM ended under: terminated (`pterm`) while it ran, or (in prun)
/// the head process lost.
pub const TERMINATED_EXIT: i32 = 125;

/// Timer slack (µs) of the procs on a machine the job oversubscribes (more of its procs than
/// cores). A waiting rank that sleeps in short steps (Open MPI 4.1 waits for every fence of
/// MPI_Init and MPI_Finalize with `usleep(100)` between progress calls: 10 000 wake-ups a
/// second) then wakes with other timers instead of alone, and leaves the cores to the ranks
/// that still work; a fence's end reaches it at most this much later. On 2 cores with 64 ranks
/// MPI_Init+Finalize went from 5-20 s to 1.5 s (docs/slurm.md). `-x DVM_TIMER_SLACK_US=N` sets
/// another value (0: the kernel's default).
pub const OVERSUBSCRIBED_TIMER_SLACK_US: u64 = 2_000;

fn terminated_reason(jobid: u32) -> String {
    format!("the DVM was terminated (pterm) while job {jobid} ran")
}

type EventTx = mpsc::Sender<Result<JobEvent, Status>>;

/// What the per-job forwarder task carries to prun, in order.
#[derive(Debug)]
pub(crate) enum Forward {
    Output { daemon: Rank, chunk: IofChunk },
    Event(JobEvent),
}

/// HNP: one running job.
pub(crate) struct HnpJob {
    placement: Placement,
    /// Where prun's stdin goes: None nowhere, Some(None) every proc, Some(Some(r)) rank r.
    stdin: Option<Option<u32>>,
    spec_timeout: f64,
    pub(crate) reported: BTreeSet<u32>,
    /// Ranks that called MPI_Abort: (code, node). The job fails when the rank has exited, or
    /// after `recovery::ABORT_GRACE` if it has not.
    pub(crate) aborts: BTreeMap<u32, (i32, String)>,
    first_failure: Option<(i32, String)>,
    killing: bool,
    forward: mpsc::UnboundedSender<Forward>,
    /// A spawned job: the job whose rank spawned it (its prun shows this job's output and
    /// waits for it; crate::dynamic).
    pub(crate) parent: Option<u32>,
    /// Jobs spawned by this one's ranks that have not ended yet.
    pub(crate) children: BTreeSet<u32>,
    /// A spawn waiting for this job's procs to start: who asked, and how many daemons have
    /// reported their procs started.
    pub(crate) spawn: Option<crate::dynamic::PendingSpawn>,
    /// This job's spawn failed (the spawning rank was told): its end fails nobody else.
    pub(crate) spawn_failed: bool,
    /// `--enable-recovery`: a rank that dies, a lost node or a failed joined job do not end
    /// this job (its ranks are told by a PMIx event: crate::recovery).
    pub(crate) recovery: bool,
    /// The first failure this job went on after (its exit status unless it fails later).
    pub(crate) survived: Option<(i32, String)>,
}

impl HnpJob {
    pub(crate) fn placement(&self) -> &Placement {
        &self.placement
    }

    /// The job already fails (or is being killed).
    pub(crate) fn failing(&self) -> bool {
        self.first_failure.is_some() || self.killing
    }
}

/// Daemon: this daemon's part of a job.
#[derive(Default)]
pub(crate) struct LocalJob {
    map: Option<JobMap>,
    residual: Option<Residual>,
    started: bool,
    live: u32,
    /// This daemon's ranks of the job, as `jobmap::local_procs` derived them.
    ranks: Vec<u32>,
    /// Procs not yet reported started or failed, when the map asks for a `LaunchReport`.
    unstarted: Option<u32>,
}

/// Job state of one daemon (HNP part empty elsewhere).
#[derive(Default)]
pub(crate) struct Jobs {
    pub(crate) hnp: BTreeMap<u32, HnpJob>,
    next_jobid: u32,
    local: BTreeMap<u32, LocalJob>,
    /// HNP: the DVM's data server (publish / lookup).
    pub(crate) data: crate::dataserver::DataServer,
    /// HNP: jobs joined by a PMIx_Connect (accept/connect, spawn), both ways.
    pub(crate) peers: BTreeMap<u32, BTreeSet<u32>>,
}

fn event(e: job_event::Event) -> JobEvent {
    JobEvent { event: Some(e) }
}

fn describe_exit(st: &ProcStatus) -> Option<(i32, String)> {
    if !st.error.is_empty() {
        return Some((if st.exit_code != 0 { st.exit_code } else { 127 }, st.error.clone()));
    }
    if st.signal != 0 {
        let name = nix::sys::signal::Signal::try_from(st.signal).map(|s| s.as_str()).unwrap_or("unknown signal");
        return Some((128 + st.signal, format!("was killed by signal {} ({name})", st.signal)));
    }
    (st.exit_code != 0).then(|| (st.exit_code, format!("exited with status {}", st.exit_code)))
}

/// The daemon's own environment minus its DVM_* variables, for the procs it starts.
fn base_env() -> Vec<(String, String)> {
    std::env::vars().filter(|(k, _)| !k.starts_with("DVM_") && k != "RUST_LOG").collect()
}

impl Daemon {
    // ---------------------------------------------------------------- HNP side

    pub(crate) fn candidate_nodes(&self) -> Vec<NodeSlots> {
        let Some(contacts) = self.core().contacts() else { return Vec::new() };
        let topo = self.topology();
        contacts
            .values()
            .filter(|c| topo.is_alive(c.rank) && c.slots > 0)
            .map(|c| NodeSlots { daemon: c.rank, host: c.host.clone(), slots: c.slots })
            .collect()
    }

    pub(crate) fn on_job_control(&mut self, cmd: ControlCmd) {
        match cmd {
            ControlCmd::Launch(spec, tx) => self.launch(spec, tx),
            ControlCmd::LaunchPlan(spec, tx) => {
                let nodes = self.candidate_nodes();
                let receivers = self.topology().live_count();
                let reply = jobmap::map_job(&spec, &nodes).map_err(|e| e.to_string()).map(|p| {
                    let (map, residuals) = jobmap::encode(0, &spec, &p);
                    let sizes = jobmap::launch_sizes(&map, &residuals, receivers);
                    LaunchPlanReply {
                        nprocs: p.nprocs(),
                        nodes: p.num_nodes(),
                        map_bytes: sizes.map_bytes as u64,
                        residual_bytes: sizes.residual_bytes as u64,
                        bytes_per_proc: sizes.bytes_per_proc(),
                        max_daemon_bytes: sizes.per_daemon_max as u64,
                        placement: format!("{:?}", p.layout()),
                    }
                });
                let _ = tx.send(reply);
            }
            ControlCmd::Stdin(msg) => self.route_stdin(msg.jobid, msg.data, msg.eof),
            ControlCmd::Signal(req, tx) => {
                let known = self.jobs.hnp.contains_key(&req.jobid);
                if known {
                    let term = req.signal == libc::SIGINT || req.signal == libc::SIGTERM;
                    if term {
                        self.fail_job(
                            req.jobid,
                            128 + req.signal,
                            format!("prun received signal {}: job killed", req.signal),
                        );
                    } else {
                        self.job_control(JobControl { jobid: req.jobid, signal: req.signal, ..Default::default() });
                    }
                }
                let _ = tx.send(SignalReply { ok: known });
            }
            _ => {}
        }
    }

    fn launch(&mut self, spec: JobSpec, tx: EventTx) {
        let nodes = self.candidate_nodes();
        let placement = match jobmap::map_job(&spec, &nodes) {
            Ok(p) => p,
            Err(e) => {
                let _ =
                    tx.try_send(Ok(event(job_event::Event::Ended(JobEnded { exit_code: 1, message: e.to_string() }))));
                let actor = self.input_tx();
                tokio::spawn(async move {
                    tx.closed().await;
                    let _ = actor.send(Input::JobStreamClosed);
                });
                return;
            }
        };
        let jobid = self.jobs.next_jobid + 1;
        let (ftx, frx) = mpsc::unbounded_channel();
        let _ = ftx.send(Forward::Event(event(job_event::Event::Started(JobStarted {
            jobid,
            nprocs: placement.nprocs(),
            nodes: placement.num_nodes(),
        }))));
        tokio::spawn(forwarder(jobid, frx, tx, self.input_tx()));
        let started = self.start_job(&spec, placement, ftx, None);
        debug_assert_eq!(started, jobid);
    }

    /// Map nothing, decide nothing: enter a mapped job in the table and send its maps and
    /// residuals. `forward` carries its output and events to a prun (a spawned job's: its
    /// parent's prun, which never sees it start or end: `parent` does). Returns the jobid.
    pub(crate) fn start_job(
        &mut self,
        spec: &JobSpec,
        placement: Placement,
        forward: mpsc::UnboundedSender<Forward>,
        parent: Option<u32>,
    ) -> u32 {
        self.jobs.next_jobid += 1;
        let jobid = self.jobs.next_jobid;
        let (mut map, residuals) = jobmap::encode(jobid, spec, &placement);
        map.hnp_iof_window = IOF_WINDOW;
        map.report_launch = parent.is_some();
        info!(jobid, nprocs = placement.nprocs(), nodes = placement.num_nodes(), ?parent, "launching job");
        if spec.timeout_s > 0.0 {
            let itx = self.input_tx();
            let t = spec.timeout_s;
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs_f64(t)).await;
                let _ = itx.send(Input::JobTimeout(jobid));
            });
        }
        let stdin = match StdinTarget::try_from(spec.stdin_target) {
            Ok(StdinTarget::All) => Some(None),
            Ok(StdinTarget::None) => None,
            _ => Some(Some(spec.stdin_rank)),
        };
        self.jobs.hnp.insert(
            jobid,
            HnpJob {
                placement,
                stdin,
                spec_timeout: spec.timeout_s,
                reported: BTreeSet::new(),
                aborts: BTreeMap::new(),
                first_failure: None,
                killing: false,
                forward,
                parent,
                children: BTreeSet::new(),
                spawn: None,
                spawn_failed: false,
                recovery: spec.enable_recovery,
                survived: None,
            },
        );
        self.submit(CoreInput::Xcast { tag: tags::LAUNCH, payload: Bytes::from(map.encode_to_vec()) });
        let slices = residuals.into_iter().map(|(d, r)| (d, Bytes::from(r.encode_to_vec()))).collect();
        self.submit(CoreInput::Scatter { tag: tags::LAUNCH_RESIDUALS, slices });
        jobid
    }

    /// A job's output and events channel (a spawned job shares its parent's).
    pub(crate) fn forward_of(&self, jobid: u32) -> Option<mpsc::UnboundedSender<Forward>> {
        self.jobs.hnp.get(&jobid).map(|j| j.forward.clone())
    }

    /// Show a sentence on a job's prun.
    pub(crate) fn notice(&self, jobid: u32, text: String) {
        if let Some(job) = self.jobs.hnp.get(&jobid) {
            let _ = job.forward.send(Forward::Event(event(job_event::Event::Notice(JobNotice { text }))));
        }
    }

    /// First failure of a job: remember why, tell prun, kill the rest. The failure of a
    /// spawned job is its parent's too (whose ranks may wait on it), and a failed job's
    /// spawned jobs are killed with it: nobody is left waiting for a peer that is gone.
    pub(crate) fn fail_job(&mut self, jobid: u32, code: i32, why: String) {
        let Some(job) = self.jobs.hnp.get_mut(&jobid) else { return };
        let first = job.first_failure.is_none();
        if first {
            let _ = job.forward.send(Forward::Event(event(job_event::Event::Notice(JobNotice { text: why.clone() }))));
            job.first_failure = Some((code, why.clone()));
        }
        self.fail_family(jobid, code, &why);
        if first {
            self.fail_peers(jobid, code, &why);
        }
        self.kill_job(jobid);
    }

    /// The failure reaches the job's ancestors (unless its spawn failed: the spawning rank was
    /// told) and kills its descendants, without another sentence on prun.
    fn fail_family(&mut self, jobid: u32, code: i32, why: &str) {
        let Some(job) = self.jobs.hnp.get(&jobid) else { return };
        let (parent, children, spawn_failed) = (job.parent, job.children.clone(), job.spawn_failed);
        if let (Some(p), false) = (parent, spawn_failed) {
            if self.recovers(p) {
                // Told by the event the failure raised; it goes on.
                self.survive_joined(p, format!("job {jobid}, spawned by job {p}, failed ({why})"));
            } else if let Some(pj) = self.jobs.hnp.get_mut(&p) {
                if pj.first_failure.is_none() {
                    pj.first_failure = Some((code, why.to_string()));
                    self.fail_family(p, code, why);
                    self.kill_job(p);
                }
            }
        }
        for c in children {
            if let Some(cj) = self.jobs.hnp.get_mut(&c) {
                if cj.first_failure.is_none() {
                    cj.first_failure = Some((code, format!("killed with job {jobid}")));
                    self.fail_family(c, code, why);
                    self.kill_job(c);
                }
            }
        }
    }

    fn kill_job(&mut self, jobid: u32) {
        let Some(job) = self.jobs.hnp.get_mut(&jobid) else { return };
        if !job.killing {
            job.killing = true;
            self.job_control(JobControl {
                jobid,
                kill: true,
                grace_ms: KILL_GRACE.as_millis() as u32,
                ..Default::default()
            });
        }
    }

    fn job_control(&mut self, ctl: JobControl) {
        self.submit(CoreInput::Xcast { tag: tags::JOB_CONTROL, payload: Bytes::from(ctl.encode_to_vec()) });
    }

    /// HNP: the DVM stops now: every job still in the table tells its prun how it ended (its
    /// first failure, or [`TERMINATED_EXIT`]) before the daemons go.
    pub(crate) fn end_remaining_jobs(&mut self) {
        // A spawned job's prun is its parent's, which ends it.
        for (jobid, job) in std::mem::take(&mut self.jobs.hnp).into_iter().filter(|(_, j)| j.parent.is_none()) {
            let (exit_code, message) = job.first_failure.unwrap_or_else(|| (TERMINATED_EXIT, terminated_reason(jobid)));
            let _ = job.forward.send(Forward::Event(event(job_event::Event::Ended(JobEnded { exit_code, message }))));
        }
    }

    /// HNP: the DVM is being terminated: end every running job with [`TERMINATED_EXIT`] and a
    /// sentence saying so. False when no job runs.
    pub(crate) fn end_jobs_for_termination(&mut self) -> bool {
        let running: Vec<u32> = self.jobs.hnp.keys().copied().collect();
        for &jobid in &running {
            self.fail_job(jobid, TERMINATED_EXIT, terminated_reason(jobid));
        }
        !running.is_empty()
    }

    fn on_proc_status(&mut self, st: ProcStatus) {
        let host = self.host_of(st.daemon);
        let Some(job) = self.jobs.hnp.get_mut(&st.jobid) else { return };
        if !job.reported.insert(st.rank) {
            return;
        }
        debug!(jobid = st.jobid, rank = st.rank, code = st.exit_code, signal = st.signal, "proc ended");
        if job.spawn.is_some() && !st.error.is_empty() {
            // A proc of a spawn in progress never ran: the spawn fails (crate::dynamic).
            self.spawn_failed(st.jobid, &st.error);
        }
        let Some(job) = self.jobs.hnp.get_mut(&st.jobid) else { return };
        let abort = job.aborts.get(&st.rank).cloned();
        if let Some((code, node)) = abort {
            // MPI_Abort (its event is raised already): now that the rank has exited, end the
            // job with its code.
            if !job.failing() {
                let why = format!("rank {} on node {node} (pid {}) called MPI_Abort with code {code}", st.rank, st.pid);
                self.fail_job(st.jobid, code, why);
            }
        } else if let Some((code, how)) = describe_exit(&st) {
            if !job.failing() {
                let why = if st.error.is_empty() {
                    format!("rank {} on node {host} (pid {}) {how}", st.rank, st.pid)
                } else {
                    how
                };
                // Told first, then (unless the job recovers) ended.
                self.proc_aborted_event(st.jobid, st.rank, code, &why);
                if self.recovers(st.jobid) {
                    self.survive(st.jobid, code, why);
                } else {
                    self.fail_job(st.jobid, code, why);
                }
            }
        }
        self.maybe_end(st.jobid);
    }

    pub(crate) fn maybe_end(&mut self, jobid: u32) {
        let Some(job) = self.jobs.hnp.get(&jobid) else { return };
        // A job ends for its prun once its own procs and every job it spawned have ended.
        if (job.reported.len() as u32) < job.placement.nprocs() || !job.children.is_empty() {
            return;
        }
        let job = self.jobs.hnp.remove(&jobid).expect("checked above");
        let (exit_code, message) =
            job.first_failure.clone().or_else(|| job.survived.clone()).unwrap_or((0, String::new()));
        info!(jobid, exit_code, parent = ?job.parent, "job ended");
        if job.parent.is_none() {
            let _ = job.forward.send(Forward::Event(event(job_event::Event::Ended(JobEnded { exit_code, message }))));
        }
        self.job_control(JobControl { jobid, cleanup: true, ..Default::default() });
        self.dynamic_job_ended(jobid, &job);
        if self.jobs.hnp.is_empty() {
            self.jobs_all_ended();
        }
    }

    pub(crate) fn on_job_timeout(&mut self, jobid: u32) {
        let Some(job) = self.jobs.hnp.get(&jobid) else { return };
        let t = job.spec_timeout;
        self.fail_job(jobid, TIMEOUT_EXIT, format!("job {jobid} exceeded its --timeout of {t} s and was killed"));
    }

    pub(crate) fn on_client_gone(&mut self, jobid: u32) {
        if self.jobs.hnp.contains_key(&jobid) {
            warn!(jobid, "prun went away: killing its job");
            self.fail_job(jobid, 1, format!("job {jobid}: prun went away"));
        }
    }

    /// HNP: daemons died; their procs are lost and their jobs fail.
    pub(crate) fn jobs_lost_daemons(&mut self, failed: &BTreeSet<Rank>) {
        let mut hits = Vec::new();
        for (&jobid, job) in &self.jobs.hnp {
            for &d in failed {
                let ranks: Vec<u32> = job.placement.procs_on(d).iter().filter(|r| !job.reported.contains(r)).collect();
                if !ranks.is_empty() {
                    hits.push((jobid, d, ranks));
                }
            }
        }
        // The jobs concerned are told first: one event pair per lost daemon.
        for &d in failed {
            let lost: Vec<(u32, Vec<u32>)> =
                hits.iter().filter(|h| h.1 == d).map(|(j, _, ranks)| (*j, ranks.clone())).collect();
            if !lost.is_empty() {
                self.daemon_lost_events(d, &lost);
            }
        }
        for (jobid, d, ranks) in hits {
            let host = self.host_of(d);
            let why = format!("daemon {d} on node {host} was lost with ranks {ranks:?} of job {jobid}");
            if self.recovers(jobid) {
                self.survive(jobid, 1, why);
            } else {
                self.fail_job(jobid, 1, why);
            }
            if let Some(job) = self.jobs.hnp.get_mut(&jobid) {
                job.reported.extend(ranks);
            }
            self.maybe_end(jobid);
        }
    }

    fn route_stdin(&mut self, jobid: u32, data: Bytes, eof: bool) {
        let Some(job) = self.jobs.hnp.get(&jobid) else { return };
        let chunk = StdinChunk { jobid, data, eof };
        let targets: Vec<Rank> = match job.stdin {
            Some(Some(rank)) => job.placement.node_of(rank).into_iter().collect(),
            Some(None) => job.placement.daemons().collect(),
            None => Vec::new(),
        };
        for d in targets {
            self.send_job_cmd(d, daemon_cmd::Body::Stdin(chunk.clone()));
        }
    }

    /// HNP: output a daemon sent; forward it to prun (acked once prun took it).
    fn on_iof(&mut self, daemon: Rank, chunk: IofChunk) {
        match self.jobs.hnp.get(&chunk.jobid) {
            Some(job) => {
                let _ = job.forward.send(Forward::Output { daemon, chunk });
            }
            None => {
                // Job already ended (or unknown): ack so the daemon never stalls.
                let ack = IofAck { jobid: chunk.jobid, bytes: chunk.data.len() as u64 };
                self.send_job_cmd(daemon, daemon_cmd::Body::IofAck(ack));
            }
        }
    }

    pub(crate) fn on_iof_delivered(&mut self, jobid: u32, daemon: Rank, bytes: u64) {
        self.send_job_cmd(daemon, daemon_cmd::Body::IofAck(IofAck { jobid, bytes }));
    }

    // ---------------------------------------------------------------- every daemon

    pub(crate) fn on_job_cmd(&mut self, origin: Rank, cmd: daemon_cmd::Body) {
        match cmd {
            daemon_cmd::Body::ProcStatus(st) => self.on_proc_status(st),
            daemon_cmd::Body::Iof(chunk) => self.on_iof(origin, chunk),
            daemon_cmd::Body::IofAck(ack) => self.odls().ack_output(ack.jobid, ack.bytes as usize),
            daemon_cmd::Body::Stdin(chunk) => self.local_stdin(chunk),
            daemon_cmd::Body::DmodexReq(req) => self.pmix.serve_dmodex(origin, req),
            daemon_cmd::Body::DmodexResp(resp) => self.pmix.on_dmodex_resp(resp),
            daemon_cmd::Body::JobAbort(a) => self.on_job_abort(a),
            daemon_cmd::Body::JobFail(f) => self.fail_job(f.jobid, f.code, f.reason),
            daemon_cmd::Body::SpawnReq(req) => self.on_spawn_req(origin, req),
            daemon_cmd::Body::SpawnResp(resp) => self.pmix.on_spawn_resp(resp),
            daemon_cmd::Body::LaunchReport(r) => self.on_launch_report(r),
            daemon_cmd::Body::DataReq(req) => self.on_data_req(origin, req),
            daemon_cmd::Body::DataResp(resp) => self.pmix.on_data_resp(resp),
            daemon_cmd::Body::JobsConnected(c) => self.on_jobs_connected(c.jobids),
            daemon_cmd::Body::JobLog(l) => {
                let host = self.host_of(l.daemon);
                if let Some(job) = self.jobs.hnp.get(&l.jobid) {
                    let text = format!("rank {} on node {host}: {}", l.rank, l.text.trim_end());
                    let _ = job.forward.send(Forward::Event(event(job_event::Event::Notice(JobNotice { text }))));
                }
            }
            other => warn!(origin, "unexpected daemon command {other:?}"),
        }
    }

    pub(crate) fn on_launch_map(&mut self, payload: Bytes) {
        match JobMap::decode(payload) {
            Ok(map) => {
                let jobid = map.jobid;
                // Every daemon knows every job's placement (a peer of another job after a
                // connect, a spawned job's participants).
                match Placement::from_job_map(&map) {
                    Ok(p) => {
                        let hosts = p.daemons().map(|d| self.host_of(d)).collect();
                        self.pmix.learn_job(jobid, crate::pmix::nspace_of(&self.dvm_id(), jobid), p, hosts)
                    }
                    Err(e) => warn!(jobid, "job map unusable: {e}"),
                }
                self.jobs.local.entry(jobid).or_default().map = Some(map);
                self.maybe_start(jobid);
            }
            Err(e) => warn!("undecodable launch map: {e}"),
        }
    }

    pub(crate) fn on_launch_residual(&mut self, data: Bytes) {
        match Residual::decode(data) {
            Ok(r) => {
                let jobid = r.jobid;
                self.jobs.local.entry(jobid).or_default().residual = Some(r);
                self.maybe_start(jobid);
            }
            Err(e) => warn!("undecodable launch residual: {e}"),
        }
    }

    fn maybe_start(&mut self, jobid: u32) {
        let me = self.me;
        let Some(lj) = self.jobs.local.get(&jobid) else { return };
        if lj.started {
            return;
        }
        let Some(map) = lj.map.clone() else { return };
        let Some(residual) = lj.residual.clone() else {
            return;
        };
        let procs = match jobmap::local_procs(&map, &residual, me) {
            Ok(p) => p,
            Err(e) => {
                // Never leave the job waiting for procs that will not start: report every rank
                // the residual names as failed, with the reason.
                warn!(jobid, "daemon {me} cannot start its part of job {jobid}: {e}");
                self.jobs.local.remove(&jobid);
                let ranks: Vec<u32> = residual
                    .ranks
                    .iter()
                    .flat_map(|rr| {
                        (0..rr.count).map(move |i| rr.first.saturating_add(i.saturating_mul(rr.stride.max(1))))
                    })
                    .collect();
                let error = format!("node {}: cannot start job {jobid}: {e}", self.host);
                for rank in ranks {
                    let st = ProcStatus {
                        jobid,
                        rank,
                        exit_code: 127,
                        error: error.clone(),
                        daemon: me,
                        ..Default::default()
                    };
                    self.send_job_cmd(0, daemon_cmd::Body::ProcStatus(st));
                }
                return;
            }
        };
        let lj = self.jobs.local.get_mut(&jobid).expect("present");
        lj.started = true;
        lj.live = procs.len() as u32;
        lj.ranks = procs.iter().map(|p| p.rank).collect();
        if map.report_launch {
            lj.unstarted = Some(procs.len() as u32);
        }
        let env = base_env();
        let pmix = self.pmix_job_start(jobid, &map, procs.len() as u32);
        let session = self.session_dir();
        let loopback = self.on_loopback();
        // Procs of this job competing for this machine's cores. A loopback DVM (`--local`) has
        // every daemon on this machine: all of the job's procs; otherwise this daemon's own.
        // A setting in the daemon's environment (inherited by the ranks) or `-x` wins.
        let on_machine = if loopback { map.nprocs } else { procs.len() as u32 };
        let oversubscribed = crate::pmix::oversubscribed(on_machine, crate::pmix::node_cores());
        let yield_idle = oversubscribed && !env.iter().any(|(k, _)| k == crate::pmix::YIELD_VAR);
        let timer_slack_us = if oversubscribed { OVERSUBSCRIBED_TIMER_SLACK_US } else { 0 };
        let stdin_rank = match StdinTarget::try_from(map.stdin_target) {
            Ok(StdinTarget::All) => None,
            Ok(StdinTarget::None) => Some(u32::MAX),
            _ => Some(map.stdin_rank),
        };
        for p in procs {
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
                ("DVM_NODE", self.host.clone()),
                ("DVM_DAEMON", me.to_string()),
            ] {
                penv.push((k.to_string(), v));
            }
            if pmix {
                for (k, v) in self.pmix.proc_env(jobid, p.rank, session.clone(), loopback, yield_idle) {
                    if !app.env.iter().any(|kv| kv.split_once('=').is_some_and(|(ak, _)| ak == k)) {
                        penv.retain(|(ek, _)| *ek != k);
                        penv.push((k, v));
                    }
                }
            }
            let spec = ProcSpec {
                jobid,
                rank: p.rank,
                argv: app.argv.clone(),
                env: penv,
                wdir: app.wdir.clone().into(),
                stdin: stdin_rank.is_none_or(|r| r == p.rank),
                timer_slack_us,
            };
            self.odls_mut().spawn(spec);
        }
        if self.jobs.local.get(&jobid).is_some_and(|j| j.live == 0) {
            self.jobs.local.remove(&jobid);
            self.pmix.job_done(jobid);
        }
    }

    /// Register a job's PMIx namespace on this daemon (what the job map says, with the hosts
    /// from the contact table); false: the job runs without PMIx.
    fn pmix_job_start(&mut self, jobid: u32, map: &JobMap, nlocal: u32) -> bool {
        let placement = match Placement::from_job_map(map) {
            Ok(p) => p,
            Err(e) => {
                warn!(jobid, "job map unusable for PMIx: {e}");
                return false;
            }
        };
        let hosts: Vec<String> = placement.daemons().map(|d| self.host_of(d)).collect();
        let nspace = crate::pmix::nspace_of(&self.dvm_id(), jobid);
        let start = crate::pmix::JobStart { jobid, nspace, placement, hosts: &hosts, nprocs: map.nprocs, nlocal };
        self.pmix.job_start(start)
    }

    pub(crate) fn on_job_control_xcast(&mut self, payload: Bytes) {
        let Ok(ctl) = JobControl::decode(payload) else {
            warn!("undecodable job control");
            return;
        };
        if ctl.cleanup {
            self.jobs.local.remove(&ctl.jobid);
            self.pmix.forget_job(ctl.jobid);
            self.odls_mut().forget_job(ctl.jobid);
            if self.jobs.local.is_empty() && self.jobs.hnp.is_empty() {
                // Idle: what the job's messages, processes and streams used goes back to the
                // system, so a DVM serving thousands of jobs stays at its idle size.
                crate::daemon::trim_heap();
            }
            return;
        }
        if ctl.kill {
            self.odls_mut().kill_job(ctl.jobid, Duration::from_millis(ctl.grace_ms as u64));
        } else if ctl.signal != 0 {
            self.odls().signal_job(ctl.jobid, ctl.signal);
        }
    }

    fn local_stdin(&mut self, chunk: StdinChunk) {
        let Some(map) = self.jobs.local.get(&chunk.jobid).and_then(|j| j.map.clone()) else { return };
        let ranks: Vec<u32> = match StdinTarget::try_from(map.stdin_target) {
            Ok(StdinTarget::All) => self.jobs_local_ranks(chunk.jobid),
            Ok(StdinTarget::None) => Vec::new(),
            _ => vec![map.stdin_rank],
        };
        for r in ranks {
            if chunk.eof {
                self.odls_mut().close_stdin(chunk.jobid, r);
            } else {
                self.odls_mut().write_stdin(chunk.jobid, r, chunk.data.clone());
            }
        }
    }

    fn jobs_local_ranks(&self, jobid: u32) -> Vec<u32> {
        self.jobs.local.get(&jobid).map(|lj| lj.ranks.clone()).unwrap_or_default()
    }

    /// Events of this daemon's processes.
    pub(crate) fn on_odls(&mut self, ev: OdlsEvent) {
        match ev {
            OdlsEvent::Started { jobid, rank, pid } => {
                debug!(jobid, rank, pid, "proc started");
                self.launch_progress(jobid, None);
            }
            OdlsEvent::Output { jobid, rank, stream, data } => {
                let stream = match stream {
                    Stream::Stdout => 1,
                    Stream::Stderr => 2,
                };
                let chunk = IofChunk { jobid, rank, stream, data, eof: false };
                self.send_job_cmd(0, daemon_cmd::Body::Iof(chunk));
            }
            OdlsEvent::OutputClosed { .. } => {}
            OdlsEvent::Exited { jobid, rank, pid, status } => {
                let (exit_code, signal) = match status {
                    ExitKind::Code(c) => (c, 0),
                    ExitKind::Signal(s) => (0, s),
                };
                let mut st = ProcStatus { jobid, rank, pid, exit_code, signal, error: String::new(), daemon: self.me };
                if let Some(why) = self.pmix.proc_exit(jobid, rank) {
                    if signal == 0 && exit_code == 0 {
                        st.exit_code = 1;
                        st.error = why;
                    }
                }
                self.proc_done(st);
            }
            OdlsEvent::LaunchFailed { jobid, rank, error } => {
                self.launch_progress(jobid, Some(error.clone()));
                self.proc_done(ProcStatus { jobid, rank, pid: 0, exit_code: 127, signal: 0, error, daemon: self.me });
            }
        }
    }

    /// A proc of a job whose map asks for a `LaunchReport` started (or failed to): report
    /// once every local proc did, or at the first failure.
    fn launch_progress(&mut self, jobid: u32, error: Option<String>) {
        let Some(lj) = self.jobs.local.get_mut(&jobid) else { return };
        let Some(left) = lj.unstarted.as_mut() else { return };
        *left = left.saturating_sub(1);
        if error.is_none() && *left > 0 {
            return;
        }
        lj.unstarted = None;
        let started = lj.ranks.len() as u32;
        let report =
            dvm_proto::daemon::LaunchReport { jobid, daemon: self.me, started, error: error.unwrap_or_default() };
        self.send_job_cmd(0, daemon_cmd::Body::LaunchReport(report));
    }

    fn proc_done(&mut self, st: ProcStatus) {
        let jobid = st.jobid;
        let mut done = false;
        if let Some(lj) = self.jobs.local.get_mut(&jobid) {
            lj.live = lj.live.saturating_sub(1);
            done = lj.live == 0;
        }
        self.send_job_cmd(0, daemon_cmd::Body::ProcStatus(st));
        if done {
            self.pmix.job_done(jobid);
        }
    }
}

/// Per-job task: hands output and events to prun's stream in order, then tells the actor the
/// bytes were delivered (the credit the daemon waits for).
async fn forwarder(
    jobid: u32,
    mut rx: mpsc::UnboundedReceiver<Forward>,
    tx: EventTx,
    actor: mpsc::UnboundedSender<Input>,
) {
    let mut client_alive = true;
    loop {
        let item = tokio::select! {
            item = rx.recv() => match item {
                Some(i) => i,
                None => return,
            },
            // prun went away (Ctrl-C'd hard, killed, lost): the job must not outlive it.
            _ = tx.closed(), if client_alive => {
                client_alive = false;
                let _ = actor.send(Input::JobClientGone(jobid));
                continue;
            }
        };
        match item {
            Forward::Output { daemon, chunk } => {
                let bytes = chunk.data.len() as u64;
                if client_alive {
                    let ev = event(job_event::Event::Output(JobOutput {
                        rank: chunk.rank,
                        stream: chunk.stream,
                        data: chunk.data,
                    }));
                    if tx.send(Ok(ev)).await.is_err() {
                        client_alive = false;
                        let _ = actor.send(Input::JobClientGone(jobid));
                    }
                }
                let _ = actor.send(Input::IofDelivered { jobid, daemon, bytes });
            }
            Forward::Event(ev) => {
                let last = matches!(ev.event, Some(job_event::Event::Ended(_)));
                if client_alive && tx.send(Ok(ev)).await.is_err() {
                    client_alive = false;
                    let _ = actor.send(Input::JobClientGone(jobid));
                }
                if last {
                    // Until prun hangs up, the stream may still hold what it has not read.
                    tx.closed().await;
                    let _ = actor.send(Input::JobStreamClosed);
                    return;
                }
            }
        }
    }
}
