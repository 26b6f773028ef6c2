//! The daemon's shell: one tokio task per daemon moves bytes, timers, processes, prun streams
//! and PMIx worker events for the sans-IO [`dvm_core::Node`], where every decision is made.
//!
//! Where to look: an input enters in [`Daemon::run`] (one `select!`) and is handed to the
//! node's matching `handle_*`; then `Daemon::drain` — the one place effects leave — puts
//! the node's transmits on the transport and carries out its effects (odls, prun streams,
//! control replies), in order. The shell keeps only sockets, processes, the PMIx worker and
//! a token -> handle map (control replies, prun streams).
//! Never block here: PMIx upcalls and process events arrive as messages on channels.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use dvm_core::jobs::local::LocalConfig;
use dvm_core::jobs::{ClientId, Forward, ProcCmd};
use dvm_core::node::{
    Control, Effect, HnpConfig, LauncherExit, LinkEvent, NodeConfig, PrunEvent, Reply, Start, Transmit,
};
use dvm_core::pmix::PmixEffect;
use dvm_core::{CoreConfig, Node};
use dvm_grpcomm::{Config, Topology};
use dvm_proto::control::{AttachRequest, StackTracesRequest};
use dvm_proto::rml::Contact;
use dvm_rml::{Frame, Rank, Transport, TransportEvent};
use tokio::sync::{mpsc, oneshot};
use tracing::debug;

use crate::control::ControlCmd;
use crate::host::ShellHost;
use crate::pmix::HostEvent;

/// Why the actor loop ended (the core's reasons, and the shell's boot failures).
pub use dvm_core::Exit;

/// Inputs of the actor besides transport events, control calls and process events.
#[derive(Debug)]
pub enum Input {
    /// A process started by the HNP to run daemons ended (which, how).
    ChildExited(crate::launch::Started, String),
}

/// HNP-only state of the shell: the boot's processes and the ready signal.
pub struct Hnp {
    /// Fired once the DVM is ready.
    pub ready: Option<oneshot::Sender<()>>,
    pub launched_hosts: BTreeMap<Rank, (String, crate::launch::OutputTail)>,
    /// The one process that started every other daemon (an `srun` step), named for messages.
    pub launch_step: Option<(String, crate::launch::OutputTail)>,
    pub session_dir: String,
    own: Contact,
    /// The DVM exists for one job (`dvmd --one-job`, a one-shot prun's): once a job has
    /// ended, or a launch was refused, it terminates itself.
    pub one_job: bool,
    /// The boot must be done within this.
    pub startup_timeout: Option<Duration>,
    /// How long TERMINATE may take to reach every daemon before the HNP ends regardless.
    pub terminate_deadline: Duration,
}

impl Hnp {
    pub fn new(own: Contact, session_dir: String) -> Hnp {
        Hnp {
            ready: None,
            launched_hosts: BTreeMap::new(),
            launch_step: None,
            session_dir,
            own,
            one_job: false,
            startup_timeout: None,
            terminate_deadline: Duration::from_secs(10),
        }
    }
}

/// A fresh boot incarnation: different on every start of a daemon, never zero.
pub fn new_epoch() -> u64 {
    rand::random::<u64>() | 1
}

/// A reply handle waiting for its token.
enum ReplyTx {
    Status(oneshot::Sender<dvm_proto::control::StatusReply>),
    Terminate(oneshot::Sender<dvm_proto::control::TerminateReply>),
    TreeViews(oneshot::Sender<Result<dvm_proto::control::TreeViewsReply, String>>),
    Bench(oneshot::Sender<Result<dvm_proto::control::BenchReply, String>>),
    LaunchPlan(oneshot::Sender<Result<dvm_proto::control::LaunchPlanReply, String>>),
    Signal(oneshot::Sender<dvm_proto::control::SignalReply>),
    Jobs(oneshot::Sender<dvm_proto::control::JobsReply>),
    Cancel(oneshot::Sender<dvm_proto::control::CancelReply>),
    StackTraces(oneshot::Sender<Result<dvm_proto::control::StackTracesReply, String>>),
    Stage(oneshot::Sender<dvm_proto::control::StageReply>),
}

/// What the node is built from at [`Daemon::run`] (settings arrive after construction).
struct Pending {
    cfg: NodeConfig,
    host: ShellHost,
    start: Start,
    /// This daemon hosts a PMIx server: when the node replaces its idle worker.
    pmix_recycle_kib: Option<u64>,
}

pub struct Daemon {
    pub me: Rank,
    pub host: String,
    pending: Option<Pending>,
    node: Option<Node<ShellHost>>,
    topo: Topology,
    t: Transport,
    start: Instant,
    ready: Option<oneshot::Sender<()>>,
    odls: crate::odls::Odls,
    odls_rx: Option<mpsc::UnboundedReceiver<crate::odls::OdlsEvent>>,
    pmix_rx: Option<mpsc::UnboundedReceiver<(u64, crate::pmix::HostEvent)>>,
    prun_tx: mpsc::UnboundedSender<PrunEvent>,
    prun_rx: Option<mpsc::UnboundedReceiver<PrunEvent>>,
    /// prun streams by client id (each fed by its forwarder task).
    clients: HashMap<u64, mpsc::UnboundedSender<Forward>>,
    replies: HashMap<u64, ReplyTx>,
    next_token: u64,
    exit: Option<Exit>,
    /// Staging's disk (made at run, when the session directory is known).
    disk: Option<crate::stage::StageDisk>,
}

/// What woke the loop.
enum Woke {
    Transport(Option<TransportEvent>),
    Control(ControlCmd),
    Input(Input),
    Proc(crate::odls::OdlsEvent),
    Pmix(u64, HostEvent),
    Prun(PrunEvent),
    Timer,
}

impl Daemon {
    /// Warn when the loop runs late by a quarter of the heartbeat bound (heartbeat × misses).
    pub fn set_heartbeat_bound(&mut self, bound: Duration) {
        self.pending().host.meter.set_bound(bound);
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
        let (pmix_tx, pmix_rx) = mpsc::unbounded_channel();
        let (prun_tx, prun_rx) = mpsc::unbounded_channel();
        let core = CoreConfig { me, host: host.clone(), epoch, radix: topo.radix(), size: topo.size(), grpcomm };
        let loopback = t.local_addr().ip().is_loopback();
        let local = LocalConfig {
            base_env: base_env(),
            session_dir: None,
            loopback,
            cores: crate::pmix::node_cores(),
            topo: None,
            mpi: dvm_proto::job::MpiInterface::MpiDefault,
            pmix_library: crate::pmix::client_library(),
        };
        let mut shell_host = ShellHost::new(crate::pmix::PmixHost::new(me, host.clone(), pmix_tx));
        let mut ready = None;
        let hnp_cfg = hnp.map(|h| {
            ready = h.ready;
            shell_host.launched = h.launched_hosts;
            shell_host.launch_step = h.launch_step;
            HnpConfig {
                own: h.own,
                session_dir: h.session_dir,
                one_job: h.one_job,
                startup_timeout_ns: h.startup_timeout.map(|d| d.as_nanos().min(u64::MAX as u128) as u64),
                measure_link: false,
                terminate_deadline_ns: h.terminate_deadline.as_nanos().min(u64::MAX as u128) as u64,
            }
        });
        let hostname = nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default();
        let cfg = NodeConfig { core, hnp: hnp_cfg, local, hostname, pid: std::process::id() };
        Daemon {
            me,
            host: host.clone(),
            pending: Some(Pending { cfg, host: shell_host, start: Start::AwaitCheckIns, pmix_recycle_kib: None }),
            node: None,
            topo,
            t,
            start: Instant::now(),
            ready,
            odls: crate::odls::Odls::new(host, odls_tx, dvm_core::jobs::IOF_WINDOW as usize),
            odls_rx: Some(odls_rx),
            pmix_rx: Some(pmix_rx),
            prun_tx,
            prun_rx: Some(prun_rx),
            clients: HashMap::new(),
            replies: HashMap::new(),
            next_token: 1,
            exit: None,
            disk: None,
        }
    }

    fn pending(&mut self) -> &mut Pending {
        self.pending.as_mut().expect("settings are made before run")
    }

    /// HNP: measure the link to a child once the DVM is ready, for the movement choice.
    pub fn measure_link(&mut self) {
        if let Some(h) = self.pending().cfg.hnp.as_mut() {
            h.measure_link = true;
        }
    }

    pub fn topology(&self) -> &Topology {
        self.node.as_ref().map_or(&self.topo, |n| n.router().topology())
    }

    /// Daemon side of the boot: report to the HNP.
    pub fn check_in(&mut self, own: Contact) {
        self.pending().start = Start::CheckIn(own);
    }

    /// A one-daemon DVM: nothing to wait for.
    pub fn wire_single(&mut self) {
        self.pending().start = Start::WireSingle;
    }

    /// Where this daemon's PMIx workers keep their files, and when one is replaced. The first
    /// worker starts when the first job reaches this daemon (an idle daemon stays small and
    /// boots fast), or at once with [`Daemon::start_pmix_background`].
    pub fn set_pmix_settings(&mut self, settings: crate::pmix::PmixSettings) {
        self.pending().pmix_recycle_kib = Some(settings.recycle_kib);
        self.pending().host.pmix.configure(settings);
    }
    /// Start the PMIx worker now, in the background (a one-shot DVM knows a job is coming).
    pub fn start_pmix_background(&mut self) {
        self.pending().host.pmix.start_background();
    }
    /// This node's hardware, for binding its procs ([`crate::hwtopo::discover`]).
    pub fn set_hardware(&mut self, topo: Option<dvm_core::jobmap::NodeTopo>) {
        self.pending().cfg.local.topo = topo.map(std::sync::Arc::new);
    }

    /// The interface a job gets when it asks for none (`dvmd --mpi`).
    pub fn set_mpi(&mut self, mpi: dvm_proto::job::MpiInterface) {
        self.pending().cfg.local.mpi = mpi;
    }

    /// How procs run against this daemon (see [`crate::odls::Odls::set_rank_priority`]).
    pub fn set_rank_priority(&mut self, p: crate::odls::RankPriority, dvm: &str) {
        self.odls.set_rank_priority(p, dvm);
    }

    /// This daemon's session directory (per-daemon scratch for its ranks).
    pub fn set_session_dir(&mut self, dir: &std::path::Path) {
        self.pending().cfg.local.session_dir = Some(dir.display().to_string());
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// Run until the DVM ends for this daemon.
    pub async fn run(
        &mut self,
        mut events: mpsc::Receiver<TransportEvent>,
        mut control: mpsc::Receiver<ControlCmd>,
        mut inputs: mpsc::UnboundedReceiver<Input>,
    ) -> Exit {
        let Pending { cfg, host, start, pmix_recycle_kib } = self.pending.take().expect("run is called once");
        let session = cfg.local.session_dir.clone().map(Into::into);
        self.disk =
            Some(crate::stage::StageDisk::new(crate::stage::Place { rank: self.me, host: self.host.clone(), session }));
        let mut node = Node::new(cfg, host).expect("the topology was built from the same radix and size");
        if let Some(kib) = pmix_recycle_kib {
            node.configure_pmix(kib);
        }
        let node = self.node.insert(node);
        let mut odls_rx = self.odls_rx.take().expect("run is called once");
        let mut pmix_rx = self.pmix_rx.take().expect("run is called once");
        let mut prun_rx = self.prun_rx.take().expect("run is called once");
        let now = self.start.elapsed().as_nanos() as u64;
        node.handle_start(now, start);
        self.drain();
        let exit = loop {
            if let Some(exit) = self.exit.take() {
                break exit;
            }
            // The node's next timer, or the meter's probe: lateness is sampled even when
            // nothing is due.
            let deadline = self.node().poll_timeout();
            let probe = self.now().saturating_add(crate::loopmeter::PROBE.as_nanos() as u64);
            let due = deadline.map_or(probe, |at| at.min(probe));
            let sleep = Duration::from_nanos(due.saturating_sub(self.now()));
            let woke = tokio::select! {
                ev = events.recv() => Woke::Transport(ev),
                Some(cmd) = control.recv() => Woke::Control(cmd),
                Some(inp) = inputs.recv() => Woke::Input(inp),
                Some(ev) = odls_rx.recv() => Woke::Proc(ev),
                Some((gen, ev)) = pmix_rx.recv() => Woke::Pmix(gen, ev),
                Some(ev) = prun_rx.recv() => Woke::Prun(ev),
                _ = tokio::time::sleep(sleep) => Woke::Timer,
            };
            // One step: the input handled and everything it caused carried out.
            let began = Instant::now();
            let now = self.now();
            match woke {
                Woke::Transport(Some(ev)) => self.on_transport(ev),
                Woke::Transport(None) => {
                    let why = format!("daemon {} on host {}: its transport closed", self.me, self.host);
                    self.exit = Some(Exit::LostHnp(why));
                }
                Woke::Control(cmd) => self.on_control(cmd),
                Woke::Input(inp) => self.on_input(inp),
                Woke::Proc(ev) => self.node_mut().handle_proc(now, ev),
                Woke::Pmix(gen, ev) => self.on_pmix(now, gen, ev),
                Woke::Prun(ev) => {
                    if let PrunEvent::Closed(c) = &ev {
                        self.clients.remove(&c.0);
                    }
                    self.node_mut().handle_prun(now, ev);
                }
                Woke::Timer => {
                    let due_at = self.start + Duration::from_nanos(due);
                    self.node_mut().host_mut().meter.timer_fired(due_at, began);
                    if deadline.is_some_and(|at| at <= now) {
                        self.node_mut().handle_timeout(now);
                    }
                }
            }
            self.drain();
            self.node_mut().host_mut().meter.step(began.elapsed(), began);
        };
        // Nothing this daemon started outlives it.
        self.odls.kill_all();
        // The PMIx worker ends with the daemon (its session directory goes next).
        self.node_mut().host_mut().pmix.shutdown();
        exit
    }

    fn node(&self) -> &Node<ShellHost> {
        self.node.as_ref().expect("running")
    }

    fn node_mut(&mut self) -> &mut Node<ShellHost> {
        self.node.as_mut().expect("running")
    }

    /// Carry out everything the node decided, in order: the one drain.
    fn drain(&mut self) {
        loop {
            let mut failed = Vec::new();
            while let Some(t) = self.node_mut().poll_transmit() {
                match t {
                    Transmit::Frame { next_hop, header, payload } => {
                        if let Err(e) = self.t.send(next_hop, Frame::new(header, payload)) {
                            debug!(next_hop, "send failed: {e}");
                            failed.push(next_hop);
                        }
                    }
                    Transmit::Contacts(table) => self.t.set_contacts(table),
                    Transmit::Disconnect(peer) => self.t.disconnect(peer),
                }
            }
            while let Some(e) = self.node_mut().poll() {
                self.on_effect(e);
            }
            if failed.is_empty() && !self.node().has_output() {
                return;
            }
            let now = self.now();
            for peer in failed {
                self.node_mut().handle_link(now, LinkEvent::SendFailed { peer });
            }
        }
    }

    fn on_effect(&mut self, e: Effect) {
        match e {
            Effect::Proc(cmd) => match cmd {
                ProcCmd::Spawn(spec) => self.odls.spawn(spec),
                ProcCmd::KillJob { jobid, grace_ms } => {
                    self.odls.kill_job(jobid, Duration::from_millis(grace_ms.into()))
                }
                ProcCmd::SignalJob { jobid, signal } => self.odls.signal_job(jobid, signal),
                ProcCmd::WriteStdin { jobid, rank, data } => self.odls.write_stdin(jobid, rank, data),
                ProcCmd::CloseStdin { jobid, rank } => self.odls.close_stdin(jobid, rank),
                ProcCmd::AckOutput { jobid, bytes } => self.odls.ack_output(jobid, bytes as usize),
                ProcCmd::ForgetJob(jobid) => self.odls.forget_job(jobid),
                ProcCmd::DumpStacks { id, jobid } => self.odls.dump_stacks(id, jobid),
                ProcCmd::KillAll => self.odls.kill_all(),
                ProcCmd::PmiWrite { jobid, rank, data } => self.odls.pmi_write(jobid, rank, data),
                ProcCmd::PmiClose { jobid, rank } => self.odls.pmi_close(jobid, rank),
            },
            Effect::ToClient { client, item } => match item {
                Forward::Close => drop(self.clients.remove(&client.0)),
                Forward::Refused(why) => {
                    if let Some(tx) = self.clients.remove(&client.0) {
                        let _ = tx.send(Forward::Refused(why));
                    }
                }
                item => {
                    if let Some(tx) = self.clients.get(&client.0) {
                        let _ = tx.send(item);
                    }
                }
            },
            Effect::Reply { token, reply } => self.reply(token, reply),
            Effect::Ready => {
                if let Some(tx) = self.ready.take() {
                    let _ = tx.send(());
                }
            }
            Effect::Say(text) => crate::say!("{text}"),
            // Disk work is answered at once (a segment is a few MiB into the page cache).
            Effect::Stage(io) => {
                if let Some(done) = self.disk.as_mut().and_then(|d| d.apply(io)) {
                    let now = self.now();
                    self.node_mut().handle_stage(now, done);
                }
            }
            // The live daemon starts no fence of its own (`FenceOwner::Driver` is the simulator's).
            Effect::FenceDone { key, .. } => debug!(key, "a driver's fence ended"),
            Effect::Pmix(p) => {
                let worker = &mut self.node_mut().host_mut().pmix;
                match p {
                    PmixEffect::Reply { reply, status, data } => worker.complete(reply, status, data),
                    PmixEffect::Replace => worker.replace(),
                    PmixEffect::End => worker.end_now(),
                }
            }
            Effect::Exit(e) => self.exit = Some(e),
        }
    }

    /// An event of PMIx worker `gen`: one of a worker already replaced is dropped (its replies
    /// could not reach a client any more).
    fn on_pmix(&mut self, now: u64, gen: u64, ev: HostEvent) {
        let node = self.node_mut();
        if node.host().pmix.current_gen() != Some(gen) {
            return debug!(gen, "event from a former PMIx worker dropped");
        }
        match ev {
            HostEvent::Upcall(ev) => node.handle_pmix(now, ev),
            HostEvent::Ended { how } => {
                let pid = node.host_mut().pmix.lost();
                node.handle_pmix_lost(now, pid, &how);
            }
        }
    }

    fn reply(&mut self, token: u64, reply: Reply) {
        let Some(tx) = self.replies.remove(&token) else { return };
        match (tx, reply) {
            (ReplyTx::Status(tx), Reply::Status(r)) => drop(tx.send(r)),
            (ReplyTx::Terminate(tx), Reply::Terminate(r)) => drop(tx.send(r)),
            (ReplyTx::TreeViews(tx), Reply::TreeViews(r)) => drop(tx.send(r)),
            (ReplyTx::Bench(tx), Reply::Bench(r)) => drop(tx.send(r)),
            (ReplyTx::LaunchPlan(tx), Reply::LaunchPlan(r)) => drop(tx.send(r)),
            (ReplyTx::Signal(tx), Reply::Signal(r)) => drop(tx.send(r)),
            (ReplyTx::Jobs(tx), Reply::Jobs(r)) => drop(tx.send(r)),
            (ReplyTx::Cancel(tx), Reply::Cancel(r)) => drop(tx.send(r)),
            (ReplyTx::StackTraces(tx), Reply::StackTraces(r)) => drop(tx.send(r)),
            (ReplyTx::Stage(tx), Reply::Stage(r)) => drop(tx.send(r)),
            (_, r) => debug!(token, "a reply of another kind for this token: {r:?}"),
        }
    }

    fn on_transport(&mut self, ev: TransportEvent) {
        let now = self.now();
        let node = self.node_mut();
        match ev {
            TransportEvent::Frame { from_peer, frame } => {
                node.handle_frame(now, from_peer, frame.header, frame.payload.into_bytes())
            }
            TransportEvent::PeerLost { peer, reason } | TransportEvent::ConnectFailed { peer, reason } => {
                node.handle_link(now, LinkEvent::Lost { peer, reason: reason.to_string() })
            }
        }
    }

    fn on_control(&mut self, cmd: ControlCmd) {
        let token = self.next_token;
        self.next_token += 1;
        let req = match cmd {
            ControlCmd::Status(tx) => {
                self.replies.insert(token, ReplyTx::Status(tx));
                Control::Status
            }
            ControlCmd::Terminate(tx) => {
                self.replies.insert(token, ReplyTx::Terminate(tx));
                Control::Terminate
            }
            ControlCmd::TreeViews(tx) => {
                self.replies.insert(token, ReplyTx::TreeViews(tx));
                Control::TreeViews
            }
            ControlCmd::Bench(req, tx) => {
                self.replies.insert(token, ReplyTx::Bench(tx));
                Control::Bench(req)
            }
            ControlCmd::LaunchPlan(spec, tx) => {
                self.replies.insert(token, ReplyTx::LaunchPlan(tx));
                Control::LaunchPlan(spec)
            }
            ControlCmd::Signal(req, tx) => {
                self.replies.insert(token, ReplyTx::Signal(tx));
                Control::Signal(req)
            }
            ControlCmd::Stdin(msg) => Control::Stdin(msg),
            ControlCmd::Launch(mut spec, tx) => {
                let (ftx, frx) = mpsc::unbounded_channel();
                tokio::spawn(crate::forwarder::forwarder(ClientId(token), frx, tx, self.prun_tx.clone()));
                // Preload sources are read here, on the HNP's node: a bad one refuses the job.
                if let Err(why) = crate::stage::fill_preload(&mut spec) {
                    return drop(ftx.send(Forward::Refused(why)));
                }
                self.clients.insert(token, ftx);
                Control::Launch(spec, ClientId(token))
            }
            ControlCmd::Stage(req, tx) => match crate::stage::plan_of(req) {
                Ok(plan) => {
                    self.replies.insert(token, ReplyTx::Stage(tx));
                    Control::Stage(plan)
                }
                Err(error) => return drop(tx.send(dvm_proto::control::StageReply { error, ..Default::default() })),
            },
            ControlCmd::Attach(AttachRequest { jobid, uid }, tx) => {
                let (ftx, frx) = mpsc::unbounded_channel();
                self.clients.insert(token, ftx);
                tokio::spawn(crate::forwarder::forwarder(ClientId(token), frx, tx, self.prun_tx.clone()));
                Control::Attach(jobid, uid, ClientId(token))
            }
            ControlCmd::Jobs(nodes, tx) => {
                self.replies.insert(token, ReplyTx::Jobs(tx));
                Control::Jobs { nodes }
            }
            ControlCmd::StackTraces(StackTracesRequest { jobid, uid }, tx) => {
                self.replies.insert(token, ReplyTx::StackTraces(tx));
                Control::StackTraces(jobid, uid)
            }
            ControlCmd::Cancel(req, tx) => {
                self.replies.insert(token, ReplyTx::Cancel(tx));
                Control::Cancel(req)
            }
        };
        let now = self.now();
        self.node_mut().handle_control(now, token, req);
    }

    fn on_input(&mut self, inp: Input) {
        let Input::ChildExited(started, how) = inp;
        use crate::launch::Started;
        let now = self.now();
        let host = &self.node().host();
        let ev = match started {
            Started::Daemon(rank) => {
                let (name, out) =
                    host.launched.get(&rank).cloned().unwrap_or_else(|| (format!("daemon-{rank}"), Default::default()));
                LauncherExit { what: format!("daemon {rank} on host {name}"), how, printed: out.text(), step: false }
            }
            Started::Step => {
                let Some((what, out)) = host.launch_step.clone() else { return };
                LauncherExit { what, how, printed: out.text(), step: true }
            }
        };
        self.node_mut().handle_boot(now, ev);
    }

    pub fn into_transport(self) -> Transport {
        self.t
    }
}

/// The daemon's own environment minus its DVM_* variables, for the procs it starts.
fn base_env() -> Vec<(String, String)> {
    std::env::vars().filter(|(k, _)| !k.starts_with("DVM_") && k != "RUST_LOG").collect()
}
