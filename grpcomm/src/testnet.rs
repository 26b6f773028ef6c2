//! The one in-memory network of `Grpcomm` daemons that grpcomm's tests and the simulator's
//! grpcomm engine both run on.
//!
//! Owns: N daemons and the carrier rules a daemon applies around its grpcomm machine
//! (`dvm_core` in `dvmd`): a `Via::Tree` send is routed hop by hop, each hop with its own
//! `Topology::route_to`; a `Via::Direct` send takes one lateral link straight to its
//! destination; an answer to a frame that came straight from its origin goes back on that
//! link (a neighbour that repaired before us is not on our route yet); a frame whose last hop
//! or origin the receiver holds failed is dropped as stale; grpcomm sees the *origin* of a
//! frame, never the relay that handed it on. Also checks the driver's rules on process-first
//! tags (a daemon forwards such an op only once its driver confirmed it, and delivers nothing
//! while one awaits confirmation).
//!
//! Two halves: [`Net`] decides what leaves a daemon and where it goes, and reports it as
//! [`Event`]s; *when* a frame arrives is the carrier's choice. [`Links`] is the carrier of the
//! unit and property tests (FIFO per link, a seeded choice of which link moves next); the
//! simulator's timed carrier (α-β links, serialized NICs, jitter) is the other.
//!
//! Never: a clock, a thread, a `HashMap`. Everything here is deterministic given the order
//! of calls (and, for [`Links`], the seed).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;
use dvm_proto::grpcomm::{grpcomm_msg::Body, GrpcommMsg};
use dvm_rml::topology::{Route, TopologyError};

use crate::{
    Config, Effect, FenceError, FenceId, FenceRequest, FenceSignature, Grpcomm, Participants, Rank, RepairDelta,
    Topology, Via, XcastId,
};

/// One message on one link.
#[derive(Debug, Clone)]
pub struct Frame {
    /// The daemon that put it on this link: its origin, or a relay.
    pub from: Rank,
    /// The daemon at the far end of this link.
    pub to: Rank,
    /// The daemon whose grpcomm sent it.
    pub origin: Rank,
    /// Its final destination.
    pub dst: Rank,
    /// How its origin sent it.
    pub via: Via,
    /// Links it has crossed, this one included.
    pub hops: u32,
    pub msg: GrpcommMsg,
}

/// What the network reports to its carrier and driver, in order.
#[derive(Debug)]
pub enum Event {
    /// Carry this frame over the link `frame.from -> frame.to`, then hand it to [`Net::arrive`].
    Carry(Frame),
    /// `from` found its link to `to` down (`to` crashed, or no lateral link): tell `from`, now
    /// or after a detection delay, with [`Net::unreachable`].
    Refused {
        from: Rank,
        to: Rank,
    },
    Deliver {
        daemon: Rank,
        op_id: u64,
        origin: Rank,
        tag: u32,
        payload: Bytes,
    },
    XcastComplete {
        daemon: Rank,
        id: XcastId,
        op_id: u64,
    },
    FenceComplete {
        daemon: Rank,
        id: FenceId,
        result: Result<Bytes, FenceError>,
    },
    ScatterDeliver {
        daemon: Rank,
        origin: Rank,
        scatter_id: u64,
        tag: u32,
        data: Bytes,
    },
    ArmTimer {
        daemon: Rank,
        at: u64,
    },
    Dropped {
        daemon: Rank,
        from: Rank,
        reason: String,
    },
}

/// Counters over a run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Frames put on a link (each hop counts).
    pub frames: u64,
    /// Sends over lateral links.
    pub direct: u64,
    /// Sends that found their link down.
    pub refused: u64,
    /// Frames with no route (their destination is failed for the hop holding them).
    pub unroutable: u64,
    /// Frames dropped past the hop limit.
    pub looped: u64,
    /// Frames dropped because the receiver holds their last hop or origin failed.
    pub stale: u64,
    /// `Via::Tree` sends to a daemon that is no tree neighbour of the sender, by message kind
    /// (routed hop by hop, or answered on the link a frame came in on).
    pub far_tree_sends: BTreeMap<&'static str, u64>,
}

struct Node {
    g: Grpcomm,
    alive: bool,
    /// A process-first op delivered to the driver and not confirmed yet.
    unconfirmed: Option<u64>,
    /// Process-first ops the driver confirmed.
    confirmed: BTreeSet<u64>,
}

/// N daemons and the rules between them; see the module docs.
pub struct Net {
    nodes: Vec<Node>,
    events: VecDeque<Event>,
    /// Daemons with no lateral link: a direct send from or to one of them (other than to a
    /// tree neighbour, which takes the tree link) is refused.
    pub no_lateral: BTreeSet<Rank>,
    /// A frame that would cross more links than this is dropped (counted as looped).
    pub hop_limit: u32,
    pub stats: NetStats,
    /// Broken driver rules on process-first tags, in words.
    pub violations: Vec<String>,
    /// The daemon whose frame, sent straight from its origin, is being handled.
    answering: Option<Rank>,
}

impl Net {
    /// `n` daemons on a tree of `radix`, daemon `r` configured with `cfg(r)`.
    pub fn new(n: u32, radix: u32, cfg: impl Fn(Rank) -> Config) -> Self {
        let nodes = (0..n)
            .map(|r| Node {
                g: Grpcomm::new(Topology::new(r, radix, n).expect("valid geometry"), cfg(r)),
                alive: true,
                unconfirmed: None,
                confirmed: BTreeSet::new(),
            })
            .collect();
        Net {
            nodes,
            events: VecDeque::new(),
            no_lateral: BTreeSet::new(),
            hop_limit: u32::MAX,
            stats: NetStats::default(),
            violations: Vec::new(),
            answering: None,
        }
    }

    pub fn size(&self) -> u32 {
        self.nodes.len() as u32
    }

    pub fn is_alive(&self, r: Rank) -> bool {
        self.nodes.get(r as usize).is_some_and(|n| n.alive)
    }

    /// Daemons not crashed, ascending.
    pub fn live(&self) -> Vec<Rank> {
        (0..self.size()).filter(|&r| self.is_alive(r)).collect()
    }

    /// Daemon `r`'s machine (crashed ones too), to read.
    pub fn node(&self, r: Rank) -> &Grpcomm {
        &self.nodes[r as usize].g
    }

    /// Daemon `r`'s machine, to drive by hand: its effects stay in it until the next call
    /// that pumps `r` (or [`Net::pump`]).
    pub fn node_mut(&mut self, r: Rank) -> &mut Grpcomm {
        &mut self.nodes[r as usize].g
    }

    /// Call into live daemon `r` and carry out what it does.
    pub fn call<T>(&mut self, r: Rank, f: impl FnOnce(&mut Grpcomm) -> T) -> T {
        assert!(self.is_alive(r), "daemon {r} is crashed");
        let out = f(&mut self.nodes[r as usize].g);
        self.pump(r);
        out
    }

    pub fn fence(&mut self, r: Rank, req: FenceRequest, now: u64) -> FenceId {
        self.call(r, |g| g.fence(req, now))
    }

    pub fn xcast(&mut self, r: Rank, tag: u32, payload: Bytes) -> XcastId {
        self.call(r, |g| g.xcast(tag, payload))
    }

    pub fn scatter(&mut self, r: Rank, tag: u32, slices: Vec<(Rank, Bytes)>) -> u64 {
        self.call(r, |g| g.scatter(tag, slices))
    }

    /// The time `at` has come for daemon `r` (no-op for a crashed one).
    pub fn tick(&mut self, r: Rank, now: u64) {
        if self.is_alive(r) {
            self.call(r, |g| g.tick(now));
        }
    }

    /// Daemon `r` applies the failed set `failed` (a crashed daemon applies nothing).
    pub fn repair(&mut self, r: Rank, failed: &BTreeSet<Rank>) -> Option<Result<RepairDelta, TopologyError>> {
        self.is_alive(r).then(|| self.call(r, |g| g.topology_changed(failed)))
    }

    /// Daemon `r` stops: it sends and handles nothing more. Frames it already put on a link
    /// are the carrier's to deliver or lose.
    pub fn crash(&mut self, r: Rank) {
        let n = &mut self.nodes[r as usize];
        n.alive = false;
        n.unconfirmed = None;
    }

    /// The process-first op daemon `r` holds for its driver, if any.
    pub fn unconfirmed(&self, r: Rank) -> Option<u64> {
        self.nodes[r as usize].unconfirmed
    }

    /// Daemon `r`'s driver has applied the process-first op it holds; false if none.
    pub fn confirm(&mut self, r: Rank) -> bool {
        if !self.is_alive(r) {
            return false;
        }
        let n = &mut self.nodes[r as usize];
        let Some(op) = n.unconfirmed.take() else { return false };
        n.confirmed.insert(op);
        self.call(r, |g| g.xcast_processed(op));
        true
    }

    /// `daemon` learns that its link to `peer` is down (once the carrier decides it has
    /// noticed). Ignored when `daemon` is crashed or already holds `peer` failed.
    pub fn unreachable(&mut self, daemon: Rank, peer: Rank) {
        if self.is_alive(daemon) && self.node(daemon).topology().is_alive(peer) {
            self.call(daemon, |g| g.peer_unreachable(peer));
        }
    }

    /// The carrier found the link `from -> to` down.
    pub fn refuse(&mut self, from: Rank, to: Rank) {
        self.stats.refused += 1;
        if self.is_alive(from) {
            self.events.push_back(Event::Refused { from, to });
        }
    }

    /// `frame` reached `frame.to`: dropped there if `to` is crashed or holds the frame's last
    /// hop or origin failed, handed on if `to` is a relay, else handled by its grpcomm.
    pub fn arrive(&mut self, frame: Frame) {
        let to = frame.to;
        if !self.is_alive(to) {
            return;
        }
        let topo = self.node(to).topology();
        let stale = |r: Rank| r != to && r < topo.size() && !topo.is_alive(r);
        if stale(frame.from) || stale(frame.origin) {
            self.stats.stale += 1;
            return;
        }
        if frame.dst != to {
            self.route(to, frame.origin, frame.dst, frame.via, frame.msg, frame.hops);
            return;
        }
        self.answering = (frame.from == frame.origin).then_some(frame.from);
        self.nodes[to as usize].g.handle(frame.origin, frame.msg);
        self.pump(to);
        self.answering = None;
    }

    /// The next event, oldest first.
    pub fn pop_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Carry out every effect daemon `r` has produced, including those produced meanwhile.
    pub fn pump(&mut self, r: Rank) {
        loop {
            let effects: Vec<Effect> = self.nodes[r as usize].g.drain().collect();
            if effects.is_empty() {
                return;
            }
            for e in effects {
                self.effect(r, e);
            }
        }
    }

    fn effect(&mut self, r: Rank, e: Effect) {
        match e {
            Effect::Send { to, msg, via } => self.send(r, to, msg, via),
            Effect::Deliver { op_id, origin, tag, payload } => {
                let n = &mut self.nodes[r as usize];
                if let Some(waiting) = n.unconfirmed {
                    self.violations.push(format!(
                        "daemon {r} delivered op {op_id} while process-first op {waiting} awaited its driver"
                    ));
                }
                if n.g.config().process_first.contains(&tag) {
                    n.unconfirmed = Some(op_id);
                }
                self.events.push_back(Event::Deliver { daemon: r, op_id, origin, tag, payload });
            }
            Effect::XcastComplete { id, op_id } => self.events.push_back(Event::XcastComplete { daemon: r, id, op_id }),
            Effect::FenceComplete { id, result } => {
                self.events.push_back(Event::FenceComplete { daemon: r, id, result })
            }
            Effect::ScatterDeliver { origin, scatter_id, tag, data } => {
                self.events.push_back(Event::ScatterDeliver { daemon: r, origin, scatter_id, tag, data })
            }
            Effect::ArmTimer { at } => self.events.push_back(Event::ArmTimer { daemon: r, at }),
            Effect::Dropped { from, reason } => self.events.push_back(Event::Dropped { daemon: r, from, reason }),
        }
    }

    fn send(&mut self, r: Rank, to: Rank, msg: GrpcommMsg, via: Via) {
        let n = &self.nodes[r as usize];
        if let Some(Body::Forward(f)) = &msg.body {
            if n.g.config().process_first.contains(&f.tag) && !n.confirmed.contains(&f.op_id) {
                self.violations.push(format!(
                    "daemon {r} forwarded process-first op {} (tag {}) to {to} before its driver confirmed it",
                    f.op_id, f.tag
                ));
            }
        }
        let topo = n.g.topology();
        let neighbour = topo.parent() == Some(to) || topo.children().contains(&to);
        if to >= self.size() || to == r {
            self.violations.push(format!("daemon {r} sent {} to {to}", describe(&msg)));
            return;
        }
        match via {
            Via::Direct => {
                self.stats.direct += 1;
                let cut = !neighbour && (self.no_lateral.contains(&r) || self.no_lateral.contains(&to));
                if cut {
                    self.refuse(r, to);
                } else {
                    self.put(Frame { from: r, to, origin: r, dst: to, via, hops: 1, msg });
                }
            }
            Via::Tree => {
                if !neighbour {
                    *self.stats.far_tree_sends.entry(kind(&msg)).or_default() += 1;
                }
                if self.answering == Some(to) {
                    self.put(Frame { from: r, to, origin: r, dst: to, via, hops: 1, msg });
                } else {
                    self.route(r, r, to, via, msg, 0);
                }
            }
        }
    }

    /// Move a frame one hop from `at` toward `dst` along `at`'s own tree.
    fn route(&mut self, at: Rank, origin: Rank, dst: Rank, via: Via, msg: GrpcommMsg, hops: u32) {
        match self.node(at).topology().route_to(dst) {
            Route::Up(next) | Route::Down(next) => {
                if hops >= self.hop_limit {
                    self.stats.looped += 1;
                    return;
                }
                self.put(Frame { from: at, to: next, origin, dst, via, hops: hops + 1, msg });
            }
            Route::Local | Route::Unreachable => self.stats.unroutable += 1,
        }
    }

    fn put(&mut self, frame: Frame) {
        if !self.is_alive(frame.to) {
            self.refuse(frame.from, frame.to);
            return;
        }
        self.stats.frames += 1;
        self.events.push_back(Event::Carry(frame));
    }
}

/// A seeded xorshift generator: the only randomness of [`Links`].
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> Self {
        XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform-ish in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// A fence's result on one daemon.
pub type Outcome = (FenceId, Result<Bytes, FenceError>);

/// The tests' carrier over a [`Net`]: one FIFO queue per directed link, a seeded choice of
/// which link delivers next (or which daemon's driver confirms a held process-first op), a
/// refused send noticed at once; and the record of what every daemon reported.
pub struct Links {
    pub net: Net,
    queues: BTreeMap<(Rank, Rank), VecDeque<Frame>>,
    pub rng: XorShift,
    /// Crashed daemons: the failed set every survivor applies on [`Links::repair`].
    pub failed: BTreeSet<Rank>,
    /// Fences completed per daemon, in completion order.
    pub done: Vec<Vec<Outcome>>,
    /// Broadcast ops delivered per daemon, in order.
    pub delivered: Vec<Vec<(u64, Bytes)>>,
    /// Broadcasts started per daemon that completed.
    pub completed: Vec<Vec<XcastId>>,
    /// Scatter slices received per daemon: (origin, scatter id, tag, data).
    pub scattered: Vec<Vec<(Rank, u64, u32, Bytes)>>,
    /// Timers armed per daemon.
    pub timers: Vec<Vec<u64>>,
    /// Messages a daemon could not use: (daemon, from, reason).
    pub dropped: Vec<(Rank, Rank, String)>,
    /// Hops delivered so far.
    pub hops: u64,
    /// Frames handed to the grpcomm of their destination, in order (when `Some`).
    pub trace: Option<Vec<Frame>>,
    /// Frames that reached a daemon while it held a process-first op for its driver.
    pub held_across_traffic: usize,
    /// [`Links::drive`] crashes each of these daemons once this many hops were delivered
    /// (ascending), then repairs the survivors one by one at random moments.
    pub scheduled_crashes: Vec<(u64, Rank)>,
}

impl Links {
    /// `n` daemons of `Config::default()` on a tree of `radix`.
    pub fn new(n: u32, radix: u32, seed: u64) -> Self {
        Self::with_configs(n, radix, seed, |_| Config::default())
    }

    pub fn with_configs(n: u32, radix: u32, seed: u64, cfg: impl Fn(Rank) -> Config) -> Self {
        Links {
            net: Net::new(n, radix, cfg),
            queues: BTreeMap::new(),
            rng: XorShift::new(seed),
            failed: BTreeSet::new(),
            done: per_daemon(n),
            delivered: per_daemon(n),
            completed: per_daemon(n),
            scattered: per_daemon(n),
            timers: per_daemon(n),
            dropped: Vec::new(),
            hops: 0,
            trace: None,
            held_across_traffic: 0,
            scheduled_crashes: Vec::new(),
        }
    }

    pub fn size(&self) -> u32 {
        self.net.size()
    }

    pub fn live(&self) -> Vec<Rank> {
        self.net.live()
    }

    pub fn is_alive(&self, r: Rank) -> bool {
        self.net.is_alive(r)
    }

    pub fn node(&self, r: Rank) -> &Grpcomm {
        self.net.node(r)
    }

    /// Daemon `r`'s machine to drive by hand; [`Links::pump`] carries out what it did.
    pub fn node_mut(&mut self, r: Rank) -> &mut Grpcomm {
        self.net.node_mut(r)
    }

    /// Sends over lateral links so far.
    pub fn direct_sends(&self) -> u64 {
        self.net.stats.direct
    }

    /// Call into live daemon `r` and carry out what it does.
    pub fn with<T>(&mut self, r: Rank, f: impl FnOnce(&mut Grpcomm) -> T) -> T {
        let out = self.net.call(r, f);
        self.settle();
        out
    }

    pub fn start(&mut self, r: Rank, req: FenceRequest, now: u64) -> FenceId {
        self.with(r, |g| g.fence(req, now))
    }

    pub fn xcast(&mut self, r: Rank, tag: u32, payload: Bytes) -> XcastId {
        self.with(r, |g| g.xcast(tag, payload))
    }

    /// Carry out what daemon `r` did while driven through [`Links::node_mut`].
    pub fn pump(&mut self, r: Rank) {
        self.net.pump(r);
        self.settle();
    }

    pub fn tick(&mut self, r: Rank, now: u64) {
        self.net.tick(r, now);
        self.settle();
    }

    /// Daemon `r`'s driver confirms the process-first op it holds (false if none).
    pub fn confirm(&mut self, r: Rank) -> bool {
        let held = self.net.confirm(r);
        self.settle();
        held
    }

    /// Take every event the network reported: frames onto their links, refusals noticed at
    /// once, outcomes into the record.
    fn settle(&mut self) {
        while let Some(ev) = self.net.pop_event() {
            match ev {
                Event::Carry(f) => self.queues.entry((f.from, f.to)).or_default().push_back(f),
                Event::Refused { from, to } => self.net.unreachable(from, to),
                Event::Deliver { daemon, op_id, payload, .. } => self.delivered[daemon as usize].push((op_id, payload)),
                Event::XcastComplete { daemon, id, .. } => self.completed[daemon as usize].push(id),
                Event::FenceComplete { daemon, id, result } => self.done[daemon as usize].push((id, result)),
                Event::ScatterDeliver { daemon, origin, scatter_id, tag, data } => {
                    self.scattered[daemon as usize].push((origin, scatter_id, tag, data))
                }
                Event::ArmTimer { daemon, at } => self.timers[daemon as usize].push(at),
                Event::Dropped { daemon, from, reason } => self.dropped.push((daemon, from, reason)),
            }
        }
    }

    /// Frames queued on every link.
    pub fn pending_messages(&self) -> usize {
        self.queues.values().map(VecDeque::len).sum()
    }

    /// Links with a frame queued, ascending.
    pub fn busy_links(&self) -> Vec<(Rank, Rank)> {
        self.queues.iter().filter(|(_, q)| !q.is_empty()).map(|(&k, _)| k).collect()
    }

    /// Deliver the head of one link, or let one daemon's driver confirm its held
    /// process-first op, chosen at random; false when neither is possible.
    pub fn step(&mut self) -> bool {
        let busy = self.busy_links();
        let waiting: Vec<Rank> = self.live().into_iter().filter(|&r| self.net.unconfirmed(r).is_some()).collect();
        if busy.is_empty() && waiting.is_empty() {
            return false;
        }
        let pick = self.rng.below(busy.len() + waiting.len());
        match busy.get(pick) {
            Some(&(from, to)) => self.deliver_hop(from, to),
            None => {
                self.confirm(waiting[pick - busy.len()]);
            }
        }
        true
    }

    /// Deliver the frame at the head of link `from -> to` (which must have one).
    pub fn deliver_hop(&mut self, from: Rank, to: Rank) {
        let f = self.queues.get_mut(&(from, to)).and_then(VecDeque::pop_front).expect("a frame on this link");
        self.hops += 1;
        if self.net.is_alive(to) && f.dst == to {
            if self.net.unconfirmed(to).is_some() {
                self.held_across_traffic += 1;
            }
            if let Some(t) = self.trace.as_mut() {
                t.push(f.clone());
            }
        }
        self.net.arrive(f);
        self.settle();
    }

    /// Step until nothing moves.
    pub fn run(&mut self) {
        let mut steps = 0u64;
        while self.step() {
            steps += 1;
            assert!(steps < 10_000_000, "no quiescence after {steps} steps");
        }
    }

    /// Daemon `victim` crashes: frames queued toward it are lost; frames it already sent
    /// stay on their links. Nobody is told until [`Links::repair`] (or a refused send).
    pub fn crash(&mut self, victim: Rank) {
        self.net.crash(victim);
        self.failed.insert(victim);
        self.queues.retain(|&(_, to), _| to != victim);
    }

    /// Daemon `r` applies the failed set (every crash so far).
    pub fn repair(&mut self, r: Rank) {
        let failed = self.failed.clone();
        if let Some(res) = self.net.repair(r, &failed) {
            res.expect("repair");
        }
        self.settle();
    }

    /// Every survivor applies the failed set at once, in rank order.
    pub fn repair_all(&mut self) {
        for r in self.live() {
            self.repair(r);
        }
    }

    /// Crash `victim`, then repair the survivors one at a time in a random order, letting one
    /// frame through after each (a repair reaches daemons at different moments).
    pub fn crash_then_repair(&mut self, victim: Rank) {
        self.crash(victim);
        let mut unrepaired = self.live();
        while !unrepaired.is_empty() {
            let i = self.rng.below(unrepaired.len());
            self.repair(unrepaired.swap_remove(i));
            self.step();
        }
    }

    /// The connection between `a` and `b` (both alive) drops: frames queued on it both ways
    /// are lost and each end notices (no daemon failed, no repair). Returns the frames lost.
    pub fn lose_link(&mut self, a: Rank, b: Rank) -> usize {
        let lost = [(a, b), (b, a)].iter().filter_map(|k| self.queues.remove(k)).map(|q| q.len()).sum();
        self.net.unreachable(a, b);
        self.net.unreachable(b, a);
        self.settle();
        lost
    }

    /// No operation in flight on any live daemon.
    pub fn all_quiescent(&self) -> bool {
        self.live().into_iter().all(|r| self.node(r).is_quiescent())
    }

    /// Panics naming every broken driver rule on process-first tags.
    pub fn assert_driver_rules_kept(&self) {
        let v = &self.net.violations;
        assert!(v.is_empty(), "{} violation(s):\n{}", v.len(), v.join("\n"));
    }

    /// Start the fences of each daemon's plan in order, interleaved at random with
    /// deliveries and the [`Links::scheduled_crashes`] (each followed by repairs reaching the
    /// survivors one by one at random moments). In sequential mode a daemon starts its next
    /// fence only after its previous one completed.
    pub fn drive(&mut self, mut plans: Vec<VecDeque<FenceRequest>>, sequential: bool) {
        let mut started: Vec<usize> = self.done.iter().map(Vec::len).collect();
        let mut unrepaired: Vec<Rank> = Vec::new();
        let mut rounds = 0u64;
        loop {
            rounds += 1;
            assert!(rounds < 10_000_000, "drive: no quiescence after {rounds} rounds");
            if let Some(&(at, victim)) = self.scheduled_crashes.first() {
                if self.hops >= at && unrepaired.is_empty() {
                    self.scheduled_crashes.remove(0);
                    self.crash(victim);
                    unrepaired = self.live();
                }
            }
            if !unrepaired.is_empty() && self.rng.below(4) == 0 {
                let i = self.rng.below(unrepaired.len());
                self.repair(unrepaired.swap_remove(i));
                continue;
            }
            let ready: Vec<usize> = (0..plans.len())
                .filter(|&r| !plans[r].is_empty() && self.is_alive(r as Rank))
                .filter(|&r| !sequential || self.done[r].len() == started[r])
                .collect();
            let msgs = self.pending_messages();
            if ready.is_empty() && msgs == 0 {
                if unrepaired.is_empty() && self.scheduled_crashes.is_empty() {
                    return;
                }
                if unrepaired.is_empty() {
                    let (_, victim) = self.scheduled_crashes.remove(0);
                    self.crash(victim);
                    unrepaired = self.live();
                }
                let r = unrepaired.pop().expect("non-empty");
                self.repair(r);
                continue;
            }
            if !ready.is_empty() && (msgs == 0 || self.rng.below(3) == 0) {
                let r = ready[self.rng.below(ready.len())];
                let req = plans[r].pop_front().expect("ready");
                started[r] += 1;
                self.start(r as Rank, req, 0);
            } else {
                self.step();
            }
        }
    }
}

fn per_daemon<T>(n: u32) -> Vec<Vec<T>> {
    (0..n).map(|_| Vec::new()).collect()
}

/// The daemons taking part in fences over `sig` on a DVM of `n`.
pub fn members(sig: &FenceSignature, n: u32) -> Vec<Rank> {
    match &sig.participants {
        Participants::All => (0..n).collect(),
        Participants::Daemons(d) => d.clone(),
    }
}

/// A message's kind, for counters.
pub fn kind(msg: &GrpcommMsg) -> &'static str {
    match &msg.body {
        Some(Body::Relay(_)) => "relay",
        Some(Body::Forward(_)) => "forward",
        Some(Body::Ack(_)) => "ack",
        Some(Body::Done(_)) => "done",
        Some(Body::Contrib(_)) => "contrib",
        Some(Body::Release(_)) => "release",
        Some(Body::Block(_)) => "block",
        Some(Body::Xblock(_)) => "xblock",
        Some(Body::Scatter(_)) => "scatter",
        None => "empty",
    }
}

/// One line describing a message, without payload bytes (for event logs).
pub fn describe(msg: &GrpcommMsg) -> String {
    let key = |s: &Option<dvm_proto::grpcomm::FenceSignature>| {
        s.as_ref().map(|s| String::from_utf8_lossy(&s.key).into_owned()).unwrap_or_default()
    };
    match &msg.body {
        Some(Body::Relay(m)) => format!("Relay{{origin {} id {} tag {}}}", m.origin, m.origin_id, m.tag),
        Some(Body::Forward(m)) => format!(
            "Forward{{op {} origin {} id {} tag {} mv {} chunks {:?} {} bytes}}",
            m.op_id,
            m.origin,
            m.origin_id,
            m.tag,
            m.movement,
            m.chunks.iter().map(|c| c.owner).collect::<Vec<_>>(),
            m.payload.len()
        ),
        Some(Body::Xblock(m)) => format!(
            "XBlock{{op {} step {} first {} from {} {} blocks ready {}}}",
            m.op_id,
            m.step,
            m.first,
            m.sender,
            m.blocks.len(),
            m.ready
        ),
        Some(Body::Ack(m)) => format!("Ack{{held {} ack_id {} request {}}}", m.held, m.ack_id, m.is_request),
        Some(Body::Done(m)) => format!("Done{{id {} op {}}}", m.origin_id, m.op_id),
        Some(Body::Contrib(m)) => format!(
            "Contrib{{key {:?} seq {} mv {} epoch {} count {} entries {:?} status {} {}}}",
            key(&m.sig),
            m.seq,
            m.movement,
            m.topo_epoch,
            m.count,
            m.entries.iter().map(|e| e.daemon).collect::<Vec<_>>(),
            m.status,
            m.error
        ),
        Some(Body::Release(m)) => format!(
            "Release{{key {:?} seq {} status {} {} {} bytes}}",
            key(&m.sig),
            m.seq,
            m.status,
            m.error,
            m.data.len()
        ),
        Some(Body::Scatter(m)) => format!("Scatter{{{}:{} {} slices}}", m.origin, m.scatter_id, m.slices.len()),
        Some(Body::Block(m)) => format!(
            "Block{{key {:?} seq {} mv {} step {} first {} {} blocks}}",
            key(&m.sig),
            m.seq,
            m.movement,
            m.step,
            m.first,
            m.blocks.len()
        ),
        None => "empty".into(),
    }
}
