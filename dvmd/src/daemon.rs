//! The daemon's shell: one tokio task per daemon moves bytes, timers, processes and PMIx
//! calls for the sans-IO core (`dvm_core::Core`), where every protocol decision is made.
//!
//! Where to look: an input enters in [`Daemon::run`] (one `select!`), becomes a
//! `dvm_core::Input` through `Daemon::submit`, and is stepped and its effects carried out in
//! `Daemon::drive` — the one place effects are drained, in order. Jobs (`jobs`), processes
//! (`odls`) and PMIx hosting (`pmix`) talk to the core only by submitting inputs.
//! Never block here: PMIx upcalls and process events arrive as messages on channels.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;
use dvm_core::{dtags, Core, CoreConfig, Effect, Input as CoreInput};
use dvm_grpcomm::{tags, Config, Topology};
use dvm_proto::control::{DaemonStatus, StatusReply, TerminateReply, TreeViewsReply};
use dvm_proto::daemon::{daemon_cmd, TreeView};
use dvm_proto::rml::Contact;
use dvm_rml::{Frame, Rank, Transport, TransportEvent};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

use crate::control::ControlCmd;

/// Why the actor loop ended (the core's reasons, and the shell's boot failures).
pub use dvm_core::Exit;

/// Inputs of the actor besides transport events.
#[derive(Debug)]
pub enum Input {
    /// A process started by the HNP to run daemons ended (which, how).
    ChildExited(crate::launch::Started, String),
    /// The boot deadline passed.
    StartupTimeout,
    /// HNP: a job's --timeout expired.
    JobTimeout(u32),
    /// HNP: the prun of a job went away.
    JobClientGone(u32),
    /// HNP: prun took `bytes` of a daemon's output (its credit can be returned).
    IofDelivered { jobid: u32, daemon: Rank, bytes: u64 },
    /// HNP: the grace for jobs ended by a termination passed; terminate now.
    TerminateNow,
    /// HNP: a waiting lookup's timeout (its data server token) fired.
    LookupTimeout(u64),
    /// HNP: the grace a rank that called PMIx_Abort has to exit by itself passed.
    AbortGrace { jobid: u32, rank: u32 },
    /// HNP: a job's prun (or that of a refused launch) has been sent its last event and has
    /// hung up, or was gone.
    JobStreamClosed,
}

type TreeViewsTx = oneshot::Sender<Result<TreeViewsReply, String>>;

/// Grace the HNP gives running jobs to end when the DVM is terminated, before it stops the
/// daemons regardless.
const TERMINATE_GRACE: Duration = Duration::from_millis(crate::jobs::KILL_GRACE.as_millis() as u64 + 2_000);

/// HNP-only state of the shell (replies owed to control calls, boot bookkeeping).
pub struct Hnp {
    pub ready: Option<oneshot::Sender<()>>,
    pub launched_hosts: BTreeMap<Rank, (String, crate::launch::OutputTail)>,
    /// The one process that started every other daemon (an `srun` step), named for messages.
    pub launch_step: Option<(String, crate::launch::OutputTail)>,
    pub started: Instant,
    pub session_dir: String,
    own: Contact,
    terminate: Vec<oneshot::Sender<TerminateReply>>,
    /// Termination asked for while jobs ran: they are being ended first.
    terminate_pending: bool,
    tree_query: Option<(u64, Vec<TreeView>, TreeViewsTx)>,
    bench: Option<oneshot::Sender<Result<dvm_proto::control::BenchReply, String>>>,
    next_query: u64,
    /// The DVM exists for one job (`dvmd --one-job`, a one-shot prun's): once a job has
    /// ended, or a launch was refused, it terminates itself.
    pub one_job: bool,
}

impl Hnp {
    pub fn new(own: Contact, session_dir: String) -> Hnp {
        Hnp {
            ready: None,
            launched_hosts: BTreeMap::new(),
            launch_step: None,
            started: Instant::now(),
            session_dir,
            own,
            terminate: Vec::new(),
            terminate_pending: false,
            tree_query: None,
            bench: None,
            next_query: 1,
            one_job: false,
        }
    }
}

/// A fresh boot incarnation: different on every start of a daemon, never zero.
pub fn new_epoch() -> u64 {
    rand::random::<u64>() | 1
}

pub struct Daemon {
    pub me: Rank,
    pub host: String,
    core: Core,
    t: Transport,
    start: Instant,
    inbox: VecDeque<CoreInput>,
    pub hnp: Option<Hnp>,
    exit: Option<Exit>,
    pub(crate) jobs: crate::jobs::Jobs,
    odls: crate::odls::Odls,
    odls_rx: Option<mpsc::UnboundedReceiver<crate::odls::OdlsEvent>>,
    input_tx: mpsc::UnboundedSender<Input>,
    input_rx: Option<mpsc::UnboundedReceiver<Input>>,
    /// PMIx hosting (its worker process, namespaces, upcalls waiting for answers); what it
    /// asks of the core is drained in [`Daemon::drive`].
    pub(crate) pmix: crate::pmix::PmixHost,
    pmix_rx: Option<mpsc::UnboundedReceiver<(u64, crate::pmix::HostEvent)>>,
    session_dir: Option<String>,
}

impl Daemon {
    /// HNP: measure the link to a child once the DVM is ready, for the broadcast choice.
    pub fn measure_link(&mut self) {
        self.core.measure_link();
    }

    pub fn new(me: Rank, host: String, topo: Topology, t: Transport, epoch: u64, hnp: Option<Hnp>) -> Daemon {
        Daemon::with_grpcomm(me, host, topo, t, epoch, hnp, Config::default())
    }

    /// Like [`Daemon::new`] with this collective configuration (every daemon of a DVM must
    /// hold the same, e.g. `--fence-movement`).
    pub fn with_grpcomm(
        me: Rank,
        host: String,
        topo: Topology,
        t: Transport,
        epoch: u64,
        hnp: Option<Hnp>,
        grpcomm: Config,
    ) -> Daemon {
        let (odls_tx, odls_rx) = mpsc::unbounded_channel();
        let (input_tx, input_rx) = mpsc::unbounded_channel();
        let (pmix_tx, pmix_rx) = mpsc::unbounded_channel();
        let cfg = CoreConfig { me, host: host.clone(), epoch, radix: topo.radix(), size: topo.size(), grpcomm };
        let core = Core::new(cfg, hnp.as_ref().map(|h| h.own.clone()))
            .expect("the topology was built from the same radix and size");
        Daemon {
            me,
            host: host.clone(),
            core,
            t,
            start: Instant::now(),
            inbox: VecDeque::new(),
            hnp,
            exit: None,
            jobs: Default::default(),
            odls: crate::odls::Odls::new(host.clone(), odls_tx, crate::jobs::IOF_WINDOW as usize),
            odls_rx: Some(odls_rx),
            input_tx,
            input_rx: Some(input_rx),
            pmix: crate::pmix::PmixHost::new(me, host, pmix_tx),
            pmix_rx: Some(pmix_rx),
            session_dir: None,
        }
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    pub fn topology(&self) -> &Topology {
        self.core.topology()
    }

    /// Queue an input for the core; [`Daemon::drive`] steps it.
    pub(crate) fn submit(&mut self, input: CoreInput) {
        self.inbox.push_back(input);
    }

    /// Step every queued input and carry out every effect, in order, until both are empty.
    /// The one place the core's effects are drained.
    fn drive(&mut self) {
        loop {
            // What PMIx hosting asked of the core (by an upcall, or by an effect just carried
            // out) is stepped in the order it was asked.
            self.inbox.extend(self.pmix.drain());
            let Some(input) = self.inbox.pop_front() else { return };
            if self.exit.is_some() {
                // The core said this daemon ends: nothing queued may act any more.
                self.inbox.clear();
                return;
            }
            let now = self.now();
            self.core.step(input, now);
            let effects: Vec<Effect> = self.core.drain().collect();
            for e in effects {
                self.on_effect(e);
            }
        }
    }

    /// Daemon side of the boot: report to the HNP.
    pub fn check_in(&mut self, own: Contact) {
        self.submit(CoreInput::CheckIn(own));
    }

    /// Run until the DVM ends for this daemon.
    pub async fn run(
        &mut self,
        mut events: mpsc::Receiver<TransportEvent>,
        mut control: mpsc::Receiver<ControlCmd>,
        mut inputs: mpsc::UnboundedReceiver<Input>,
    ) -> Exit {
        let mut own_inputs = self.input_rx.take().expect("run is called once");
        let mut odls_rx = self.odls_rx.take().expect("run is called once");
        let mut pmix_rx = self.pmix_rx.take().expect("run is called once");
        self.drive();
        let exit = loop {
            if let Some(exit) = self.exit.take() {
                break exit;
            }
            let deadline = self.core.next_deadline();
            let sleep =
                deadline.map_or(Duration::from_secs(3600), |at| Duration::from_nanos(at.saturating_sub(self.now())));
            tokio::select! {
                ev = events.recv() => match ev {
                    Some(ev) => self.on_transport(ev),
                    None => {
                        let why = format!("daemon {} on host {}: its transport closed", self.me, self.host);
                        self.exit = Some(Exit::LostHnp(why));
                    }
                },
                Some(cmd) = control.recv() => self.on_control(cmd),
                Some(inp) = inputs.recv() => self.on_input(inp),
                Some(inp) = own_inputs.recv() => self.on_input(inp),
                Some(ev) = odls_rx.recv() => self.on_odls(ev),
                Some((gen, ev)) = pmix_rx.recv() => self.pmix.on_event(gen, ev),
                _ = tokio::time::sleep(sleep), if deadline.is_some() => self.submit(CoreInput::Tick),
            }
            self.drive();
        };
        // Nothing this daemon started outlives it.
        self.odls.kill_all();
        // The PMIx worker ends with the daemon (its session directory goes next).
        self.pmix.shutdown();
        exit
    }

    fn on_input(&mut self, inp: Input) {
        match inp {
            Input::JobTimeout(j) => self.on_job_timeout(j),
            Input::JobClientGone(j) => self.on_client_gone(j),
            Input::IofDelivered { jobid, daemon, bytes } => self.on_iof_delivered(jobid, daemon, bytes),
            Input::TerminateNow => self.terminate_now(),
            // A one-job DVM ends once its prun has everything: not before, or output still
            // queued for a slow reader would be lost with the DVM.
            Input::JobStreamClosed => self.terminate_one_job_dvm(),
            Input::LookupTimeout(token) => self.on_lookup_timeout(token),
            Input::AbortGrace { jobid, rank } => self.on_abort_grace(jobid, rank),
            Input::ChildExited(started, how) => {
                use crate::launch::Started;
                let Some(hnp) = self.hnp.as_ref() else { return };
                let (what, out) = match started {
                    Started::Daemon(rank) => {
                        let (host, out) = hnp
                            .launched_hosts
                            .get(&rank)
                            .cloned()
                            .unwrap_or_else(|| (self.core.host_of(rank), Default::default()));
                        (format!("daemon {rank} on host {host}"), out)
                    }
                    Started::Step => {
                        let Some(step) = hnp.launch_step.clone() else { return };
                        step
                    }
                };
                if hnp.ready.is_some() {
                    self.exit = Some(Exit::BootFailed(format!(
                        "{what} {how} before the DVM was ready; it printed: {}",
                        out.text()
                    )));
                    return;
                }
                if self.core.is_terminating() {
                    return;
                }
                if started == Started::Step {
                    // The step that holds every other daemon is gone (scancel, the allocation
                    // ended, or a daemon failed and the step was killed): the DVM ends with it.
                    warn!("{what} {how}; it printed: {}; terminating the DVM", out.text());
                    let (tx, _rx) = oneshot::channel();
                    self.on_control(ControlCmd::Terminate(tx));
                } else {
                    warn!("{what}: its process {how}");
                }
            }
            Input::StartupTimeout => {
                let Some(hnp) = self.hnp.as_ref() else { return };
                if hnp.ready.is_none() {
                    return;
                }
                let contacts = self.core.contacts().cloned().unwrap_or_default();
                let missing: Vec<String> = (1..self.core.topology().size())
                    .filter(|r| !contacts.contains_key(r))
                    .map(|r| {
                        let (host, out) = hnp
                            .launched_hosts
                            .get(&r)
                            .cloned()
                            .unwrap_or_else(|| (self.core.host_of(r), Default::default()));
                        format!("daemon {r} on host {host} (it printed: {})", out.text())
                    })
                    .collect();
                let what = if missing.is_empty() {
                    "the WIREUP broadcast did not complete".to_string()
                } else {
                    format!("{} daemon(s) did not check in: {}", missing.len(), missing.join("; "))
                };
                self.exit = Some(Exit::BootFailed(format!("DVM start-up timed out: {what}")));
            }
        }
    }

    fn on_transport(&mut self, ev: TransportEvent) {
        match ev {
            TransportEvent::Frame { from_peer, frame } => {
                self.submit(CoreInput::Frame { from_peer, header: frame.header, payload: frame.payload })
            }
            TransportEvent::PeerLost { peer, reason } | TransportEvent::ConnectFailed { peer, reason } => {
                self.submit(CoreInput::PeerLost { peer, reason: reason.to_string() })
            }
        }
    }

    fn on_effect(&mut self, e: Effect) {
        match e {
            Effect::Transmit { next_hop, header, payload } => {
                if let Err(e) = self.t.send(next_hop, Frame::new(header, payload)) {
                    debug!(next_hop, "send failed: {e}");
                    self.submit(CoreInput::SendFailed { peer: next_hop });
                }
            }
            Effect::SetContacts(table) => self.t.set_contacts(table),
            Effect::Ready => {
                if let Some(tx) = self.hnp.as_mut().and_then(|h| h.ready.take()) {
                    let _ = tx.send(());
                }
            }
            Effect::Deliver { tag, payload } => self.on_deliver(tag, payload),
            Effect::ScatterDeliver { tag, data } => {
                if tag == tags::LAUNCH_RESIDUALS {
                    self.on_launch_residual(data);
                }
            }
            Effect::Cmd { origin, body } => match body {
                daemon_cmd::Body::TreeView(v) => self.on_tree_view(v),
                other => self.on_job_cmd(origin, other),
            },
            Effect::DaemonsFailed { newly } => {
                if self.hnp.is_some() {
                    for &r in &newly {
                        let why = self.core.loss_reason(r).unwrap_or("declared dead");
                        crate::say!("dvmd: daemon {r} on host {} was lost: {why}", self.core.host_of(r));
                    }
                    self.jobs_lost_daemons(&newly.iter().copied().collect());
                    self.maybe_finish_tree_query();
                }
            }
            Effect::FenceDone { key, result } => self.pmix.fence_done(key, result),
            Effect::BenchDone(r) => {
                if let Some(tx) = self.hnp.as_mut().and_then(|h| h.bench.take()) {
                    let _ = tx.send(r);
                }
            }
            Effect::Terminated => {
                if let Some(h) = self.hnp.as_mut() {
                    for tx in h.terminate.drain(..) {
                        let _ = tx.send(TerminateReply { ok: true, message: "every daemon received TERMINATE".into() });
                    }
                }
                self.exit = Some(Exit::Terminated);
            }
            Effect::Exit(e) => self.exit = Some(e),
        }
    }

    fn on_deliver(&mut self, tag: u32, payload: Bytes) {
        match tag {
            tags::LAUNCH => self.on_launch_map(payload),
            tags::JOB_CONTROL => self.on_job_control_xcast(payload),
            tags::TERMINATE => {
                // Every local process ends with the DVM, at once, and so does the PMIx worker
                // (no job will use it), while the TERMINATE's acknowledgements roll up.
                self.odls.kill_all();
                self.pmix.end_now();
            }
            dtags::PMIX_EVENT => self.pmix.deliver_event(payload),
            dtags::TREE_QUERY => {
                let query = u64::from_le_bytes(payload.get(..8).and_then(|b| b.try_into().ok()).unwrap_or_default());
                let topo = self.core.topology();
                let view = TreeView {
                    query,
                    rank: self.me,
                    parent: topo.parent().unwrap_or(u32::MAX),
                    children: topo.children().to_vec(),
                    // The name the node itself reports (the label is in the HNP's status).
                    host: nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default(),
                    pid: std::process::id(),
                    // The daemon and its PMIx worker: what the node pays for this daemon.
                    rss_kib: rss_kib() + self.pmix.worker_rss_kib(),
                    fences_in_flight: self.core.fences_in_flight() as u64,
                };
                self.submit(CoreInput::Cmd { dst: 0, body: daemon_cmd::Body::TreeView(view) });
            }
            _ => {}
        }
    }

    fn on_tree_view(&mut self, v: TreeView) {
        let Some(hnp) = self.hnp.as_mut() else { return };
        let Some((q, views, _)) = hnp.tree_query.as_mut() else { return };
        if v.query != *q {
            return;
        }
        views.push(v);
        self.maybe_finish_tree_query();
    }

    fn maybe_finish_tree_query(&mut self) {
        let topo = self.core.topology();
        let live: Vec<Rank> = topo.live_ranks().collect();
        let Some(hnp) = self.hnp.as_mut() else { return };
        let Some((_, views, _)) = hnp.tree_query.as_ref() else { return };
        if !live.iter().all(|r| views.iter().any(|v| v.rank == *r)) {
            return;
        }
        let (_, mut views, tx) = hnp.tree_query.take().expect("checked above");
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
            })
            .collect();
        let _ = tx.send(Ok(TreeViewsReply { views }));
    }

    fn on_control(&mut self, cmd: ControlCmd) {
        let size = self.core.topology().size();
        match cmd {
            ControlCmd::Launch(..) | ControlCmd::LaunchPlan(..) | ControlCmd::Stdin(..) | ControlCmd::Signal(..) => {
                if self.hnp.as_ref().is_some_and(|h| h.terminate_pending) {
                    if let ControlCmd::Launch(_, tx) = cmd {
                        let _ = tx.try_send(Err(tonic::Status::unavailable("the DVM is terminating")));
                    }
                    return;
                }
                self.on_job_control(cmd)
            }
            ControlCmd::Status(tx) => {
                let Some(hnp) = self.hnp.as_ref() else { return };
                let repaired = self.core.topology().repaired();
                let contacts = self.core.contacts().cloned().unwrap_or_default();
                let daemons = (0..size)
                    .map(|r| {
                        let c = contacts.get(&r).cloned().unwrap_or_default();
                        let alive = repaired.is_alive(r);
                        DaemonStatus {
                            rank: r,
                            host: c.host,
                            addr: c.addr,
                            pid: c.pid,
                            parent: if alive { repaired.parent_of(r).unwrap_or(u32::MAX) } else { u32::MAX },
                            children: if alive { repaired.children_of(r) } else { Vec::new() },
                            slots: c.slots,
                            alive,
                        }
                    })
                    .collect();
                let _ = tx.send(StatusReply {
                    num_daemons: size,
                    radix: self.core.topology().radix(),
                    uptime_ms: hnp.started.elapsed().as_millis() as u64,
                    daemons,
                    session_dir: hnp.session_dir.clone(),
                });
            }
            ControlCmd::Terminate(tx) => {
                let Some(hnp) = self.hnp.as_mut() else { return };
                if hnp.ready.is_some() {
                    // Not ready yet: no broadcast can reach every daemon; abandon the boot
                    // (the caller kills every daemon it started and removes the session).
                    let _ = tx.send(TerminateReply { ok: true, message: "start-up abandoned".into() });
                    self.exit =
                        Some(Exit::BootFailed("start-up interrupted: terminated before the DVM was ready".into()));
                    return;
                }
                hnp.terminate.push(tx);
                if hnp.terminate_pending {
                    return;
                }
                hnp.terminate_pending = true;
                // Running jobs end first, each with a named reason and its own status, so
                // every prun hears why; then the daemons stop.
                if self.end_jobs_for_termination() {
                    let itx = self.input_tx.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(TERMINATE_GRACE).await;
                        let _ = itx.send(Input::TerminateNow);
                    });
                } else {
                    self.terminate_now();
                }
            }
            ControlCmd::TreeViews(tx) => {
                let Some(hnp) = self.hnp.as_mut() else { return };
                if hnp.tree_query.is_some() {
                    let _ = tx.send(Err("a tree query is already running".into()));
                    return;
                }
                let q = hnp.next_query;
                hnp.next_query += 1;
                hnp.tree_query = Some((q, Vec::new(), tx));
                self.submit(CoreInput::Xcast {
                    tag: dtags::TREE_QUERY,
                    payload: Bytes::copy_from_slice(&q.to_le_bytes()),
                });
            }
            ControlCmd::Bench(req, tx) => {
                let Some(hnp) = self.hnp.as_mut() else { return };
                if hnp.bench.is_some() {
                    let _ = tx.send(Err("a benchmark is already running".into()));
                    return;
                }
                let fence_movement = match req.fence_movement.as_str() {
                    "" => None,
                    m => match m.parse() {
                        Ok(m) => Some(m),
                        Err(e) => return drop(tx.send(Err(format!("benchmark: {e}")))),
                    },
                };
                let bcast_movement = match req.bcast_movement.as_str() {
                    "" => None,
                    m => match m.parse() {
                        Ok(m) => Some(m),
                        Err(e) => return drop(tx.send(Err(format!("benchmark: {e}")))),
                    },
                };
                hnp.bench = Some(tx);
                let (kind, count, bytes) = (req.kind(), req.count, req.bytes);
                self.submit(CoreInput::Bench { kind, count, bytes, fence_movement, bcast_movement });
            }
        }
    }

    /// HNP: stop the daemons now (jobs ended, or their grace passed).
    /// The core's TERMINATE is started once however often this is called.
    pub(crate) fn terminate_now(&mut self) {
        // Jobs that did not end within the grace still tell their prun why.
        self.end_remaining_jobs();
        self.submit(CoreInput::Terminate);
    }

    /// HNP: the last job ended while a termination waited for it.
    pub(crate) fn jobs_all_ended(&mut self) {
        if self.hnp.as_ref().is_some_and(|h| h.terminate_pending) {
            self.terminate_now();
        }
    }

    /// HNP of a `--one-job` DVM: its job has ended and its prun has received everything and
    /// hung up ([`Input::JobStreamClosed`]), so the DVM terminates, as if its prun had asked.
    pub(crate) fn terminate_one_job_dvm(&mut self) {
        if self.hnp.as_ref().is_some_and(|h| h.one_job) && !self.core.is_terminating() {
            debug!("the DVM's one job has ended; terminating");
            let (tx, _rx) = oneshot::channel();
            self.on_control(ControlCmd::Terminate(tx));
        }
    }

    pub(crate) fn input_tx(&self) -> mpsc::UnboundedSender<Input> {
        self.input_tx.clone()
    }
    pub(crate) fn core(&self) -> &Core {
        &self.core
    }
    pub(crate) fn odls(&self) -> &crate::odls::Odls {
        &self.odls
    }
    pub(crate) fn odls_mut(&mut self) -> &mut crate::odls::Odls {
        &mut self.odls
    }
    pub(crate) fn send_job_cmd(&mut self, dst: Rank, body: daemon_cmd::Body) {
        self.submit(CoreInput::Cmd { dst, body });
    }
    /// Host name of a daemon (from WIREUP, or the HNP's check-in table).
    pub(crate) fn host_of(&self, rank: Rank) -> String {
        self.core.host_of(rank)
    }
    /// Where this daemon's PMIx workers keep their files, and when one is replaced. The first
    /// worker starts when the first job reaches this daemon (an idle daemon stays small and
    /// boots fast), or at once with [`Daemon::start_pmix_background`].
    pub fn set_pmix_settings(&mut self, settings: crate::pmix::PmixSettings) {
        self.pmix.configure(settings);
    }
    /// Start the PMIx worker now, in the background (a one-shot DVM knows a job is coming).
    pub fn start_pmix_background(&mut self) {
        self.pmix.start_background();
    }
    /// This daemon's session directory (per-daemon scratch for its ranks).
    pub fn set_session_dir(&mut self, dir: &std::path::Path) {
        self.session_dir = Some(dir.display().to_string());
    }
    pub(crate) fn session_dir(&self) -> Option<String> {
        self.session_dir.clone()
    }
    /// This DVM's identity (the HNP's host and pid), the same on every daemon after WIREUP.
    pub(crate) fn dvm_id(&self) -> String {
        let pid = self.core.hnp_pid().unwrap_or(0);
        format!("{}-{pid}", self.host_of(0))
    }
    /// Whether this daemon listens on a loopback address (a DVM on one host).
    pub(crate) fn on_loopback(&self) -> bool {
        self.t.local_addr().ip().is_loopback()
    }

    /// A one-daemon DVM: nothing to wait for.
    pub fn wire_single(&mut self) {
        self.submit(CoreInput::WireSingle);
    }

    pub fn into_transport(self) -> Transport {
        self.t
    }
}

/// Give the heap's free pages back to the system (glibc's `malloc_trim`). Freed memory
/// otherwise stays resident in the allocator's arenas, scattered between live allocations, and
/// a long-lived daemon's RSS creeps up with every job although nothing is kept (docs/soak.md).
pub fn trim_heap() {
    // SAFETY: malloc_trim only returns free memory to the system; it is safe at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Resident set size of this process in KiB (Linux).
pub fn rss_kib() -> u64 {
    rss_kib_of("/proc/self/status").unwrap_or(0)
}

/// `VmRSS` in KiB from a `/proc/<pid>/status` file; None when the process is gone.
pub fn rss_kib_of(status_file: &str) -> Option<u64> {
    std::fs::read_to_string(status_file).ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
    })
}
