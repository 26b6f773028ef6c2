//! grpcomm: the DVM's collectives as pure state machines.
//!
//! Owns: xcast (reliable, totally ordered broadcast with ACK rollup), fence (barrier and
//! modex over a participant set, with a sequence number per set), scatter (per-destination
//! payloads down the tree) and the movement table that decides how each operation travels.
//!
//! Never: reads a clock, opens a socket, spawns a task or imports tokio. Inputs come in
//! through [`Grpcomm`]'s methods (`handle`, `xcast`, `fence`, `scatter`,
//! `topology_changed`, `peer_unreachable`, `tick`); effects go out through
//! [`Grpcomm::drain`]. The same code runs inside `dvmd` (driven by one actor task) and inside
//! `sim` (thousands of instances in one process).
//!
//! Invariants:
//! - `Effect::Send { to, via }` names the final destination and how it travels: `Via::Tree`
//!   is routed hop by hop by the carrier with the same [`Topology`] (tree messages always name
//!   a direct neighbour); `Via::Direct` goes straight to `to` over a lateral link, whose loss
//!   is never a tree loss and never repairs the tree.
//! - Per-operation state is O(radix): per-child slots, never arrays sized by the DVM. The
//!   allgather holds the P blocks it must return anyway (P the participant count), plus the
//!   last finished exchange per signature.
//! - Time is an opaque `u64` (nanoseconds) handed in by the caller.

use std::collections::BTreeSet;

use bytes::Bytes;
use dvm_proto::grpcomm::{grpcomm_msg::Body, GrpcommMsg};
pub use dvm_rml::topology::{Rank, RepairDelta, Topology};

pub mod allgather;
mod compress;
pub mod fence;
pub mod movement;
pub mod scatter;
pub mod testnet;
pub mod xcast;

pub use fence::{FenceError, FenceId, FenceRequest, FenceSignature, Participants};
pub use movement::{
    BcastMovementMode, FenceCosts, FenceMovementMode, FenceShape, LinkModel, Movement, UnknownBcastMovement,
    UnknownMovement,
};
pub use xcast::XcastId;

/// Application tags carried by xcast and scatter.
pub mod tags {
    /// Contact table; changes the child set: processed before forwarding.
    pub const WIREUP: u32 = 1;
    /// A daemon died; changes the tree: processed before forwarding.
    pub const DAEMON_DIED: u32 = 2;
    /// Job launch maps.
    pub const LAUNCH: u32 = 3;
    /// Job launch residuals (scatter).
    pub const LAUNCH_RESIDUALS: u32 = 4;
    /// Job control (kill, signal).
    pub const JOB_CONTROL: u32 = 5;
    /// Orderly shutdown of the DVM.
    pub const TERMINATE: u32 = 6;
    /// First tag free for tests and tools.
    pub const USER: u32 = 100;
}

/// Configuration every daemon of a DVM must hold identically.
#[derive(Debug, Clone)]
pub struct Config {
    /// xcast payloads at or above this many bytes are deflated once at the origin.
    pub compress_threshold: usize,
    /// Tags processed before forwarding (they change the tree or the child set).
    pub process_first: BTreeSet<u32>,
    /// Which movement fences use (every daemon of a DVM must hold the same).
    pub fence_movement: FenceMovementMode,
    /// Which movement broadcasts started here use (the origin stamps its choice on the op).
    pub bcast_movement: BcastMovementMode,
    /// Tags whose broadcasts may take scatter-allgather. Never WIREUP, DAEMON_DIED,
    /// JOB_CONTROL or TERMINATE: they are small, and a tree change or a kill must not wait on
    /// a lateral exchange among the very daemons it concerns.
    pub bulk_tags: BTreeSet<u32>,
    /// Tags whose payloads xcast never deflates (their owner compresses, or not, off the loop).
    pub raw_tags: BTreeSet<u32>,
    /// Link costs for the broadcast choice (see [`LinkModel`]), and for the fence choice
    /// unless `fence_costs` is set.
    pub link: LinkModel,
    /// Per-movement fence costs measured on this DVM (every daemon must hold the same).
    pub fence_costs: Option<FenceCosts>,
    /// A non-root origin re-sends its xcast relay to the root if no Done came after this many
    /// nanoseconds (the root answers duplicates; nothing is delivered twice).
    pub relay_retry_ns: u64,
    /// Bytes of finished bulk exchanges a daemon keeps to re-send blocks to a partner whose
    /// lateral link was lost (at least the last few are always kept). Lowered only by
    /// projections that would not fit in memory otherwise.
    pub keep_finished_bytes: usize,
}

impl Config {
    /// What fences are priced with: the measured per-movement costs, else the link model.
    pub fn fence_costs(&self) -> FenceCosts {
        self.fence_costs.unwrap_or(FenceCosts::uniform(self.link))
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            compress_threshold: 16 * 1024,
            process_first: [tags::WIREUP, tags::DAEMON_DIED].into_iter().collect(),
            fence_movement: FenceMovementMode::default(),
            bcast_movement: BcastMovementMode::default(),
            bulk_tags: [tags::LAUNCH].into_iter().collect(),
            raw_tags: BTreeSet::new(),
            link: LinkModel::default(),
            fence_costs: None,
            relay_retry_ns: 1_000_000_000,
            keep_finished_bytes: xcast::KEEP_FINISHED_BYTES,
        }
    }
}

/// An output of the state machines, to be carried out by the driver.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Send `msg` to daemon `to`, along the tree (routed by the carrier with `route_to`) or
    /// directly (a lateral link).
    Send { to: Rank, msg: GrpcommMsg, via: Via },
    /// An xcast delivered on this daemon, exactly once and in op-id order. For tags in
    /// `Config::process_first` the driver must call [`Grpcomm::xcast_processed`] once it has
    /// applied the payload; later ops wait until then.
    Deliver { op_id: u64, origin: Rank, tag: u32, payload: Bytes },
    /// An xcast started here is held by every live daemon.
    XcastComplete { id: XcastId, op_id: u64 },
    /// A fence this daemon takes part in finished (identical bytes or the same error on every
    /// participant).
    FenceComplete { id: FenceId, result: Result<Bytes, FenceError> },
    /// This daemon's slice of a scatter.
    ScatterDeliver { origin: Rank, scatter_id: u64, tag: u32, data: Bytes },
    /// Call [`Grpcomm::tick`] at or after this time.
    ArmTimer { at: u64 },
    /// A message from the network could not be used; it was dropped.
    Dropped { from: Rank, reason: String },
}

/// How a message travels to its destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Via {
    /// Hop by hop along the routing tree.
    Tree,
    /// Straight to the destination over a lateral link (a connection that is not a tree
    /// edge). Its loss is never read as a lifeline or tree loss and never repairs the tree.
    Direct,
}

/// The shared context handed to each sub-machine for one input.
pub(crate) struct Ctx<'a> {
    pub topo: &'a Topology,
    pub cfg: &'a Config,
    pub out: &'a mut Vec<Effect>,
    pub now: u64,
}

impl Ctx<'_> {
    pub fn send(&mut self, to: Rank, body: Body) {
        self.out.push(Effect::Send { to, msg: GrpcommMsg { body: Some(body) }, via: Via::Tree });
    }

    /// Straight to `to` over a lateral link.
    pub fn send_direct(&mut self, to: Rank, body: Body) {
        self.out.push(Effect::Send { to, msg: GrpcommMsg { body: Some(body) }, via: Via::Direct });
    }
}

/// All collective state of one daemon.
#[derive(Debug)]
pub struct Grpcomm {
    topo: Topology,
    cfg: Config,
    xcast: xcast::XcastState,
    fence: fence::FenceState,
    scatter: scatter::ScatterState,
    out: Vec<Effect>,
    now: u64,
}

impl Grpcomm {
    pub fn new(topo: Topology, cfg: Config) -> Self {
        Grpcomm {
            xcast: xcast::XcastState::new(topo.me()),
            fence: fence::FenceState::new(),
            scatter: scatter::ScatterState::new(),
            topo,
            cfg,
            out: Vec::new(),
            now: 0,
        }
    }

    pub fn topology(&self) -> &Topology {
        &self.topo
    }

    /// Replace the link model broadcasts (and fences without measured costs) are priced
    /// with; every daemon must hold the same (the HNP measures it and broadcasts it).
    pub fn set_link(&mut self, link: LinkModel) {
        self.cfg.link = link;
    }

    /// Replace the per-movement fence costs (every daemon must hold the same).
    pub fn set_fence_costs(&mut self, costs: Option<FenceCosts>) {
        self.cfg.fence_costs = costs;
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    fn split(&mut self) -> (Ctx<'_>, &mut xcast::XcastState, &mut fence::FenceState, &mut scatter::ScatterState) {
        (
            Ctx { topo: &self.topo, cfg: &self.cfg, out: &mut self.out, now: self.now },
            &mut self.xcast,
            &mut self.fence,
            &mut self.scatter,
        )
    }

    /// A grpcomm message arrived from daemon `from` (the neighbour that sent this hop).
    pub fn handle(&mut self, from: Rank, msg: GrpcommMsg) {
        let (mut ctx, x, f, s) = self.split();
        match msg.body {
            Some(Body::Relay(m)) => x.on_relay(&mut ctx, from, m),
            Some(Body::Forward(m)) => x.on_forward(&mut ctx, from, m),
            Some(Body::Ack(m)) => x.on_ack(&mut ctx, from, m),
            Some(Body::Done(m)) => x.on_done(&mut ctx, from, m),
            Some(Body::Contrib(m)) => {
                f.on_contrib(&mut ctx, from, m);
                f.after_input(&mut ctx);
            }
            Some(Body::Release(m)) => {
                f.on_release(&mut ctx, from, m);
                f.after_input(&mut ctx);
            }
            Some(Body::Block(m)) => {
                f.on_block(&mut ctx, from, m);
                f.after_input(&mut ctx);
            }
            Some(Body::Xblock(m)) => x.on_block(&mut ctx, from, m),
            Some(Body::Scatter(m)) => s.on_scatter(&mut ctx, from, m),
            None => ctx.out.push(Effect::Dropped { from, reason: "empty grpcomm message".into() }),
        }
    }

    /// Start an xcast of `payload` to every live daemon.
    pub fn xcast(&mut self, tag: u32, payload: Bytes) -> XcastId {
        let mode = self.cfg.bcast_movement;
        self.xcast_with(tag, payload, mode)
    }

    /// [`Grpcomm::xcast`] with this op's movement chosen by `mode` instead of the configured
    /// one (A/B benchmarks; the choice travels with the op, so only the origin decides).
    pub fn xcast_with(&mut self, tag: u32, payload: Bytes, mode: BcastMovementMode) -> XcastId {
        let (mut ctx, x, _, _) = self.split();
        x.start(&mut ctx, tag, payload, mode)
    }

    /// The driver applied a process-first op (see [`Effect::Deliver`]).
    pub fn xcast_processed(&mut self, op_id: u64) {
        let (mut ctx, x, _, _) = self.split();
        x.processed(&mut ctx, op_id)
    }

    /// Start (or join) a fence. `now` is the current time; the timeout, if any, is relative.
    pub fn fence(&mut self, req: FenceRequest, now: u64) -> FenceId {
        let mode = self.cfg.fence_movement;
        self.fence_with(req, now, mode)
    }

    /// [`Grpcomm::fence`] with the movement chosen by `mode` instead of the configured one.
    /// Every participant must pass the same `mode` for the same fence (a benchmark carries it
    /// in the message that starts it everywhere); a participant that does not fails the
    /// fence by name, never hangs it.
    pub fn fence_with(&mut self, req: FenceRequest, now: u64, mode: FenceMovementMode) -> FenceId {
        self.now = self.now.max(now);
        let (mut ctx, _, f, _) = self.split();
        let id = f.start(&mut ctx, req, mode);
        f.after_input(&mut ctx);
        id
    }

    /// The owner of `sig` abandons its fences in flight (see `FenceState::abandon`): each fails
    /// with [`FenceError::Abandoned`] on every daemon that holds it. Returns how many were
    /// held here.
    pub fn abandon_fences(&mut self, sig: &FenceSignature) -> usize {
        let (mut ctx, _, f, _) = self.split();
        let n = f.abandon(&mut ctx, sig);
        f.after_input(&mut ctx);
        n
    }

    /// Forget a fence signature whose owner (a job) is gone: its sequence counter and the
    /// results kept to answer repairs. False while a fence over it is still in flight.
    pub fn forget_fence_signature(&mut self, sig: &FenceSignature) -> bool {
        self.fence.forget(sig)
    }

    /// Hand each destination daemon its slice; returns the scatter id.
    pub fn scatter(&mut self, tag: u32, slices: Vec<(Rank, Bytes)>) -> u64 {
        let (mut ctx, _, _, s) = self.split();
        s.start(&mut ctx, tag, slices)
    }

    /// The failed set grew (complete set, identical on every daemon, applied in the same
    /// order everywhere).
    pub fn topology_changed(&mut self, failed: &BTreeSet<Rank>) -> Result<RepairDelta, dvm_rml::TopologyError> {
        let delta = self.topo.repair(failed)?;
        if delta.is_empty() {
            return Ok(delta);
        }
        let (mut ctx, x, f, _) = self.split();
        x.topology_changed(&mut ctx, &delta);
        f.topology_changed(&mut ctx, &delta);
        f.after_input(&mut ctx);
        Ok(delta)
    }

    /// A send to `peer` failed (connection refused or lost) before any repair.
    pub fn peer_unreachable(&mut self, peer: Rank) {
        let (mut ctx, x, f, _) = self.split();
        x.peer_unreachable(&mut ctx, peer);
        f.peer_unreachable(&mut ctx, peer);
        f.after_input(&mut ctx);
    }

    /// Time passed; fire expired timeouts.
    pub fn tick(&mut self, now: u64) {
        self.now = self.now.max(now);
        let (mut ctx, x, f, _) = self.split();
        x.tick(&mut ctx);
        f.tick(&mut ctx);
        f.after_input(&mut ctx);
    }

    /// Tell the machines the current time without firing timers (drivers call this before
    /// each input so timestamps they record are current).
    pub fn advance(&mut self, now: u64) {
        self.now = self.now.max(now);
    }

    /// Take every pending effect, in the order produced.
    pub fn drain(&mut self) -> std::vec::Drain<'_, Effect> {
        self.out.drain(..)
    }

    /// Bytes of per-operation state held now (for the simulator's peak-state figure).
    pub fn state_bytes(&self) -> usize {
        self.xcast.state_bytes() + self.fence.state_bytes() + self.scatter.state_bytes()
    }

    /// Bytes of retired fences' results held to answer contributions re-sent after a repair:
    /// at most the last success per signature.
    pub fn held_result_bytes(&self) -> usize {
        self.fence.held_bytes()
    }

    /// No operation in flight: no pending xcast, no tracker, no buffered message.
    pub fn is_quiescent(&self) -> bool {
        self.xcast.is_quiescent() && self.fence.is_quiescent() && self.scatter.is_quiescent()
    }

    /// Fences this daemon holds state for (started, relayed, or waiting for its start).
    pub fn fences_in_flight(&self) -> usize {
        self.fence.in_flight()
    }

    /// Next xcast op id this daemon will deliver (every op below it was delivered or adopted).
    pub fn xcast_next_op(&self) -> u64 {
        self.xcast.next_deliver()
    }
}
