//! The HNP's control requests (prun, pterm, dvm-bench) and the DVM's own life: status, tree
//! views, benchmarks, the boot's failures and its deadline, and termination in order (running
//! jobs end first, each telling its prun why, then TERMINATE; after a grace, regardless).
//!
//! Never: a reply handle. A request comes with a token; its answer leaves as
//! [`super::Effect::Reply`] with that token.

use bytes::Bytes;
use dvm_proto::control::{
    BenchReply, BenchRequest, CancelReply, CancelRequest, DaemonStatus, JobsReply, LaunchPlanReply, SignalReply,
    SignalRequest, StackTracesReply, StatusReply, StdinMsg, TerminateReply, TreeViewsReply,
};
use dvm_proto::daemon::{daemon_cmd, TreeView};
use dvm_proto::job::JobSpec;
use dvm_rml::Rank;
use tracing::{debug, warn};

use super::{Effect, LauncherExit, Node};
use crate::host::Host;
use crate::jobs::hnp::JobTable;
use crate::jobs::{ClientId, Forward};
use crate::{dtags, Exit, Input};

/// A control request.
#[derive(Debug)]
pub enum Control {
    Status,
    Terminate,
    TreeViews,
    Bench(BenchRequest),
    LaunchPlan(JobSpec),
    Signal(SignalRequest),
    /// A job from a prun; everything about it goes to `client` (no reply by token).
    Launch(JobSpec, ClientId),
    /// prun's stdin for its job (no reply).
    Stdin(StdinMsg),
    /// The jobs (and, when asked, the nodes) for the job tools.
    Jobs {
        nodes: bool,
    },
    Cancel(CancelRequest),
    /// Every rank's stack trace of a running job (answered once the daemons did), for a user.
    StackTraces(u32, u32),
    /// Follow a detached job (for a user); everything about it goes to `client` (no reply by
    /// token).
    Attach(u32, u32, ClientId),
    /// Copy files to the daemons (the broadcast tool); answered once in place, or not.
    Stage(crate::stage::StagePlan),
}

/// The answer to a control request.
#[derive(Debug)]
pub enum Reply {
    Status(StatusReply),
    Terminate(TerminateReply),
    TreeViews(Result<TreeViewsReply, String>),
    Bench(Result<BenchReply, String>),
    LaunchPlan(Result<LaunchPlanReply, String>),
    Signal(SignalReply),
    Jobs(JobsReply),
    Cancel(CancelReply),
    StackTraces(Result<StackTracesReply, String>),
    Stage(dvm_proto::control::StageReply),
}

/// HNP-only state of the control side.
#[derive(Debug)]
pub(crate) struct HnpControl {
    session_dir: String,
    one_job: bool,
    /// Terminate calls waiting for every daemon to hold TERMINATE.
    terminate: Vec<u64>,
    /// Termination asked for while jobs ran: they are being ended first.
    pub(crate) terminate_pending: bool,
    pub(crate) terminate_deadline_ns: u64,
    tree_query: Option<(u64, Vec<TreeView>, u64)>,
    bench: Option<u64>,
    next_query: u64,
}

impl HnpControl {
    pub(crate) fn new(session_dir: String, one_job: bool, terminate_deadline_ns: u64) -> HnpControl {
        HnpControl {
            session_dir,
            one_job,
            terminate_deadline_ns,
            terminate: Vec::new(),
            terminate_pending: false,
            tree_query: None,
            bench: None,
            next_query: 1,
        }
    }
}

impl<H: Host> Node<H> {
    pub(super) fn reply(&mut self, token: u64, reply: Reply) {
        self.effects.push_back(Effect::Reply { token, reply });
    }

    pub(super) fn on_control(&mut self, token: u64, req: Control) {
        let Some(ctl) = self.ctl.as_mut() else { return };
        match req {
            Control::Launch(spec, client) => {
                if ctl.terminate_pending {
                    let item = Forward::Refused("the DVM is terminating".into());
                    return self.effects.push_back(Effect::ToClient { client, item });
                }
                self.with_jobs(|j, r| {
                    j.submit(r, spec, client);
                });
            }
            Control::Attach(jobid, uid, client) => {
                let mut refused = None;
                self.with_jobs(|j, _| {
                    refused = j.check_owner(jobid, uid, true).and_then(|()| j.attach(jobid, client)).err()
                });
                if let Some(why) = refused {
                    self.effects.push_back(Effect::ToClient { client, item: Forward::Refused(why) });
                }
            }
            Control::Stage(plan) => self.on_stage_control(token, plan),
            Control::Jobs { nodes } => {
                let list = self.jobs.as_ref().map(|j| j.list(&self.router, nodes)).unwrap_or_default();
                self.reply(token, Reply::Jobs(list));
            }
            Control::StackTraces(jobid, uid) => {
                let mut refused = Some(format!("no job {jobid} runs in this DVM"));
                self.with_jobs(|j, r| {
                    refused = j.check_owner(jobid, uid, false).and_then(|()| j.stack_traces(r, jobid, token)).err()
                });
                if let Some(why) = refused {
                    self.reply(token, Reply::StackTraces(Err(why)));
                }
            }
            Control::Cancel(req) => {
                let mut reply = CancelReply::default();
                if ctl.terminate_pending {
                    reply.errors.push("the DVM is terminating: every job ends with it".into());
                } else {
                    self.with_jobs(|j, r| reply = j.cancel(r, &req.jobids, req.all, req.uid));
                }
                self.reply(token, Reply::Cancel(reply));
            }
            Control::Stdin(msg) => {
                if !ctl.terminate_pending {
                    self.with_jobs(|j, _| j.route_stdin(msg.jobid, msg.data, msg.eof));
                }
            }
            Control::Signal(req) => {
                let mut res = Err("the DVM is terminating".to_string());
                if !ctl.terminate_pending {
                    self.with_jobs(|j, r| res = j.signal(r, req.jobid, req.signal, req.uid));
                }
                let reply = match res {
                    Ok(()) => SignalReply { ok: true, error: String::new() },
                    Err(error) => SignalReply { ok: false, error },
                };
                self.reply(token, Reply::Signal(reply));
            }
            Control::LaunchPlan(spec) => {
                let plan = JobTable::plan(&self.router, &spec);
                self.reply(token, Reply::LaunchPlan(plan));
            }
            Control::Status => {
                let status = self.status();
                self.reply(token, Reply::Status(status));
            }
            Control::Terminate => self.terminate(token),
            Control::TreeViews => {
                if ctl.tree_query.is_some() {
                    return self.reply(token, Reply::TreeViews(Err("a tree query is already running".into())));
                }
                let q = ctl.next_query;
                ctl.next_query += 1;
                ctl.tree_query = Some((q, Vec::new(), token));
                let payload = Bytes::copy_from_slice(&q.to_le_bytes());
                self.inbox.push_back(Input::Xcast { tag: dtags::TREE_QUERY, payload });
            }
            Control::Bench(req) => {
                if ctl.bench.is_some() {
                    return self.reply(token, Reply::Bench(Err("a benchmark is already running".into())));
                }
                let parse = |m: &str| if m.is_empty() { Ok(None) } else { m.parse().map(Some) };
                let fence_movement = match parse(&req.fence_movement) {
                    Ok(m) => m,
                    Err(e) => return self.reply(token, Reply::Bench(Err(format!("benchmark: {e}")))),
                };
                let bcast_movement = match req.bcast_movement.as_str() {
                    "" => None,
                    m => match m.parse() {
                        Ok(m) => Some(m),
                        Err(e) => return self.reply(token, Reply::Bench(Err(format!("benchmark: {e}")))),
                    },
                };
                ctl.bench = Some(token);
                let (kind, count, bytes) = (req.kind(), req.count, req.bytes);
                self.inbox.push_back(Input::Bench { kind, count, bytes, fence_movement, bcast_movement });
            }
        }
    }

    fn status(&self) -> StatusReply {
        let r = &self.router;
        let size = r.topology().size();
        let repaired = r.topology().repaired();
        let contacts = r.contacts().cloned().unwrap_or_default();
        let daemons = (0..size)
            .map(|rank| {
                let c = contacts.get(&rank).cloned().unwrap_or_default();
                let alive = repaired.is_alive(rank);
                DaemonStatus {
                    rank,
                    host: c.host,
                    addr: c.addr,
                    pid: c.pid,
                    parent: if alive { repaired.parent_of(rank).unwrap_or(u32::MAX) } else { u32::MAX },
                    children: if alive { repaired.children_of(rank) } else { Vec::new() },
                    slots: c.slots,
                    alive,
                }
            })
            .collect();
        StatusReply {
            num_daemons: size,
            radix: r.topology().radix(),
            uptime_ms: self.now / 1_000_000,
            daemons,
            session_dir: self.ctl.as_ref().map(|c| c.session_dir.clone()).unwrap_or_default(),
        }
    }

    fn terminate(&mut self, token: u64) {
        let ready = self.router.is_ready();
        let Some(ctl) = self.ctl.as_mut() else { return };
        if !ready {
            // Not ready yet: no broadcast can reach every daemon; abandon the boot (the shell
            // kills every daemon it started and removes the session).
            let reply = TerminateReply { ok: true, message: "start-up abandoned".into() };
            self.reply(token, Reply::Terminate(reply));
            return self.exit(Exit::BootFailed("start-up interrupted: terminated before the DVM was ready".into()));
        }
        ctl.terminate.push(token);
        if ctl.terminate_pending {
            return;
        }
        ctl.terminate_pending = true;
        // Running jobs end first, each with a named reason and its own status, so every prun
        // hears why; then the daemons stop.
        let mut running = false;
        self.with_jobs(|j, r| running = j.end_jobs_for_termination(r));
        if running {
            self.arm_terminate_grace();
        } else {
            self.terminate_now();
        }
    }

    /// Every daemon holds TERMINATE: the terminate calls are answered.
    pub(super) fn terminated(&mut self) {
        let tokens = self.ctl.as_mut().map(|c| std::mem::take(&mut c.terminate)).unwrap_or_default();
        for token in tokens {
            let reply = TerminateReply { ok: true, message: "every daemon received TERMINATE".into() };
            self.reply(token, Reply::Terminate(reply));
        }
    }

    /// TERMINATE did not reach every daemon in time (one was lost on the way, and nothing is
    /// repaired once the DVM terminates): the HNP ends anyway, saying which daemons it did not
    /// hear from; those lose the HNP and end too.
    pub(super) fn terminate_deadline(&mut self) {
        let text = format!(
            "dvmd: TERMINATE was not acknowledged by every daemon within {:?}; the HNP ends, and every \
             daemon it did not reach ends when it loses the HNP",
            std::time::Duration::from_nanos(self.ctl.as_ref().map_or(0, |c| c.terminate_deadline_ns))
        );
        warn!("{text}");
        self.effects.push_back(Effect::Say(text));
        let tokens = self.ctl.as_mut().map(|c| std::mem::take(&mut c.terminate)).unwrap_or_default();
        for token in tokens {
            let reply = TerminateReply { ok: false, message: "not every daemon acknowledged TERMINATE in time".into() };
            self.reply(token, Reply::Terminate(reply));
        }
        self.exit(Exit::Terminated);
    }

    /// HNP of a `--one-job` DVM: its job has ended and its prun has received everything and
    /// hung up, so the DVM terminates, as if its prun had asked.
    pub(super) fn terminate_one_job_dvm(&mut self) {
        if self.ctl.as_ref().is_some_and(|c| c.one_job) && !self.router.is_terminating() {
            debug!("the DVM's one job has ended; terminating");
            self.terminate(u64::MAX);
        }
    }

    pub(super) fn bench_done(&mut self, r: Result<BenchReply, String>) {
        if let Some(token) = self.ctl.as_mut().and_then(|c| c.bench.take()) {
            self.reply(token, Reply::Bench(r));
        }
    }

    /// Every daemon's answer to a tree query: this daemon's view, to the HNP.
    pub(super) fn tree_view(&mut self, payload: Bytes) {
        let query = u64::from_le_bytes(payload.get(..8).and_then(|b| b.try_into().ok()).unwrap_or_default());
        let stats = self.host.loop_stats();
        let topo = self.router.topology();
        let view = TreeView {
            query,
            rank: self.router.me(),
            parent: topo.parent().unwrap_or(u32::MAX),
            children: topo.children().to_vec(),
            // The name the node itself reports (the label is in the HNP's status).
            host: self.hostname.clone(),
            pid: self.pid,
            rss_kib: self.host.rss_kib(),
            fences_in_flight: self.router.fences_in_flight() as u64,
            late_p50_us: stats.late_p50_us,
            late_p99_us: stats.late_p99_us,
            late_max_us: stats.late_max_us,
            longest_step_us: stats.longest_step_us,
        };
        self.inbox.push_back(Input::Cmd { dst: 0, body: daemon_cmd::Body::TreeView(view) });
    }

    pub(super) fn on_tree_view(&mut self, v: TreeView) {
        let Some((q, views, _)) = self.ctl.as_mut().and_then(|c| c.tree_query.as_mut()) else { return };
        if v.query != *q {
            return;
        }
        views.push(v);
        self.maybe_finish_tree_query();
    }

    pub(super) fn maybe_finish_tree_query(&mut self) {
        let live: Vec<Rank> = self.router.topology().live_ranks().collect();
        let Some(ctl) = self.ctl.as_mut() else { return };
        let Some((_, views, _)) = ctl.tree_query.as_ref() else { return };
        if !live.iter().all(|r| views.iter().any(|v| v.rank == *r)) {
            return;
        }
        let (_, mut views, token) = ctl.tree_query.take().expect("checked above");
        views.retain(|v| live.contains(&v.rank));
        views.sort_by_key(|v| v.rank);
        let views = views
            .into_iter()
            .map(|v| dvm_proto::control::TreeView {
                rank: v.rank,
                parent: v.parent,
                children: v.children,
                host: v.host,
                pid: v.pid,
                rss_kib: v.rss_kib,
                fences_in_flight: v.fences_in_flight,
                late_p50_us: v.late_p50_us,
                late_p99_us: v.late_p99_us,
                late_max_us: v.late_max_us,
                longest_step_us: v.longest_step_us,
            })
            .collect();
        self.reply(token, Reply::TreeViews(Ok(TreeViewsReply { views })));
    }

    /// A process the boot started ended: before the DVM is ready the boot fails, naming it;
    /// the step that holds every other daemon ends the DVM with it.
    pub(super) fn on_launcher_exit(&mut self, ev: LauncherExit) {
        if self.ctl.is_none() {
            return;
        }
        let LauncherExit { what, how, printed, step } = ev;
        if !self.router.is_ready() {
            return self
                .exit(Exit::BootFailed(format!("{what} {how} before the DVM was ready; it printed: {printed}")));
        }
        if self.router.is_terminating() {
            return;
        }
        if step {
            // The step that holds every other daemon is gone (scancel, the allocation ended, or
            // a daemon failed and the step was killed): the DVM ends with it.
            warn!("{what} {how}; it printed: {printed}; terminating the DVM");
            self.terminate(u64::MAX);
        } else {
            warn!("{what}: its process {how}");
        }
    }

    /// The boot's deadline passed: unless the DVM is ready, it fails naming every daemon that
    /// did not check in, with what it printed.
    pub(super) fn startup_timeout(&mut self) {
        if self.ctl.is_none() || self.router.is_ready() {
            return;
        }
        let contacts = self.router.contacts().cloned().unwrap_or_default();
        let missing: Vec<String> = (1..self.router.topology().size())
            .filter(|r| !contacts.contains_key(r))
            .map(|r| {
                let (host, printed) = self.host.launched(r).unwrap_or_else(|| (self.router.host_of(r), String::new()));
                format!("daemon {r} on host {host} (it printed: {printed})")
            })
            .collect();
        let what = if missing.is_empty() {
            "the WIREUP broadcast did not complete".to_string()
        } else {
            format!("{} daemon(s) did not check in: {}", missing.len(), missing.join("; "))
        };
        self.exit(Exit::BootFailed(format!("DVM start-up timed out: {what}")));
    }
}
