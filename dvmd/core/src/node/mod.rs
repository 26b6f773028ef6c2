//! `Node`: the whole daemon as one sans-IO value, shaped like quinn-proto's `Connection`.
//!
//! Inputs, each with `now` (ns, monotonic, from the shell): [`Node::handle_frame`],
//! [`Node::handle_link`], [`Node::handle_control`], [`Node::handle_proc`],
//! [`Node::handle_pmix`], [`Node::handle_pmix_lost`], [`Node::handle_prun`],
//! [`Node::handle_boot`], [`Node::handle_stage`], [`Node::handle_timeout`] (and
//! [`Node::handle_start`] once; [`Node::handle_input`] for a driver's own workloads).
//! Outputs, drained by the shell in one place, in this order after every input:
//! [`Node::poll_transmit`] (frames and the contact table), [`Node::poll`] ([`Effect`]s:
//! processes, prun streams, control replies, PMIx answers and the worker's replacement, disk
//! work, ready, exit), then [`Node::poll_timeout`].
//!
//! Owns: the order in which its parts see an input and the one loop that carries what each
//! asks of another: the router ([`crate::Core`]), the HNP's job table
//! ([`crate::jobs::hnp::JobTable`]), the local jobs ([`crate::jobs::local::LocalJobs`]), the
//! timers ([`crate::timer::Timers`]), the HNP's control requests (`control`), file staging,
//! and PMIx hosting ([`crate::pmix::Pmix`], whose server is the [`Host`]'s, called
//! synchronously).
//! Never: a socket, a clock, a process, a channel or a reply handle: a prun is a
//! [`ClientId`], a control call a token, a PMIx upcall its reply id.
//! Invariants: once an [`Effect::Exit`] is produced nothing more is decided; what one part asks
//! of the router is stepped in the order asked.

mod control;
mod stage;

use std::collections::{BTreeSet, VecDeque};
use std::net::SocketAddr;

use bytes::Bytes;
use dvm_grpcomm::tags;
use dvm_proto::daemon::daemon_cmd;
use dvm_proto::rml::{Contact, FrameHeader};
use dvm_rml::Rank;

pub use control::{Control, Reply};

use crate::host::Host;
use crate::jobs::hnp::{JobOut, JobTable};
use crate::jobs::local::{LocalConfig, LocalJobs, LocalOut};
use crate::jobs::{ClientId, Forward, ProcCmd, ProcEvent, TERMINATE_GRACE_NS};
use crate::pmi::{Pmi, PmiOut};
use crate::pmix::{Pmix, PmixEffect, PmixOut, With};
use crate::stage::{origin::Origin, sink::Sink};
use crate::timer::{Timer, Timers};
use crate::{dtags, Core, CoreConfig, Effect as R, Exit, Input};

/// How long a daemon declared dead has to receive its `Evicted` before the HNP closes its
/// connections (closing at once could drop the notice still queued).
pub const EVICT_GRACE_NS: u64 = 1_000_000_000;

/// Something to put on the wire, in order.
#[derive(Debug)]
pub enum Transmit {
    /// This frame on the link to `next_hop`.
    Frame { next_hop: Rank, header: FrameHeader, payload: dvm_proto::Payload },
    /// The contact table (WIREUP): address of every other daemon, before any frame to one.
    Contacts(Vec<(Rank, SocketAddr)>),
    /// Close every connection to this daemon (declared dead, told so): if it is alive, it
    /// loses the HNP and ends instead of running on outside the DVM.
    Disconnect(Rank),
}

/// An effect for the shell, in order.
#[derive(Debug)]
pub enum Effect {
    /// For the process layer: start, signal, feed or forget procs.
    Proc(ProcCmd),
    /// To a job's prun.
    ToClient { client: ClientId, item: Forward },
    /// The answer to a control call.
    Reply { token: u64, reply: Reply },
    /// HNP: the DVM is ready.
    Ready,
    /// A fence the driver started with [`Node::handle_input`] (`FenceOwner::Driver`) ended.
    FenceDone { key: u64, result: Result<Bytes, dvm_grpcomm::FenceError> },
    /// For the PMIx worker: an upcall's answer, replace it, end it.
    Pmix(PmixEffect),
    /// Disk work of a file transfer (answered with [`Node::handle_stage`]).
    Stage(crate::stage::StageIo),
    /// HNP: a line for the HNP's stderr (a lost daemon, named).
    Say(String),
    /// This daemon's loop ends.
    Exit(Exit),
}

/// A link event from the transport.
#[derive(Debug)]
pub enum LinkEvent {
    /// The link to `peer` was lost (closed, silent, connect gave up).
    Lost { peer: Rank, reason: String },
    /// A send toward next hop `peer` failed at once.
    SendFailed { peer: Rank },
}

/// What a prun stream did.
#[derive(Debug)]
pub enum PrunEvent {
    /// prun went away before its job ended.
    Gone(ClientId),
    /// prun took `bytes` of `daemon`'s output of `jobid`.
    Delivered { jobid: u32, daemon: Rank, bytes: u64 },
    /// prun was sent its last event and hung up (or was gone).
    Closed(ClientId),
}

/// HNP: a process the boot started (a daemon, or the step holding them) ended.
#[derive(Debug)]
pub struct LauncherExit {
    /// "daemon 3 on host n3", or the step's description.
    pub what: String,
    /// "exited with status 1", "was killed by signal 9".
    pub how: String,
    /// What it printed (its last lines).
    pub printed: String,
    /// The step that holds every other daemon (its end ends the DVM).
    pub step: bool,
}

/// How a daemon starts.
#[derive(Debug)]
pub enum Start {
    /// A daemon: report `own` to the HNP.
    CheckIn(Contact),
    /// The HNP of a one-daemon DVM: nothing to wait for.
    WireSingle,
    /// The HNP of a larger DVM: wait for the check-ins.
    AwaitCheckIns,
}

/// The HNP's own settings.
#[derive(Debug, Clone)]
pub struct HnpConfig {
    pub own: Contact,
    pub session_dir: String,
    /// The DVM exists for one job (`dvmd --one-job`): once it ended, the DVM terminates.
    pub one_job: bool,
    /// The boot must be done by then (ns after start); None: no bound.
    pub startup_timeout_ns: Option<u64>,
    /// Measure the link to a child once WIREUP is held everywhere (and calibrate fences).
    pub measure_link: bool,
    /// How long TERMINATE may take to reach every daemon before the HNP ends regardless: a
    /// few of the transport's loss bounds (a daemon lost meanwhile is no longer repaired).
    pub terminate_deadline_ns: u64,
}

/// A daemon's fixed inputs.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub core: CoreConfig,
    pub hnp: Option<HnpConfig>,
    pub local: LocalConfig,
    /// The name the node itself reports (tree views) and the daemon's pid.
    pub hostname: String,
    pub pid: u32,
}

/// One daemon.
pub struct Node<H: Host> {
    router: Core,
    host: H,
    /// PMIx hosting's decisions (the server itself is the host's).
    pmix: Pmix,
    /// The simple-PMI server (PMI-1 and PMI-2 on each rank's fd).
    pmi: Pmi,
    /// HNP only.
    jobs: Option<JobTable>,
    ctl: Option<control::HnpControl>,
    local: LocalJobs,
    /// HNP: the transfers it started.
    stage_out: Option<Origin>,
    /// The transfers this daemon receives.
    stage_in: Sink,
    timers: Timers,
    hostname: String,
    pid: u32,
    /// Router inputs asked for and not stepped yet.
    inbox: VecDeque<Input>,
    transmits: VecDeque<Transmit>,
    effects: VecDeque<Effect>,
    exited: bool,
    now: u64,
}

impl<H: Host> Node<H> {
    pub fn new(cfg: NodeConfig, host: H) -> Result<Node<H>, dvm_rml::TopologyError> {
        let mut router = Core::new(cfg.core, cfg.hnp.as_ref().map(|h| h.own.clone()))?;
        let mut timers = Timers::default();
        let ctl = cfg.hnp.map(|h| {
            if h.measure_link {
                router.measure_link();
            }
            if let Some(t) = h.startup_timeout_ns {
                timers.set(Timer::Startup, t);
            }
            control::HnpControl::new(h.session_dir, h.one_job, h.terminate_deadline_ns)
        });
        let pmix = Pmix::new(router.me(), cfg.hostname.clone());
        let pmi = Pmi::new(router.me(), cfg.hostname.clone());
        Ok(Node {
            router,
            host,
            pmix,
            pmi,
            jobs: ctl.as_ref().map(|_| JobTable::default()),
            stage_out: ctl.as_ref().map(|_| Origin::default()),
            stage_in: Sink::default(),
            ctl,
            local: LocalJobs::new(cfg.local),
            timers,
            hostname: cfg.hostname,
            pid: cfg.pid,
            inbox: VecDeque::new(),
            transmits: VecDeque::new(),
            effects: VecDeque::new(),
            exited: false,
            now: 0,
        })
    }

    // ------------------------------------------------------------------ accessors

    pub fn router(&self) -> &Core {
        &self.router
    }
    pub fn host(&self) -> &H {
        &self.host
    }
    pub fn host_mut(&mut self) -> &mut H {
        &mut self.host
    }
    pub fn pmix(&self) -> &Pmix {
        &self.pmix
    }
    pub fn pmi(&self) -> &Pmi {
        &self.pmi
    }
    /// This daemon hosts a PMIx server; an idle worker grown by `recycle_kib` is replaced.
    pub fn configure_pmix(&mut self, recycle_kib: u64) {
        self.pmix.configure(recycle_kib);
    }
    /// HNP: the job table.
    pub fn jobs(&self) -> Option<&JobTable> {
        self.jobs.as_ref()
    }
    pub fn local_jobs(&self) -> &LocalJobs {
        &self.local
    }
    pub fn timers(&self) -> &Timers {
        &self.timers
    }
    /// An [`Effect::Exit`] was produced: nothing more is decided.
    pub fn has_exited(&self) -> bool {
        self.exited
    }

    // ------------------------------------------------------------------ inputs

    pub fn handle_start(&mut self, now: u64, start: Start) {
        match start {
            Start::CheckIn(own) => self.inbox.push_back(Input::CheckIn(own)),
            Start::WireSingle => self.inbox.push_back(Input::WireSingle),
            Start::AwaitCheckIns => {}
        }
        self.run(now);
    }

    pub fn handle_frame(&mut self, now: u64, from_peer: Rank, header: FrameHeader, payload: Bytes) {
        self.inbox.push_back(Input::Frame { from_peer, header, payload });
        self.run(now);
    }

    pub fn handle_link(&mut self, now: u64, ev: LinkEvent) {
        self.inbox.push_back(match ev {
            LinkEvent::Lost { peer, reason } => Input::PeerLost { peer, reason },
            LinkEvent::SendFailed { peer } => Input::SendFailed { peer },
        });
        self.run(now);
    }

    /// A control call (HNP); its answer comes back as [`Effect::Reply`] with `token`.
    pub fn handle_control(&mut self, now: u64, token: u64, req: Control) {
        self.tick(now);
        if !self.exited {
            self.on_control(token, req);
        }
        self.run(now);
    }

    pub fn handle_proc(&mut self, now: u64, ev: ProcEvent) {
        self.tick(now);
        if !self.exited {
            let me = self.router.me();
            self.local.on_proc(me, &mut With { pmix: &mut self.pmix, host: &mut self.host, pmi: &mut self.pmi }, ev);
        }
        self.run(now);
    }

    /// A router input from a workload of the node's driver (the simulator's fence chains and
    /// broadcasts), stepped like any other.
    pub fn handle_input(&mut self, now: u64, input: Input) {
        self.inbox.push_back(input);
        self.run(now);
    }

    /// An upcall of the daemon's current PMIx worker (the shell drops those of a worker it
    /// replaced): its answer leaves as [`PmixEffect::Reply`] with the upcall's reply id.
    pub fn handle_pmix(&mut self, now: u64, ev: dvm_proto::pmixworker::WorkerEvent) {
        self.tick(now);
        if !self.exited {
            self.pmix.on_upcall(&mut self.host, ev);
        }
        self.run(now);
    }

    /// The current PMIx worker (`pid`) ended by itself (`how`): the jobs with ranks here fail.
    pub fn handle_pmix_lost(&mut self, now: u64, pid: u32, how: &str) {
        self.tick(now);
        if !self.exited {
            self.pmix.worker_lost(pid, how);
        }
        self.run(now);
    }

    pub fn handle_prun(&mut self, now: u64, ev: PrunEvent) {
        self.tick(now);
        if !self.exited {
            match ev {
                PrunEvent::Gone(client) => self.with_jobs(|j, r| j.on_client_gone(r, client)),
                PrunEvent::Delivered { jobid, daemon, bytes } => {
                    self.with_jobs(|j, _| j.on_delivered(jobid, daemon, bytes))
                }
                // A one-job DVM ends once its prun has everything: not before, or output still
                // queued for a slow reader would be lost with the DVM.
                PrunEvent::Closed(_) => self.terminate_one_job_dvm(),
            }
        }
        self.run(now);
    }

    pub fn handle_boot(&mut self, now: u64, ev: LauncherExit) {
        self.tick(now);
        if !self.exited {
            self.on_launcher_exit(ev);
        }
        self.run(now);
    }

    /// Time passed: call at or after [`Node::poll_timeout`].
    pub fn handle_timeout(&mut self, now: u64) {
        self.tick(now);
        if self.router.next_deadline().is_some_and(|d| d <= now) {
            self.inbox.push_back(Input::Tick);
        }
        while let Some(t) = self.timers.pop_expired(now) {
            if self.exited {
                break;
            }
            self.on_timer(t);
            self.carry();
        }
        self.run(now);
    }

    // ------------------------------------------------------------------ outputs

    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    pub fn poll(&mut self) -> Option<Effect> {
        self.effects.pop_front()
    }

    /// Something is waiting in [`Node::poll_transmit`] or [`Node::poll`] (an input handed in
    /// while draining leaves its output there).
    pub fn has_output(&self) -> bool {
        !self.transmits.is_empty() || !self.effects.is_empty()
    }

    /// When to call [`Node::handle_timeout`] next.
    pub fn poll_timeout(&self) -> Option<u64> {
        if self.exited {
            return None;
        }
        match (self.router.next_deadline(), self.timers.next()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    // ------------------------------------------------------------------ the loop

    /// Step every router input asked for and carry what each part asks of another, until
    /// nothing is left. The one loop.
    fn run(&mut self, now: u64) {
        self.tick(now);
        loop {
            self.carry();
            let Some(input) = self.inbox.pop_front() else { return };
            if self.exited {
                self.inbox.clear();
                return;
            }
            self.router.step(input, self.now);
            let effects: Vec<R> = self.router.drain().collect();
            for e in effects {
                self.on_router(e);
            }
        }
    }

    /// Move what the job table, the local jobs and the PMIx host asked for to the router's
    /// inbox and the shell's queues, in order.
    fn carry(&mut self) {
        loop {
            let mut moved = false;
            if let Some(jobs) = self.jobs.as_mut() {
                for o in std::mem::take(&mut jobs.out) {
                    moved = true;
                    match o {
                        JobOut::Client { client, item } => self.effects.push_back(Effect::ToClient { client, item }),
                        JobOut::Cmd { dst, body } => self.inbox.push_back(Input::Cmd { dst, body }),
                        JobOut::Xcast { tag, payload } => self.inbox.push_back(Input::Xcast { tag, payload }),
                        JobOut::Scatter { tag, slices } => self.inbox.push_back(Input::Scatter { tag, slices }),
                        JobOut::Arm(t, after) => self.timers.set(t, self.now.saturating_add(after)),
                        JobOut::Cancel(t) => self.timers.cancel(t),
                        JobOut::Stacks { token, reply } => {
                            self.effects.push_back(Effect::Reply { token, reply: Reply::StackTraces(reply) })
                        }
                        JobOut::Stage { jobid, plan, targets } => {
                            if let Some(o) = self.stage_out.as_mut() {
                                o.start(self.now, crate::stage::origin::Owner::Job(jobid), plan, targets);
                            }
                        }
                        JobOut::Unstage { jobid, keep } => {
                            if let Some(o) = self.stage_out.as_mut() {
                                o.release_job(jobid, keep);
                            }
                        }
                        JobOut::AllEnded => {
                            if self.ctl.as_ref().is_some_and(|c| c.terminate_pending) {
                                self.terminate_now();
                            }
                        }
                    }
                }
            }
            for o in std::mem::take(&mut self.local.out) {
                moved = true;
                match o {
                    LocalOut::Proc(cmd) => self.effects.push_back(Effect::Proc(cmd)),
                    LocalOut::ToHnp(body) => self.inbox.push_back(Input::Cmd { dst: 0, body }),
                }
            }
            moved |= self.carry_stage();
            for o in std::mem::take(&mut self.pmi.out) {
                moved = true;
                match o {
                    PmiOut::Router(input) => self.inbox.push_back(input),
                    PmiOut::Proc(cmd) => self.effects.push_back(Effect::Proc(cmd)),
                }
            }
            for o in std::mem::take(&mut self.pmix.out) {
                moved = true;
                match o {
                    PmixOut::Router(input) => self.inbox.push_back(input),
                    PmixOut::Effect(e) => self.effects.push_back(Effect::Pmix(e)),
                }
            }
            if !moved {
                return;
            }
        }
    }

    /// The clock moves on (never back), for every part that reads it.
    fn tick(&mut self, now: u64) {
        self.now = self.now.max(now);
        if let Some(jobs) = self.jobs.as_mut() {
            jobs.now = self.now;
        }
    }

    fn with_jobs(&mut self, f: impl FnOnce(&mut JobTable, &Core)) {
        if let Some(jobs) = self.jobs.as_mut() {
            f(jobs, &self.router);
        }
    }

    fn exit(&mut self, e: Exit) {
        if !self.exited {
            self.exited = true;
            self.effects.push_back(Effect::Exit(e));
        }
    }

    fn on_router(&mut self, e: R) {
        match e {
            R::Transmit { next_hop, header, payload } => {
                self.transmits.push_back(Transmit::Frame { next_hop, header, payload })
            }
            R::SetContacts(table) => self.transmits.push_back(Transmit::Contacts(table)),
            R::Ready => {
                self.timers.cancel(Timer::Startup);
                self.effects.push_back(Effect::Ready);
            }
            R::Deliver { tag, payload } => self.on_deliver(tag, payload),
            R::ScatterDeliver { tag, data } => {
                if tag == tags::LAUNCH_RESIDUALS {
                    self.local.on_residual(
                        &self.router,
                        &mut With { pmix: &mut self.pmix, host: &mut self.host, pmi: &mut self.pmi },
                        data,
                    );
                }
            }
            R::Cmd { origin, body } => self.on_cmd(origin, body),
            R::XcastHeld { key } => {
                if let Some(o) = self.stage_out.as_mut() {
                    o.on_held(key);
                }
            }
            R::DaemonsFailed { newly } => {
                let failed: BTreeSet<Rank> = newly.iter().copied().collect();
                self.pmix.daemons_lost(&mut self.host, &failed);
                if self.jobs.is_some() {
                    for &r in &newly {
                        let why = self.router.loss_reason(r).unwrap_or("declared dead");
                        let text = format!("dvmd: daemon {r} on host {} was lost: {why}", self.router.host_of(r));
                        self.effects.push_back(Effect::Say(text));
                    }
                    for &r in &newly {
                        self.timers.set(Timer::Disconnect(r), self.now.saturating_add(EVICT_GRACE_NS));
                    }
                    self.stage_lost(&failed);
                    self.with_jobs(|j, r| j.lost_daemons(r, &failed));
                    self.maybe_finish_tree_query();
                }
            }
            R::FenceDone { key, result } => self.pmix.fence_done(&mut self.host, key, result),
            R::DriverFenceDone { key, result } => self.effects.push_back(Effect::FenceDone { key, result }),
            R::PmiFenceDone { key, result } => self.pmi.fence_done(key, result),
            R::BenchDone(r) => self.bench_done(r),
            R::Terminated => {
                self.terminated();
                self.exit(Exit::Terminated);
            }
            R::Exit(e) => self.exit(e),
        }
    }

    fn on_deliver(&mut self, tag: u32, payload: Bytes) {
        match tag {
            tags::LAUNCH => self.local.on_map(
                &self.router,
                &mut With { pmix: &mut self.pmix, host: &mut self.host, pmi: &mut self.pmi },
                payload,
            ),
            tags::JOB_CONTROL => {
                let idle = self
                    .local
                    .on_control(&mut With { pmix: &mut self.pmix, host: &mut self.host, pmi: &mut self.pmi }, payload);
                if idle && self.jobs.as_ref().is_none_or(|j| j.is_empty()) {
                    // Idle: what the job's messages, processes and streams used goes back to
                    // the system, so a DVM serving thousands of jobs stays at its idle size.
                    self.host.trim_heap();
                }
            }
            tags::TERMINATE => {
                // Every local process ends with the DVM, at once, and so does the PMIx worker
                // (no job will use it), while the TERMINATE's acknowledgements roll up.
                self.effects.push_back(Effect::Proc(ProcCmd::KillAll));
                self.pmix.end_now();
            }
            dtags::PMIX_EVENT => self.pmix.deliver_event(&mut self.host, payload),
            dtags::TREE_QUERY => self.tree_view(payload),
            dtags::STAGE => self.stage_in.on_msg(self.router.me(), payload),
            // The router's own (WIREUP, DAEMON_DIED, the link model, benchmarks) never come here.
            other => self.host.deliver(other, payload),
        }
    }

    fn on_cmd(&mut self, origin: Rank, body: daemon_cmd::Body) {
        let body = match body {
            daemon_cmd::Body::TreeView(v) => return self.on_tree_view(v),
            daemon_cmd::Body::IofAck(ack) => {
                let cmd = ProcCmd::AckOutput { jobid: ack.jobid, bytes: ack.bytes };
                return self.effects.push_back(Effect::Proc(cmd));
            }
            daemon_cmd::Body::Stdin(chunk) => return self.local.on_stdin(chunk),
            daemon_cmd::Body::StageReport(rep) => return self.on_stage_report(origin, rep),
            daemon_cmd::Body::StackReq(q) => {
                return self.effects.push_back(Effect::Proc(ProcCmd::DumpStacks { id: q.id, jobid: q.jobid }));
            }
            daemon_cmd::Body::DataResp(resp) if resp.id & crate::pmi::ID_BIT != 0 => {
                return self.pmi.on_data_resp(resp);
            }
            daemon_cmd::Body::SpawnResp(resp) if resp.id & crate::pmi::ID_BIT != 0 => {
                return self.pmi.on_spawn_resp(resp);
            }
            b @ (daemon_cmd::Body::DmodexReq(_)
            | daemon_cmd::Body::DmodexResp(_)
            | daemon_cmd::Body::SpawnResp(_)
            | daemon_cmd::Body::DataResp(_)) => return self.pmix.on_cmd(&mut self.host, origin, b),
            other => other,
        };
        match self.jobs.as_mut() {
            Some(jobs) => {
                if let Some(rest) = jobs.on_cmd(&self.router, origin, body) {
                    crate::jobs::hnp::unexpected(origin, &rest);
                }
            }
            None => crate::jobs::hnp::unexpected(origin, &body),
        }
    }

    fn on_timer(&mut self, t: Timer) {
        match t {
            Timer::Startup => self.startup_timeout(),
            Timer::JobTimeout(jobid) => self.with_jobs(|j, r| j.on_timeout(r, jobid)),
            Timer::AbortGrace { jobid, rank } => self.with_jobs(|j, r| j.on_abort_grace(r, jobid, rank)),
            Timer::TerminateGrace => self.terminate_now(),
            Timer::TerminateDeadline => self.terminate_deadline(),
            Timer::Lookup(token) => self.with_jobs(|j, _| j.on_lookup_timeout(token)),
            Timer::Disconnect(r) => self.transmits.push_back(Transmit::Disconnect(r)),
            Timer::Stacks(id) => self.with_jobs(|j, r| j.on_stacks_timeout(r, id)),
        }
    }

    /// HNP: stop the daemons now (jobs ended, or their grace passed). The router's TERMINATE
    /// is started once however often this is called.
    fn terminate_now(&mut self) {
        self.timers.cancel(Timer::TerminateGrace);
        // Jobs that did not end within the grace still tell their prun why.
        if let Some(jobs) = self.jobs.as_mut() {
            jobs.end_remaining_jobs();
        }
        if !self.timers.is_armed(Timer::TerminateDeadline) {
            let after = self.ctl.as_ref().map_or(0, |c| c.terminate_deadline_ns);
            self.timers.set(Timer::TerminateDeadline, self.now.saturating_add(after));
        }
        self.inbox.push_back(Input::Terminate);
    }

    /// HNP: arm the termination grace (jobs are being ended first).
    fn arm_terminate_grace(&mut self) {
        self.timers.set(Timer::TerminateGrace, self.now.saturating_add(TERMINATE_GRACE_NS));
    }
}

#[cfg(test)]
mod bind_tests;
#[cfg(test)]
mod share_tests;
#[cfg(test)]
mod tests;
