//! The HNP's job table: job ids, the map, launch, exits, kill, `--timeout`, a lost daemon,
//! the end of every job at termination. Around it: the slot books and the queue (`queue`),
//! a job's prun (output, stdin, signals, prun gone: `streams`), the job tools (`tools`,
//! `stacks`), spawn and the data server (`spawn`), the events and `--enable-recovery`
//! (`recovery`).
//!
//! Launch: a job is mapped onto the live daemons' slots (`jobmap`), its maps broadcast
//! (`LAUNCH`) and its residuals scattered (`LAUNCH_RESIDUALS`). Procs report their exit to the
//! HNP; the first failure names rank, node, pid and status and kills the rest of the job
//! (never the DVM). Output travels daemon -> HNP -> prun with a credit window per daemon and
//! job, returned when prun took the bytes.
//!
//! Never: a stream, a process or a clock: what a job says to its prun leaves as
//! `JobOut::Client`, what it asks of the daemons as commands and broadcasts, in order.
//! Invariants: a job leaves the table once every one of its procs has been reported (ended,
//! failed to start, or lost with its daemon) and every job it spawned has left; its prun hears
//! `Ended` exactly once (a spawned job's prun is its parent's, which hears its parent's end).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;
use dvm_grpcomm::tags;

use dvm_proto::control::{job_event, JobEnded, JobInfo, LaunchPlanReply, StackTracesReply};
use dvm_proto::daemon::daemon_cmd;
use dvm_proto::job::{JobControl, JobSpec, ProcStatus, StdinTarget};
use dvm_proto::Message;
use dvm_rml::Rank;
use tracing::{debug, info, warn};

use super::records::{ArrayState, EndedJob, Kept, StackFor, StackQuery, Waiting};
use super::{event, ClientId, Forward, IOF_WINDOW, KILL_GRACE_NS, LOST_EXIT, TERMINATED_EXIT, TIMEOUT_EXIT};
use crate::dataserver::DataServer;
use crate::jobmap::{self, Placement};
use crate::timer::Timer;
use crate::Core;

pub(crate) fn terminated_reason(jobid: u32) -> String {
    format!("the DVM was terminated (pterm) while job {jobid} ran")
}

/// What the job table asks of the node, in order.
#[derive(Debug)]
pub(crate) enum JobOut {
    /// To a job's prun.
    Client {
        client: ClientId,
        item: Forward,
    },
    /// A daemon command along the tree.
    Cmd {
        dst: Rank,
        body: daemon_cmd::Body,
    },
    /// A broadcast to every daemon.
    Xcast {
        tag: u32,
        payload: Bytes,
    },
    /// The launch residuals.
    Scatter {
        tag: u32,
        slices: Vec<(Rank, Bytes)>,
    },
    /// Arm a timer `after` ns from now.
    Arm(Timer, u64),
    Cancel(Timer),
    /// The answer to a stack-trace control call.
    Stacks {
        token: u64,
        reply: Result<StackTracesReply, String>,
    },
    /// Copy the job's preload files to its nodes; the launch waits for the verdict.
    Stage {
        jobid: u32,
        plan: crate::stage::StagePlan,
        targets: BTreeSet<Rank>,
    },
    /// The job ended: its preloaded files go (or stay, when it asked to keep them).
    Unstage {
        jobid: u32,
        keep: bool,
    },
    /// The table became empty.
    AllEnded,
}

/// A spawn waiting for its job's procs to start.
#[derive(Debug, Clone)]
pub(crate) struct PendingSpawn {
    /// The daemon of the spawning rank, and its request id.
    pub daemon: Rank,
    pub id: u64,
    /// Who asked (for messages).
    pub parent: u32,
    pub rank: u32,
    /// Daemons that reported their procs started.
    pub started: u32,
}

/// One job in the table.
#[derive(Debug)]
pub(crate) struct HnpJob {
    pub placement: Placement,
    /// Where prun's stdin goes: None nowhere, Some(None) every proc, Some(Some(r)) rank r.
    pub(crate) stdin: Option<Option<u32>>,
    spec_timeout: f64,
    pub reported: BTreeSet<u32>,
    /// Ranks that called MPI_Abort: (code, node). The job fails when the rank has exited, or
    /// after the abort grace if it has not.
    pub aborts: BTreeMap<u32, (i32, String)>,
    pub first_failure: Option<(i32, String)>,
    killing: bool,
    /// Its prun (a spawned job's: its parent's, which never sees it start or end).
    pub client: ClientId,
    /// A spawned job: the job whose rank spawned it.
    pub parent: Option<u32>,
    /// Jobs spawned by this one's ranks that have not ended yet.
    pub children: BTreeSet<u32>,
    /// A spawn waiting for this job's procs to start.
    pub spawn: Option<PendingSpawn>,
    /// This job's spawn failed (the spawning rank was told): its end fails nobody else.
    pub spawn_failed: bool,
    /// `--enable-recovery`: a rank that dies, a lost node or a failed joined job do not end
    /// this job (its ranks are told by a PMIx event).
    pub recovery: bool,
    /// The first failure this job went on after (its exit status unless it fails later).
    pub survived: Option<(i32, String)>,
    /// Its residual for each hosting daemon, as scattered: sent again after a loss, since a
    /// scatter through a daemon that died loses the slices of its subtree.
    residuals: Vec<(Rank, Bytes)>,
    /// When it started, and how long it waited in the queue before (ns).
    pub started_ns: u64,
    pub wait_ns: u64,
    /// An array element: (the array's id, its index).
    pub array: Option<(u32, u32)>,
    /// Who submitted it, and what (for listings and cancel).
    pub uid: u32,
    pub command: String,
    /// A detached job: its output and notices, kept for `prun --attach`.
    pub kept: Option<Kept>,
    /// A detached job: a prun follows it now (as `client`).
    pub attached: bool,
    /// `--get-stack-traces`: at its timeout, its ranks' stacks are shown before the kill.
    pub stacks_on_timeout: bool,
    /// Ended by a cancel (listed as cancelled).
    pub cancelled: bool,
    /// Its launch (map and residuals), held while its preload files are being copied.
    pub(crate) pending_launch: Option<(Bytes, Vec<(Rank, Bytes)>)>,
    /// It preloads files (removed when it ends unless `preload_keep`).
    pub(crate) preload: Option<bool>,
}

impl HnpJob {
    /// The job already fails (or is being killed).
    pub fn failing(&self) -> bool {
        self.first_failure.is_some() || self.killing
    }
}

/// The HNP's jobs.
#[derive(Debug, Default)]
pub struct JobTable {
    pub(crate) jobs: BTreeMap<u32, HnpJob>,
    next_jobid: u32,
    /// The DVM's data server (publish / lookup).
    pub(crate) data: DataServer,
    /// Jobs joined by a PMIx_Connect (accept/connect, spawn), both ways.
    pub(crate) peers: BTreeMap<u32, BTreeSet<u32>>,
    pub(crate) out: Vec<JobOut>,
    /// The node's clock at the input being handled (ns).
    pub(crate) now: u64,
    /// Jobs waiting for slots, in order.
    pub(crate) queue: VecDeque<Waiting>,
    /// Arrays with elements queued or running.
    pub(crate) arrays: BTreeMap<u32, ArrayState>,
    /// Recently ended jobs, oldest first.
    pub(crate) ended: VecDeque<EndedJob>,
    /// Stack-trace queries waiting for daemons, by id.
    pub(crate) stacks: BTreeMap<u64, StackQuery>,
    pub(crate) next_stack_query: u64,
    /// Ended jobs whose preloaded files are being removed: their prun and its `Ended`, told
    /// once the files are gone.
    pub(crate) unstaging: BTreeMap<u32, (ClientId, Forward)>,
    /// The DVM's slots at the last launch ([`JobTable::note_universe`]).
    pub(crate) universe: u32,
}

impl JobTable {
    /// Jobs in the table.
    pub fn len(&self) -> usize {
        self.jobs.len()
    }
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }
    /// Job ids in the table, with their placement.
    pub fn placements(&self) -> impl Iterator<Item = (u32, &Placement)> {
        self.jobs.iter().map(|(j, job)| (*j, &job.placement))
    }
    /// Whether `jobid` is in the table.
    pub fn contains(&self, jobid: u32) -> bool {
        self.jobs.contains_key(&jobid)
    }
    /// The data server's waiting lookups and records (for state checks).
    pub fn data(&self) -> &DataServer {
        &self.data
    }

    /// The live daemons with slots, as the mapper sees them.
    /// What launching `spec` would send (`prun --launch-sizes`).
    pub(crate) fn plan(r: &Core, spec: &JobSpec) -> Result<LaunchPlanReply, String> {
        let nodes = Self::candidate_nodes(r);
        let receivers = r.topology().live_count();
        jobmap::map_job(spec, &nodes).map_err(|e| e.to_string()).map(|p| {
            let (map, residuals) = jobmap::encode(0, spec, &p);
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
        })
    }

    pub(crate) fn cmd(&mut self, dst: Rank, body: daemon_cmd::Body) {
        self.out.push(JobOut::Cmd { dst, body });
    }

    pub(crate) fn new_jobid(&mut self) -> u32 {
        // After 2^32 - 1 ids (50 days at 1,000 jobs/s) they start again at 1.
        self.next_jobid = self.next_jobid.checked_add(1).unwrap_or(1);
        self.next_jobid
    }

    /// Map nothing, decide nothing: enter a mapped job in the table and send its maps and
    /// residuals. Returns the job id.
    pub(crate) fn start_job(
        &mut self,
        spec: &JobSpec,
        placement: Placement,
        client: ClientId,
        parent: Option<u32>,
    ) -> u32 {
        let jobid = self.new_jobid();
        self.start_job_as(jobid, spec, placement, client, parent);
        jobid
    }

    /// [`Self::start_job`] under an id given already.
    pub(crate) fn start_job_as(
        &mut self,
        jobid: u32,
        spec: &JobSpec,
        placement: Placement,
        client: ClientId,
        parent: Option<u32>,
    ) {
        let (mut map, residuals) = jobmap::encode(jobid, spec, &placement);
        map.hnp_iof_window = IOF_WINDOW;
        map.universe = self.universe.max(placement.nprocs());
        map.report_launch = parent.is_some();
        info!(jobid, nprocs = placement.nprocs(), nodes = placement.num_nodes(), ?parent, "launching job");
        if spec.timeout_s > 0.0 {
            let ns = (spec.timeout_s * 1e9).min(u64::MAX as f64) as u64;
            self.out.push(JobOut::Arm(Timer::JobTimeout(jobid), ns));
        }
        let stdin = match StdinTarget::try_from(spec.stdin_target) {
            Ok(StdinTarget::All) => Some(None),
            Ok(StdinTarget::None) => None,
            _ => Some(Some(spec.stdin_rank)),
        };
        let slices: Vec<(Rank, Bytes)> =
            residuals.into_iter().map(|(d, r)| (d, Bytes::from(r.encode_to_vec()))).collect();
        self.jobs.insert(
            jobid,
            HnpJob {
                placement,
                stdin,
                spec_timeout: spec.timeout_s,
                reported: BTreeSet::new(),
                aborts: BTreeMap::new(),
                first_failure: None,
                killing: false,
                client,
                parent,
                children: BTreeSet::new(),
                spawn: None,
                spawn_failed: false,
                recovery: spec.enable_recovery,
                survived: None,
                residuals: slices.clone(),
                started_ns: self.now,
                wait_ns: 0,
                array: None,
                uid: spec.uid,
                command: spec.command.clone(),
                kept: spec.detach.then(Kept::default),
                attached: false,
                stacks_on_timeout: spec.get_stack_traces,
                cancelled: false,
                pending_launch: None,
                preload: None,
            },
        );
        let map = Bytes::from(map.encode_to_vec());
        if !self.preload(jobid, spec, map.clone(), &slices) {
            self.out.push(JobOut::Xcast { tag: tags::LAUNCH, payload: map });
            self.out.push(JobOut::Scatter { tag: tags::LAUNCH_RESIDUALS, slices });
        }
    }

    /// First failure of a job: remember why, tell prun, kill the rest. The failure of a
    /// spawned job is its parent's too (whose ranks may wait on it), and a failed job's
    /// spawned jobs are killed with it: nobody is left waiting for a peer that is gone.
    pub(crate) fn fail_job(&mut self, r: &Core, jobid: u32, code: i32, why: String) {
        let Some(job) = self.jobs.get_mut(&jobid) else { return };
        let first = job.first_failure.is_none();
        if first {
            job.first_failure = Some((code, why.clone()));
            // An array element's failure is told with its end.
            if job.array.is_none() {
                self.notice(jobid, why.clone());
            }
        }
        self.fail_family(jobid, code, &why);
        if first {
            self.fail_peers(r, jobid, code, &why);
        }
        if self.never_launched(jobid) {
            return self.maybe_end(r, jobid);
        }
        self.kill_job(jobid);
    }

    /// The failure reaches the job's ancestors (unless its spawn failed: the spawning rank was
    /// told) and kills its descendants, without another sentence on prun.
    fn fail_family(&mut self, jobid: u32, code: i32, why: &str) {
        let Some(job) = self.jobs.get(&jobid) else { return };
        let (parent, children, spawn_failed) = (job.parent, job.children.clone(), job.spawn_failed);
        if let (Some(p), false) = (parent, spawn_failed) {
            if self.recovers(p) {
                // Told by the event the failure raised; it goes on.
                self.survive_joined(p, format!("job {jobid}, spawned by job {p}, failed ({why})"));
            } else if let Some(pj) = self.jobs.get_mut(&p) {
                if pj.first_failure.is_none() {
                    pj.first_failure = Some((code, why.to_string()));
                    self.fail_family(p, code, why);
                    self.kill_job(p);
                }
            }
        }
        for c in children {
            if let Some(cj) = self.jobs.get_mut(&c) {
                if cj.first_failure.is_none() {
                    cj.first_failure = Some((code, format!("killed with job {jobid}")));
                    self.fail_family(c, code, why);
                    self.kill_job(c);
                }
            }
        }
    }

    fn kill_job(&mut self, jobid: u32) {
        let Some(job) = self.jobs.get_mut(&jobid) else { return };
        if !job.killing {
            job.killing = true;
            let grace_ms = (KILL_GRACE_NS / 1_000_000) as u32;
            self.job_control(JobControl { jobid, kill: true, grace_ms, ..Default::default() });
        }
    }

    pub(crate) fn job_control(&mut self, ctl: JobControl) {
        self.out.push(JobOut::Xcast { tag: tags::JOB_CONTROL, payload: Bytes::from(ctl.encode_to_vec()) });
    }

    /// The DVM stops now: every job still in the table tells its prun how it ended (its first
    /// failure, or [`TERMINATED_EXIT`]) before the daemons go.
    pub(crate) fn end_remaining_jobs(&mut self) {
        // A spawned job's prun is its parent's, which ends it.
        for (jobid, job) in std::mem::take(&mut self.jobs).into_iter().filter(|(_, j)| j.parent.is_none()) {
            let (exit_code, message) = job.first_failure.unwrap_or_else(|| (TERMINATED_EXIT, terminated_reason(jobid)));
            match job.array {
                Some((array, index)) => self.array_element_ended(array, index, jobid, exit_code, &message),
                None if job.kept.is_some() && !job.attached => {}
                None => {
                    let ended = JobEnded { exit_code, message, jobid, ..Default::default() };
                    self.tell(job.client, event(job_event::Event::Ended(ended)));
                }
            }
        }
        self.end_queued(TERMINATED_EXIT, "the DVM was terminated (pterm) while the job was queued");
    }

    /// The DVM is being terminated: end every running job with [`TERMINATED_EXIT`] and a
    /// sentence saying so. False when no job runs.
    pub(crate) fn end_jobs_for_termination(&mut self, r: &Core) -> bool {
        self.end_queued(TERMINATED_EXIT, "the DVM was terminated (pterm) while the job was queued");
        let running: Vec<u32> = self.jobs.keys().copied().collect();
        for &jobid in &running {
            self.fail_job(r, jobid, TERMINATED_EXIT, terminated_reason(jobid));
        }
        !running.is_empty()
    }

    /// A proc of a job ended (or never started).
    pub(crate) fn on_proc_status(&mut self, r: &Core, st: ProcStatus) {
        let host = r.host_of(st.daemon);
        let Some(job) = self.jobs.get_mut(&st.jobid) else { return };
        if !job.reported.insert(st.rank) {
            return;
        }
        debug!(jobid = st.jobid, rank = st.rank, code = st.exit_code, signal = st.signal, "proc ended");
        if job.spawn.is_some() && !st.error.is_empty() {
            // A proc of a spawn in progress never ran: the spawn fails.
            self.spawn_failed(r, st.jobid, &st.error);
        }
        let Some(job) = self.jobs.get_mut(&st.jobid) else { return };
        let abort = job.aborts.get(&st.rank).cloned();
        if let Some((code, node)) = abort {
            // MPI_Abort (its event is raised already): now that the rank has exited, end the
            // job with its code.
            if !job.failing() {
                let why = format!("rank {} on node {node} (pid {}) called MPI_Abort with code {code}", st.rank, st.pid);
                self.fail_job(r, st.jobid, code, why);
            }
        } else if let Some((code, how)) = super::describe_exit(&st) {
            if !job.failing() {
                let why = if st.error.is_empty() {
                    format!("rank {} on node {host} (pid {}) {how}", st.rank, st.pid)
                } else {
                    how
                };
                // Told first, then (unless the job recovers) ended.
                self.proc_aborted_event(r, st.jobid, st.rank, code, &why);
                if self.recovers(st.jobid) {
                    self.survive(st.jobid, code, why);
                } else {
                    self.fail_job(r, st.jobid, code, why);
                }
            }
        }
        self.maybe_end(r, st.jobid);
    }

    /// A job ends for its prun once its own procs and every job it spawned have ended.
    pub(crate) fn maybe_end(&mut self, r: &Core, jobid: u32) {
        let Some(job) = self.jobs.get(&jobid) else { return };
        if (job.reported.len() as u32) < job.placement.nprocs() || !job.children.is_empty() {
            return;
        }
        let mut job = self.jobs.remove(&jobid).expect("checked above");
        let (exit_code, message) =
            job.first_failure.clone().or_else(|| job.survived.clone()).unwrap_or((0, String::new()));
        info!(jobid, exit_code, parent = ?job.parent, "job ended");
        match job.array {
            Some((array, index)) => self.array_element_ended(array, index, jobid, exit_code, &message),
            None if job.parent.is_some() || (job.kept.is_some() && !job.attached) => {}
            None => {
                let ended = JobEnded { exit_code, message: message.clone(), jobid, ..Default::default() };
                let ended = event(job_event::Event::Ended(ended));
                match job.preload {
                    Some(false) => drop(self.unstaging.insert(jobid, (job.client, ended))),
                    _ => self.tell(job.client, ended),
                }
            }
        }
        self.job_control(JobControl { jobid, cleanup: true, ..Default::default() });
        if let Some(keep) = job.preload {
            self.out.push(JobOut::Unstage { jobid, keep });
        }
        self.job_left(r, jobid, &job);
        if job.parent.is_none() && job.array.is_none() {
            let info = JobInfo {
                jobid,
                state: "ended".into(),
                exit_code,
                message,
                nprocs: job.placement.nprocs(),
                nodes: job.placement.daemons().map(|d| r.host_of(d).to_string()).collect(),
                elapsed_ms: self.now.saturating_sub(job.started_ns) / 1_000_000,
                command: std::mem::take(&mut job.command),
                uid: job.uid,
                detached: job.kept.is_some(),
                wait_ms: job.wait_ns / 1_000_000,
                cancelled: job.cancelled,
                ..Default::default()
            };
            self.remember(info, job.kept.take());
        }
        self.drain_queue(r);
        if self.jobs.is_empty() && self.queue.is_empty() {
            self.out.push(JobOut::AllEnded);
        }
    }

    pub(crate) fn on_timeout(&mut self, r: &Core, jobid: u32) {
        let Some(job) = self.jobs.get(&jobid) else { return };
        let t = job.spec_timeout;
        let why = format!("job {jobid} exceeded its --timeout of {t} s and was killed");
        if job.stacks_on_timeout && !job.failing() {
            // The ranks' stacks first (where it hung), then the kill.
            self.notice(jobid, format!("job {jobid} exceeded its --timeout of {t} s: its ranks' stack traces follow"));
            self.request_stacks(r, jobid, StackFor::Timeout(why));
            return;
        }
        self.fail_job(r, jobid, TIMEOUT_EXIT, why);
    }

    /// Daemons died; their procs are lost and their jobs fail.
    pub(crate) fn lost_daemons(&mut self, r: &Core, failed: &BTreeSet<Rank>) {
        let mut hits = Vec::new();
        for (&jobid, job) in &self.jobs {
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
                self.daemon_lost_events(r, d, &lost);
            }
        }
        // One sentence per job naming every daemon it lost here; a loss under a job that a
        // loss already failed is told too, so no lost daemon goes unnamed.
        let mut by_job: BTreeMap<u32, Vec<(Rank, Vec<u32>)>> = BTreeMap::new();
        for (jobid, d, ranks) in hits {
            by_job.entry(jobid).or_default().push((d, ranks));
        }
        for (jobid, lost) in by_job {
            let why = lost_sentence(r, jobid, &lost);
            let (failing, array) =
                self.jobs.get(&jobid).map_or((false, false), |j| (j.first_failure.is_some(), j.array.is_some()));
            if self.recovers(jobid) {
                self.survive(jobid, LOST_EXIT, why);
            } else if failing {
                // Its first failure keeps the job's status; the loss is still said (an array
                // element tells only its first failure, with its end).
                if !array {
                    self.notice(jobid, format!("{why} (too)"));
                }
            } else {
                self.fail_job(r, jobid, LOST_EXIT, why);
            }
            if let Some(job) = self.jobs.get_mut(&jobid) {
                job.reported.extend(lost.into_iter().flat_map(|(_, ranks)| ranks));
            }
            self.maybe_end(r, jobid);
        }
        self.rescatter(r);
        self.stacks_lost(r, failed);
        // A queued job may no longer fit the DVM that is left.
        self.drain_queue(r);
    }

    /// After a loss: every running job's residuals again, to its live daemons with ranks not
    /// yet reported (a daemon that holds its residual already ignores the copy).
    fn rescatter(&mut self, r: &Core) {
        let topo = r.topology();
        let mut again = Vec::new();
        for job in self.jobs.values() {
            let slices: Vec<(Rank, Bytes)> = job
                .residuals
                .iter()
                .filter(|(d, _)| {
                    topo.is_alive(*d) && job.placement.procs_on(*d).iter().any(|k| !job.reported.contains(&k))
                })
                .cloned()
                .collect();
            if !slices.is_empty() {
                again.push(slices);
            }
        }
        for slices in again {
            self.out.push(JobOut::Scatter { tag: tags::LAUNCH_RESIDUALS, slices });
        }
    }

    /// A command from a daemon that the job table handles; the others come back.
    pub(crate) fn on_cmd(&mut self, r: &Core, origin: Rank, body: daemon_cmd::Body) -> Option<daemon_cmd::Body> {
        match body {
            daemon_cmd::Body::ProcStatus(st) => self.on_proc_status(r, st),
            daemon_cmd::Body::Iof(chunk) => self.on_iof(origin, chunk),
            daemon_cmd::Body::JobAbort(a) => self.on_job_abort(r, a),
            daemon_cmd::Body::JobFail(f) => self.fail_job(r, f.jobid, f.code, f.reason),
            daemon_cmd::Body::SpawnReq(req) => self.on_spawn_req(r, origin, req),
            daemon_cmd::Body::LaunchReport(rep) => self.on_launch_report(r, rep),
            daemon_cmd::Body::DataReq(req) => self.on_data_req(origin, req),
            daemon_cmd::Body::JobsConnected(c) => self.on_jobs_connected(c.jobids),
            daemon_cmd::Body::JobLog(l) => self.on_log(r, l.daemon, l.jobid, l.rank, &l.text),
            daemon_cmd::Body::BindingReport(b) => {
                if self.jobs.contains_key(&b.jobid) && !b.lines.is_empty() {
                    self.notice(b.jobid, b.lines.join("\n"));
                }
            }
            daemon_cmd::Body::StackResp(s) => self.on_stack_resp(r, s),
            other => return Some(other),
        }
        None
    }
}

/// Warn about a command the HNP did not expect (it changes nothing).
pub(crate) fn unexpected(origin: Rank, body: &daemon_cmd::Body) {
    warn!(origin, "unexpected daemon command {body:?}");
}

/// "daemon 3 on node n3 was lost with ranks [3] of job 1", or for several daemons "daemons 1
/// on node n1 (ranks [1]) and 2 on node n2 (ranks [2]) were lost with job 1" (up to 8 named).
fn lost_sentence(r: &Core, jobid: u32, lost: &[(Rank, Vec<u32>)]) -> String {
    const SHOWN: usize = 8;
    if let [(d, ranks)] = lost {
        return format!("daemon {d} on node {} was lost with ranks {ranks:?} of job {jobid}", r.host_of(*d));
    }
    let mut parts: Vec<String> =
        lost.iter().take(SHOWN).map(|(d, ranks)| format!("{d} on node {} (ranks {ranks:?})", r.host_of(*d))).collect();
    if lost.len() > SHOWN {
        parts.push(format!("{} more", lost.len() - SHOWN));
    }
    let last = parts.pop().expect("two or more");
    format!("daemons {} and {last} were lost with job {jobid}", parts.join(", "))
}
