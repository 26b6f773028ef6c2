//! The discrete-event engine over N `dvm_core::Core`s: the carrier of `Effect::Transmit`
//! (one hop to `next_hop`, which steps `Input::Frame`), loss detection (heartbeats on tree
//! links, closed sockets, failed sends), freezes, cuts and kills, and the workloads. One seeded
//! RNG and one event queue (`queue::EventQueue`, ordered by `(time, insertion)`): a scenario
//! fixes the whole trace.
//!
//! The loss model, for daemon `r` and peer `p`. `p` is *silent* to `r` when `p` is killed,
//! exited or frozen, the link `r`-`p` is cut, or `p` has declared `r` dead (it stopped talking
//! to it). A tree neighbour (in `r`'s own view) that is silent is reported to `r` as
//! `PeerLost` one heartbeat bound later, if still silent then. A killed daemon's sockets are
//! closed at once when the kill has `rst` (and always when a core exits): every connected peer
//! gets `PeerLost` in order after the frames already on that link. A send to a dead daemon
//! fails (`SendFailed`, after α, when its sockets were closed) and the connection gives up one
//! heartbeat bound later (`PeerLost`). A frozen daemon queues every frame and socket close;
//! when it resumes it works through its queue, then hears `PeerLost` at once from every tree
//! neighbour still silent to it.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use dvm_core::harness::{SimHost, SimShell};
use dvm_core::jobs::local::LocalConfig;
use dvm_core::node::{HnpConfig, NodeConfig};
use dvm_core::{CoreConfig, Input};
use dvm_grpcomm::Rank;
use dvm_proto::daemon::{daemon_cmd, DaemonCmd};
use dvm_proto::rml::{Contact, FrameHeader, Tag};
use dvm_proto::Message;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::scenario::{CoreScenario, FaultKind, JOB_END};
use super::trace::{CoreTrace, End};
use crate::net::Carrier;
use crate::queue::EventQueue;

mod carrier;
mod clients;
mod fences;
mod jobs;
mod pmi_ranks;
mod shell;

/// A frame delayed on a lossy link waits at most this many heartbeat bounds for its
/// receiver to declare the sender dead, then is dropped.
const MAX_DELAY_ROUNDS: u32 = 20;

/// Control tokens of staging requests: this plus the stage's index.
pub(super) const STAGE_TOKEN: u64 = 1 << 40;

#[derive(Debug, Clone)]
enum Msg {
    Frame {
        header: FrameHeader,
        payload: Bytes,
        delayed: u32,
    },
    /// The sender closed its end of the connection (process ended).
    Close,
}

#[derive(Debug)]
enum Kind {
    CheckIn {
        daemon: Rank,
    },
    Arrive {
        from: Rank,
        to: Rank,
        msg: Msg,
        sent_at: u64,
    },
    Handle {
        from: Rank,
        to: Rank,
        msg: Msg,
    },
    Tick {
        daemon: Rank,
        at: u64,
    },
    Lost {
        daemon: Rank,
        peer: Rank,
    },
    SendFailed {
        daemon: Rank,
        peer: Rank,
    },
    Fault {
        idx: usize,
    },
    Resume {
        daemon: Rank,
    },
    JobStep {
        job: usize,
        daemon: Rank,
        step: usize,
    },
    Bench {
        idx: usize,
    },
    Xcast {
        idx: usize,
    },
    Stage {
        idx: usize,
    },
    JobEnd {
        job: usize,
    },
    Launch {
        idx: usize,
    },
    /// Launch `idx`'s prun was told something: did its job end?
    Heard {
        idx: usize,
    },
    /// Rank 0 of launch `idx` spawns a job.
    Spawn {
        idx: usize,
    },
    Terminate,
    /// The planned daemon dies (`start`) or its new incarnation starts.
    Restart {
        start: bool,
    },
    Proc {
        daemon: Rank,
        ev: dvm_core::jobs::ProcEvent,
    },
    /// An upcall of daemon `daemon`'s PMIx server (`clients`), from its `life`-th incarnation.
    Upcall {
        daemon: Rank,
        life: u32,
        ev: dvm_proto::pmixworker::WorkerEvent,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    Stopped,
    /// Killed; `rst`: its sockets were closed (sends to it are refused at once).
    Dead {
        rst: bool,
    },
}

struct Node {
    node: dvm_core::Node<SimHost>,
    /// Its simulated processes and prun streams.
    shell: SimShell,
    /// Daemons this node has applied as failed (for `DaemonsFailed`).
    failed_seen: BTreeSet<Rank>,
    state: State,
    /// Frames and closes that reached it while frozen, in arrival order.
    queue: Vec<(Rank, Msg)>,
    /// Workload inputs that came while frozen (its local clients waited).
    deferred: Vec<Kind>,
    armed: BTreeSet<u64>,
    /// Inputs stepped since ready.
    steps: u64,
    kill_at_step: Option<(u64, usize)>,
    stopped_at: u64,
}

pub struct CoreEngine<'s> {
    sc: &'s CoreScenario,
    /// Pending events; timer ticks are idle.
    q: EventQueue<Kind>,
    nodes: Vec<Node>,
    rng: StdRng,
    carrier: Carrier,
    /// Pairs that have a connection (any frame went between them), `(min, max)`.
    conns: BTreeSet<(Rank, Rank)>,
    /// Cut links `(min, max)` and when each is (or will be) cut, with its lossy flag.
    cut: BTreeSet<(Rank, Rank)>,
    lossy_cuts: BTreeMap<(Rank, Rank), u64>,
    /// `(daemon, peer)` with a loss detection pending.
    detecting: BTreeSet<(Rank, Rank)>,
    /// Whether any fault happened yet (loss detection work is skipped until then).
    faulty: bool,
    /// `(daemon, key) -> index in trace.fence_calls`.
    pending: BTreeMap<(Rank, u64), usize>,
    /// Members that finished each job's chain; whether its end was announced.
    job_finished: Vec<BTreeSet<Rank>>,
    job_ended: Vec<bool>,
    /// `(p, r) -> time` daemon `p` applied the DAEMON_DIED that declared `r` dead.
    declared: BTreeMap<(Rank, Rank), u64>,
    /// Simulated MPI ranks and their PMIx upcalls.
    clients: clients::Clients,
    /// Simulated MPI ranks that speak PMI on their fd.
    pmi: pmi_ranks::PmiRanks,
    pub trace: CoreTrace,
}

impl Node {
    /// Daemon `r` of the scenario, booting as incarnation `epoch`.
    fn fresh(sc: &CoreScenario, r: Rank, epoch: u64) -> Node {
        let cfg =
            CoreConfig { me: r, host: format!("n{r}"), epoch, radix: sc.radix, size: sc.n, grpcomm: sc.cfg.clone() };
        let hnp = (r == 0).then(|| HnpConfig {
            own: contact(r),
            session_dir: "/sim".into(),
            one_job: false,
            startup_timeout_ns: None,
            measure_link: false,
            // A few loss bounds: a daemon lost while TERMINATE travels is noticed in one.
            terminate_deadline_ns: 4 * (sc.heartbeat_ns + sc.detect_jitter_ns) + sc.cfg.relay_retry_ns,
        });
        let local = LocalConfig { cores: 64, ..LocalConfig::default() };
        let cfg = NodeConfig { core: cfg, hnp, local, hostname: format!("n{r}"), pid: 1000 + r };
        let mut shell = SimShell::default();
        // Projections stage large files to many daemons: count the bytes, keep none.
        shell.disk.count_only = sc.stages.iter().any(|s| s.bytes.len() > crate::daemons::stage::COUNT_ONLY_ABOVE);
        Node {
            node: dvm_core::harness::sim_node(cfg),
            shell,
            failed_seen: BTreeSet::new(),
            state: State::Running,
            queue: Vec::new(),
            deferred: Vec::new(),
            armed: BTreeSet::new(),
            steps: 0,
            kill_at_step: None,
            stopped_at: 0,
        }
    }
}

fn norm(a: Rank, b: Rank) -> (Rank, Rank) {
    (a.min(b), a.max(b))
}

/// Whether a frame is the HNP's eviction notice.
fn is_eviction(header: &FrameHeader, payload: &Bytes) -> bool {
    header.tag == Tag::DaemonCmd as u32
        && matches!(DaemonCmd::decode(payload.clone()), Ok(DaemonCmd { body: Some(daemon_cmd::Body::Evicted(_)) }))
}

impl<'s> CoreEngine<'s> {
    pub fn new(sc: &'s CoreScenario) -> Self {
        let nodes = (0..sc.n)
            .map(|r| Node::fresh(sc, r, (sc.seed.wrapping_mul(0x9E37_79B9) ^ (u64::from(r) << 20)) | 1))
            .collect();
        let n = sc.n as usize;
        let trace = CoreTrace {
            deliveries: vec![Vec::new(); n],
            ends: vec![End::Running; n],
            launched_at: vec![None; sc.launches.len()],
            launch_ends: vec![None; sc.launches.len()],
            spawns_asked: vec![None; sc.launches.len()],
            spawn_answers: vec![Vec::new(); sc.launches.len()],
            stage_starts: vec![None; sc.stages.len()],
            stage_dones: vec![None; sc.stages.len()],
            peak_state: vec![0; n],
            peak_unnamed: vec![0; n],
            ..CoreTrace::default()
        };
        let mut e = CoreEngine {
            sc,
            q: EventQueue::new(|k| matches!(k, Kind::Tick { .. }), sc.bound_ns, sc.max_events),
            nodes,
            rng: StdRng::seed_from_u64(sc.seed),
            carrier: Carrier::new(sc.n),
            conns: BTreeSet::new(),
            cut: BTreeSet::new(),
            lossy_cuts: BTreeMap::new(),
            detecting: BTreeSet::new(),
            faulty: false,
            pending: BTreeMap::new(),
            job_finished: vec![BTreeSet::new(); sc.jobs.len()],
            job_ended: vec![false; sc.jobs.len()],
            declared: BTreeMap::new(),
            clients: Default::default(),
            pmi: Default::default(),
            trace,
        };
        for r in 1..sc.n {
            let at = e.rng.gen_range(0..=sc.boot_stagger_ns);
            e.q.push(at, Kind::CheckIn { daemon: r });
        }
        e
    }

    /// Record every event as a line of text (see [`CoreEngine::run_logged`]).
    pub fn with_log(mut self) -> Self {
        self.q.enable_log();
        self
    }

    pub fn run(self) -> CoreTrace {
        self.run_logged().0
    }

    pub fn run_logged(mut self) -> (CoreTrace, Vec<String>) {
        while let Some(kind) = self.q.pop() {
            self.event(kind);
            if self.q.only_idle_left()
                && self.nodes.iter().all(|n| n.state != State::Running || n.node.router().grpcomm().is_quiescent())
                && (self.nodes[0].state != State::Running || self.nodes[0].node.jobs().is_none_or(|j| j.is_empty()))
            {
                break;
            }
        }
        self.trace.stats.events = self.q.handled();
        self.trace.engine_errors.extend(self.q.overrun().map(str::to_string));
        self.trace.end_ns = self.q.now();
        self.finish_clients();
        self.finish_pmi();
        self.finish_jobs();
        for (r, n) in self.nodes.iter().enumerate() {
            self.trace.peak_unnamed[r] = n.shell.disk.peak_unnamed;
        }
        for n in &self.nodes {
            self.trace.final_failed.push(n.node.router().topology().failed().clone());
            self.trace.final_owned.push(n.node.router().owned_ops());
            self.trace.final_quiescent.push(n.node.router().grpcomm().is_quiescent());
            self.trace.final_stage_held.push(n.node.stage_held());
            self.trace.final_files.push(
                n.shell.disk.files.iter().map(|(p, b)| (p.clone(), crate::daemons::stage::fingerprint(b))).collect(),
            );
        }
        let log = self.q.take_log();
        (self.trace, log)
    }

    fn running(&self, r: Rank) -> bool {
        self.nodes[r as usize].state == State::Running
    }

    /// `p` says nothing to `r` (see the module docs).
    fn silent(&self, r: Rank, p: Rank) -> bool {
        self.nodes[p as usize].state != State::Running
            || self.cut.contains(&norm(r, p))
            || !self.nodes[p as usize].node.router().topology().is_alive(r)
    }

    /// Since when `p` has said nothing to `r` (only meaningful while [`Self::silent`]).
    fn silent_since(&self, r: Rank, p: Rank) -> u64 {
        let mut since = u64::MAX;
        match (&self.trace.ends[p as usize], self.nodes[p as usize].state) {
            (End::Killed(at) | End::Exited(at, _), _) => since = since.min(*at),
            (_, State::Stopped) => since = since.min(self.nodes[p as usize].stopped_at),
            _ => {}
        }
        if let Some(&(_, _, at)) = self.trace.cuts.iter().find(|c| norm(c.0, c.1) == norm(r, p)) {
            since = since.min(at);
        }
        if let Some(&at) = self.declared.get(&(p, r)) {
            since = since.min(at);
        }
        since
    }

    fn event(&mut self, kind: Kind) {
        match kind {
            Kind::CheckIn { daemon } => {
                let c = contact(daemon);
                self.drive(daemon, Input::CheckIn(c));
            }
            Kind::Arrive { from, to, msg, sent_at } => self.arrive(from, to, msg, sent_at),
            Kind::Handle { from, to, msg } => self.handle(from, to, msg),
            Kind::Tick { daemon, at } => {
                self.nodes[daemon as usize].armed.remove(&at);
                if self.running(daemon) {
                    self.drive(daemon, Input::Tick);
                }
            }
            Kind::Lost { daemon, peer } => {
                self.detecting.remove(&(daemon, peer));
                if self.running(daemon) && self.silent(daemon, peer) {
                    self.peer_lost(daemon, peer, "heartbeat silence");
                }
            }
            Kind::SendFailed { daemon, peer } => {
                if self.running(daemon) {
                    self.trace.stats.send_failed += 1;
                    self.q.note(|| format!("d{daemon} SEND_FAILED d{peer}"));
                    self.drive(daemon, Input::SendFailed { peer });
                }
            }
            Kind::Fault { idx } => self.fault(idx),
            Kind::Resume { daemon } => self.resume(daemon),
            Kind::JobStep { job, daemon, step } => self.job_step(job, daemon, step),
            Kind::JobEnd { job } => match self.nodes[0].state {
                State::Running => {
                    let payload = Bytes::from((job as u64).to_le_bytes().to_vec());
                    self.q.note(|| format!("d0 JOB_END {job}"));
                    self.drive(0, Input::Xcast { tag: JOB_END, payload });
                }
                State::Stopped => self.nodes[0].deferred.push(Kind::JobEnd { job }),
                State::Dead { .. } => {}
            },
            Kind::Launch { idx } => self.launch(idx),
            Kind::Proc { daemon, ev } => self.proc_event(daemon, ev),
            Kind::Upcall { daemon, life, ev } => self.deliver_upcall(daemon, life, ev),
            Kind::Heard { idx } => self.heard(idx),
            Kind::Spawn { idx } => self.spawn(idx),
            Kind::Stage { idx } => self.stage(idx),
            Kind::Terminate => self.terminate(),
            Kind::Restart { start } => self.restart(start),
            Kind::Bench { idx } => {
                if self.running(0) {
                    let b = &self.sc.benches[idx];
                    let input = Self::bench_input(b.count, b.bytes);
                    self.trace.bench_starts.push(self.q.now());
                    self.q.note(|| format!("d0 BENCH {idx}"));
                    self.drive_in(0, input);
                } else if self.nodes[0].state == State::Stopped {
                    self.nodes[0].deferred.push(Kind::Bench { idx });
                }
            }
            Kind::Xcast { idx } => {
                let x = &self.sc.xcasts[idx];
                let (origin, tag, payload) = (x.origin, x.tag, x.payload.clone());
                match self.nodes[origin as usize].state {
                    State::Running => {
                        self.trace.xcast_starts.push((origin, tag, payload.clone(), self.q.now()));
                        self.drive(origin, Input::Xcast { tag, payload });
                    }
                    State::Stopped => self.nodes[origin as usize].deferred.push(Kind::Xcast { idx }),
                    State::Dead { .. } => {}
                }
            }
        }
    }

    fn peer_lost(&mut self, daemon: Rank, peer: Rank, why: &str) {
        self.trace.stats.peer_lost += 1;
        self.q.note(|| format!("d{daemon} PEER_LOST d{peer} ({why})"));
        self.drive(daemon, Input::PeerLost { peer, reason: why.to_string() });
    }

    // ------------------------------------------------------------------ workloads

    fn on_ready(&mut self) {
        if self.trace.ready_at.is_some() {
            return;
        }
        let t0 = self.q.now();
        self.trace.ready_at = Some(t0);
        self.trace.last_fault_at = t0;
        for n in &mut self.nodes {
            n.steps = 0;
        }
        let sc = self.sc;
        for (j, job) in sc.jobs.iter().enumerate() {
            for (&daemon, &at) in job.members.iter().zip(&job.first_start) {
                self.q.push(t0 + at, Kind::JobStep { job: j, daemon, step: 0 });
            }
        }
        for (i, b) in sc.benches.iter().enumerate() {
            self.q.push(t0 + b.at, Kind::Bench { idx: i });
        }
        for (i, x) in sc.xcasts.iter().enumerate() {
            self.q.push(t0 + x.at, Kind::Xcast { idx: i });
        }
        for (i, st) in sc.stages.iter().enumerate() {
            self.q.push(t0 + st.at, Kind::Stage { idx: i });
        }
        for (i, l) in sc.launches.iter().enumerate() {
            self.q.push(t0 + l.at, Kind::Launch { idx: i });
            if let Some(sp) = &l.spawn {
                self.q.push(t0 + l.at + sp.after, Kind::Spawn { idx: i });
            }
        }
        if let Some(at) = sc.terminate_at {
            self.q.push(t0 + at, Kind::Terminate);
        }
        if let Some(rp) = &sc.restart {
            self.q.push(t0 + rp.at, Kind::Restart { start: false });
            self.q.push(t0 + rp.at + rp.after, Kind::Restart { start: true });
        }
        for (i, f) in sc.faults.iter().enumerate() {
            if let FaultKind::Cut { a, b, lossy: true } = f.kind {
                self.lossy_cuts.insert(norm(a, b), t0 + f.at);
            }
            self.q.push(t0 + f.at, Kind::Fault { idx: i });
        }
    }
}

impl End {
    fn died_before(&self, t: u64) -> bool {
        match self {
            End::Killed(at) | End::Exited(at, _) => *at < t,
            End::Running => false,
        }
    }
}

fn contact(r: Rank) -> Contact {
    Contact {
        topo: None,
        rank: r,
        host: format!("n{r}"),
        addr: format!("10.0.{}.{}:7100", r / 250, r % 250 + 1),
        pid: 1000 + r,
        slots: 1,
        epoch: 0,
    }
}

/// One line describing a frame, without payload bytes.
pub fn describe(h: &FrameHeader, payload: &Bytes) -> String {
    let what = match Tag::try_from(h.tag as i32) {
        Ok(Tag::Grpcomm) => match dvm_proto::grpcomm::GrpcommMsg::decode(payload.clone()) {
            Ok(m) => crate::engine::describe(&m),
            Err(_) => "undecodable grpcomm".into(),
        },
        Ok(Tag::DaemonCmd) => match DaemonCmd::decode(payload.clone()) {
            Ok(DaemonCmd { body: Some(b) }) => format!("{b:?}"),
            _ => "undecodable command".into(),
        },
        Ok(t) => format!("{t:?}"),
        Err(_) => format!("tag {}", h.tag),
    };
    format!("origin {} dst {} epoch {}: {what}", h.origin, h.dst, h.epoch)
}
