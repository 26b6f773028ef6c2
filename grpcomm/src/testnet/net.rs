//! The network half of the test network: N `Grpcomm` daemons and the carrier rules around
//! each (routing hop by hop, lateral links, stale frames, process-first tags). Reports what
//! leaves a daemon as [`Event`]s.
//!
//! Never decides *when* a frame arrives (that is the carrier's: [`super::Links`] or the
//! simulator's), and holds no clock or randomness. Do not break: grpcomm sees a frame's
//! origin, never its relay; the driver-rule checks record violations, they never panic.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;
use dvm_proto::grpcomm::{grpcomm_msg::Body, GrpcommMsg};
use dvm_rml::topology::{Route, TopologyError};

use crate::{Config, Effect, FenceError, FenceId, FenceRequest, Grpcomm, Rank, RepairDelta, Topology, Via, XcastId};

use super::describe::{describe, kind};

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
