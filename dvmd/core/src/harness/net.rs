//! A network of nodes in one process for the core's unit tests: every frame takes one hop
//! latency, a killed daemon's peers hear of it one latency later, and time jumps to the next
//! event. Deterministic: one queue ordered by (time, insertion).

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

use bytes::Bytes;
use dvm_grpcomm::Config;
use dvm_proto::job::{AppContext, JobSpec};
use dvm_proto::rml::{Contact, FrameHeader};
use dvm_rml::Rank;

use super::{Due, SimHost, SimShell};
use crate::jobs::local::LocalConfig;
use crate::jobs::{ClientId, ProcEvent};
use crate::node::{Control, HnpConfig, LinkEvent, NodeConfig, Start, Transmit};
use crate::{CoreConfig, Node};

/// One hop.
pub const LATENCY_NS: u64 = 10_000;

#[derive(Debug)]
enum Ev {
    Arrive { from: Rank, to: Rank, header: FrameHeader, payload: Bytes },
    Proc { daemon: Rank, ev: ProcEvent },
    Lost { daemon: Rank, peer: Rank },
    Timeout { daemon: Rank },
}

/// Daemon `r`'s first incarnation.
fn epoch_of(r: Rank) -> u64 {
    u64::from(r) * 7919 + 1
}

/// Daemon `r`'s contact as the test network gives it.
pub fn contact(r: Rank, slots: u32) -> Contact {
    Contact {
        rank: r,
        host: format!("n{r}"),
        addr: format!("10.0.0.{}:7100", r + 1),
        pid: 100 + r,
        slots,
        epoch: 0,
        topo: None,
    }
}

/// A job of `np` procs of one app.
pub fn job(np: u32, argv: Vec<String>) -> JobSpec {
    JobSpec { apps: vec![AppContext { argv, np, ..Default::default() }], ..Default::default() }
}

/// N nodes, their shells, and the wire between them.
pub struct Net {
    pub nodes: Vec<Option<Node<SimHost>>>,
    pub shells: Vec<SimShell>,
    q: BinaryHeap<Reverse<(u64, u64, usize)>>,
    evs: Vec<Option<Ev>>,
    seq: u64,
    pub now: u64,
    links: BTreeSet<(Rank, Rank)>,
    /// Daemons cut off without a trace (a pulled cable, no heartbeat here): every frame to or
    /// from them vanishes and nobody is told.
    silent: BTreeSet<Rank>,
    /// Frames from `.0` to `.1` vanish (a new connection that cannot be made); an existing
    /// connection's close still reaches the other end.
    dropped: BTreeSet<(Rank, Rank)>,
    next_token: u64,
}

impl Net {
    /// A booted DVM of `n` daemons at `radix`, each with `slots` slots (on 64 cores).
    pub fn boot(n: u32, radix: u32, slots: u32) -> Net {
        Self::boot_on(n, radix, slots, 64)
    }

    /// [`Net::boot`] on machines of `cores` cores.
    pub fn boot_on(n: u32, radix: u32, slots: u32, cores: u32) -> Net {
        Self::boot_hw(n, radix, slots, cores, None)
    }

    /// [`Net::boot`] on nodes with this hardware (each reports it at check-in).
    pub fn boot_with_hardware(n: u32, radix: u32, slots: u32, hw: &crate::jobmap::NodeTopo) -> Net {
        Self::boot_hw(n, radix, slots, hw.count(crate::jobmap::Level::Core), Some(hw))
    }

    fn boot_hw(n: u32, radix: u32, slots: u32, cores: u32, hw: Option<&crate::jobmap::NodeTopo>) -> Net {
        let mut net = Net {
            nodes: Vec::new(),
            shells: (0..n).map(|_| SimShell::default()).collect(),
            q: BinaryHeap::new(),
            evs: Vec::new(),
            seq: 0,
            now: 0,
            links: BTreeSet::new(),
            silent: BTreeSet::new(),
            dropped: BTreeSet::new(),
            next_token: 1,
        };
        for r in 0..n {
            let mut cfg = Self::config(r, n, radix, slots, epoch_of(r));
            cfg.local.cores = cores;
            cfg.local.topo = hw.map(|t| std::sync::Arc::new(t.clone()));
            if let Some(own) = cfg.hnp.as_mut().map(|h| &mut h.own) {
                own.topo = hw.map(|t| t.to_wire());
            }
            net.nodes.push(Some(super::sim_node(cfg)));
        }
        for r in 0..n {
            let start = match (r, n) {
                (0, 1) => Start::WireSingle,
                (0, _) => Start::AwaitCheckIns,
                _ => Start::CheckIn(Contact { epoch: epoch_of(r), topo: hw.map(|t| t.to_wire()), ..contact(r, slots) }),
            };
            net.with(r, |node, now| node.handle_start(now, start));
        }
        net.run();
        assert!(net.shells[0].ready, "the test DVM of {n} daemons at radix {radix} became ready");
        net
    }

    fn config(r: Rank, n: u32, radix: u32, slots: u32, epoch: u64) -> NodeConfig {
        let core = CoreConfig { me: r, host: format!("n{r}"), epoch, radix, size: n, grpcomm: Config::default() };
        let hnp = (r == 0).then(|| HnpConfig {
            own: contact(0, slots),
            session_dir: "/tmp/sim".into(),
            one_job: false,
            startup_timeout_ns: Some(60_000_000_000),
            measure_link: false,
            terminate_deadline_ns: 1_000_000_000,
        });
        let local = LocalConfig {
            base_env: vec![("PATH".into(), "/bin".into())],
            session_dir: None,
            loopback: false,
            cores: 64,
            topo: None,
            mpi: dvm_proto::job::MpiInterface::MpiDefault,
            pmix_library: None,
        };
        NodeConfig { core, hnp, local, hostname: format!("n{r}"), pid: 100 + r }
    }

    /// Daemon `r` (dead) is started again as a new incarnation (`epoch`) and checks in.
    pub fn restart(&mut self, r: Rank, epoch: u64) {
        assert!(!self.alive(r), "daemon {r} is dead before it restarts");
        let t = self.nodes.iter().flatten().next().expect("a live daemon").router().topology();
        let (n, radix) = (t.size(), t.radix());
        self.nodes[r as usize] = Some(super::sim_node(Self::config(r, n, radix, 1, epoch)));
        self.shells[r as usize] = SimShell::default();
        let own = Contact { epoch, ..contact(r, 1) };
        self.with(r, |node, now| node.handle_start(now, Start::CheckIn(own)));
    }

    fn push(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.evs.push(Some(ev));
        self.q.push(Reverse((at, self.seq, self.evs.len() - 1)));
    }

    pub fn node(&self, r: Rank) -> &Node<SimHost> {
        self.nodes[r as usize].as_ref().expect("alive")
    }

    pub fn alive(&self, r: Rank) -> bool {
        self.nodes[r as usize].is_some()
    }

    /// Feed daemon `r` one input and carry out what it put out.
    pub fn with(&mut self, r: Rank, f: impl FnOnce(&mut Node<SimHost>, u64)) {
        let now = self.now;
        let Some(node) = self.nodes[r as usize].as_mut() else { return };
        f(node, now);
        // Staging's disk answers at once, as the daemon's shell does.
        let (mut transmits, mut effects) = (Vec::new(), Vec::new());
        loop {
            let (t, e) = super::drain(node);
            transmits.extend(t);
            for e in e {
                match e {
                    crate::node::Effect::Stage(io) => self.shells[r as usize].disk.apply(r, io),
                    e => effects.push(e),
                }
            }
            let answers = std::mem::take(&mut self.shells[r as usize].disk.answers);
            if answers.is_empty() {
                break;
            }
            for a in answers {
                node.handle_stage(now, a);
            }
        }
        let timeout = node.poll_timeout();
        for t in transmits {
            match t {
                Transmit::Frame { next_hop, header, payload } => {
                    self.links.insert((r.min(next_hop), r.max(next_hop)));
                    self.push(
                        now + LATENCY_NS,
                        Ev::Arrive { from: r, to: next_hop, header, payload: payload.into_bytes() },
                    );
                }
                Transmit::Disconnect(p) => {
                    if self.links.remove(&(r.min(p), r.max(p))) {
                        self.push(now + LATENCY_NS, Ev::Lost { daemon: p, peer: r });
                    }
                }
                Transmit::Contacts(_) => {}
            }
        }
        let mut exited = false;
        for e in effects {
            exited |= matches!(e, crate::node::Effect::Exit(_));
            for Due { at, ev } in self.shells[r as usize].apply(r, now, e) {
                self.push(at.max(now), Ev::Proc { daemon: r, ev });
            }
        }
        if exited {
            self.kill(r);
        } else if let Some(at) = timeout {
            self.push(at.max(now), Ev::Timeout { daemon: r });
        }
    }

    /// Daemon `r`'s PMIx server makes upcall `body`, to be answered with `reply`.
    pub fn upcall(&mut self, r: Rank, reply: u64, body: dvm_proto::pmixworker::worker_event::Body) {
        let ev = dvm_proto::pmixworker::WorkerEvent { reply, body: Some(body) };
        self.with(r, |n, now| n.handle_pmix(now, ev));
    }

    /// Rank `rank` of job `jobid`, on daemon `r`, writes `data` on its PMI fd.
    pub fn pmi_send(&mut self, r: Rank, jobid: u32, rank: u32, data: &[u8]) {
        let ev = crate::jobs::ProcEvent::PmiData { jobid, rank, data: bytes::Bytes::copy_from_slice(data) };
        self.with(r, |n, now| n.handle_proc(now, ev));
    }

    /// What daemon `r` wrote on the PMI fd of rank `rank` of job `jobid` and the rank has not
    /// read yet (taken).
    pub fn pmi_read(&mut self, r: Rank, jobid: u32, rank: u32) -> String {
        let got = self.shells[r as usize].pmi.remove(&(jobid, rank)).unwrap_or_default();
        String::from_utf8_lossy(&got).into_owned()
    }

    /// Whether daemon `r` closed the PMI fd of rank `rank` of job `jobid`.
    pub fn pmi_closed(&self, r: Rank, jobid: u32, rank: u32) -> bool {
        self.shells[r as usize].pmi_closed.contains(&(jobid, rank))
    }

    /// The upcall answers daemon `r` gave its PMIx server: (reply, status, data), in order.
    pub fn pmix_replies(&self, r: Rank) -> Vec<(u64, i32, bytes::Bytes)> {
        let replies = self.shells[r as usize].pmix.iter();
        replies
            .filter_map(|e| match e {
                crate::pmix::PmixEffect::Reply { reply, status, data } => Some((*reply, *status, data.clone())),
                _ => None,
            })
            .collect()
    }

    /// The PMIx name of rank `rank` of job `jobid` of this DVM.
    pub fn proc(&self, jobid: u32, rank: u32) -> dvm_proto::pmixworker::Proc {
        let nspace = crate::jobs::nspace_of(&self.node(0).router().dvm_id(), jobid);
        dvm_proto::pmixworker::Proc { nspace, rank }
    }

    /// Daemon `r` dies: its procs with it, its peers hear one latency later.
    pub fn kill(&mut self, r: Rank) {
        if self.nodes[r as usize].take().is_none() {
            return;
        }
        self.shells[r as usize].procs.clear();
        let peers: Vec<Rank> = self
            .links
            .iter()
            .filter_map(|&(a, b)| {
                if a == r {
                    Some(b)
                } else if b == r {
                    Some(a)
                } else {
                    None
                }
            })
            .collect();
        for p in peers {
            self.push(self.now + LATENCY_NS, Ev::Lost { daemon: p, peer: r });
        }
    }

    /// Frames from `from` to `to` vanish from now on (nobody is told).
    pub fn drop_frames(&mut self, from: Rank, to: Rank) {
        self.dropped.insert((from, to));
    }

    /// Tell daemon `daemon` its link to `peer` is lost (a heartbeat that fired, rightly or not).
    pub fn report_lost(&mut self, daemon: Rank, peer: Rank) {
        self.push(self.now, Ev::Lost { daemon, peer });
    }

    /// Cut daemon `r` off silently: its frames vanish both ways and no loss is reported.
    pub fn silence(&mut self, r: Rank) {
        self.silent.insert(r);
    }

    /// Step the earliest event; false when none is left.
    pub fn step(&mut self) -> bool {
        let Some(Reverse((at, _, idx))) = self.q.pop() else { return false };
        self.now = self.now.max(at);
        match self.evs[idx].take().expect("each event once") {
            Ev::Arrive { from, to, .. }
                if self.silent.contains(&from) || self.silent.contains(&to) || self.dropped.contains(&(from, to)) => {}
            Ev::Arrive { from, to, header, payload } => {
                if !self.alive(to) {
                    if self.alive(from) && self.links.remove(&(from.min(to), from.max(to))) {
                        self.push(self.now + LATENCY_NS, Ev::Lost { daemon: from, peer: to });
                    }
                    return true;
                }
                self.with(to, |n, now| n.handle_frame(now, from, header, payload));
            }
            Ev::Proc { daemon, ev } => {
                if self.shells[daemon as usize].take(&ev) {
                    self.with(daemon, |n, now| n.handle_proc(now, ev));
                }
            }
            Ev::Lost { daemon, peer } => {
                let reason = format!("connection to daemon {peer} closed");
                self.with(daemon, |n, now| n.handle_link(now, LinkEvent::Lost { peer, reason }));
            }
            Ev::Timeout { daemon } => {
                let due = self.nodes[daemon as usize].as_ref().and_then(|n| n.poll_timeout());
                if due.is_some_and(|d| d <= self.now) {
                    self.with(daemon, |n, now| n.handle_timeout(now));
                }
            }
        }
        true
    }

    /// Run until nothing is left to happen.
    pub fn run(&mut self) {
        while self.step() {}
    }

    /// Run for `d` ns more (or until nothing is left).
    pub fn run_for(&mut self, d: u64) {
        let t = self.now + d;
        while self.q.peek().is_some_and(|Reverse((at, _, _))| *at <= t) {
            self.step();
        }
        self.now = self.now.max(t);
    }

    /// A prun submits `spec`; its client id.
    pub fn launch(&mut self, spec: JobSpec) -> ClientId {
        let client = ClientId(self.next_token);
        self.next_token += 1;
        self.with(0, |n, now| n.handle_control(now, 0, Control::Launch(spec, client)));
        client
    }

    /// A control call to the HNP; its token.
    pub fn control(&mut self, req: Control) -> u64 {
        let token = self.next_token;
        self.next_token += 1;
        self.with(0, |n, now| n.handle_control(now, token, req));
        token
    }

    /// How the job of `client` ended for its prun.
    pub fn ended(&self, client: ClientId) -> Option<(i32, String)> {
        self.shells[0].ended(client)
    }

    /// Procs alive on any daemon.
    pub fn live_procs(&self) -> usize {
        self.shells.iter().map(|s| s.procs.len()).sum()
    }
}
