//! The router: everything a daemon decides about the DVM itself (today's `Core`).
//!
//! Owns: routing of every frame (relay along the tree, or direct before WIREUP), check-in and
//! WIREUP, the incarnation (epoch) check on every frame, loss of a tree neighbour and its
//! report to the HNP, DAEMON_DIED and the repair it causes, eviction of a daemon declared
//! dead that speaks again, the owner of every grpcomm fence and xcast (recorded when the
//! operation starts, never guessed at completion), the collective benchmarks, TERMINATE.
//!
//! Never: jobs, processes or PMIx (the [`crate::Node`] around it has them), a socket or a clock.
//!
//! Invariants: a frame whose origin or last hop is a failed daemon, or whose epoch differs
//! from the one the DVM recorded for its origin, changes nothing; the HNP decides every loss
//! (DAEMON_DIED, processed before it is forwarded) and never on the word of a failed daemon;
//! every deadline grpcomm arms is kept until it passes (all of them, not only the earliest).
//! Traps: a fence that fails because a participant was lost must end its owner's loop at
//! once — restarting the next fence over the live set would pair daemons that have applied
//! DAEMON_DIED with daemons that have not yet, on different signatures.

pub mod bench;
mod calibrate;
mod membership;
mod ops;
pub mod probe;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use bytes::Bytes;
use dvm_grpcomm::{
    tags, BcastMovementMode, Config, FenceError, FenceId, FenceMovementMode, FenceRequest, FenceSignature, Grpcomm,
    XcastId,
};
use dvm_proto::control::{BenchKind, BenchReply};
use dvm_proto::daemon::{daemon_cmd, DaemonCmd, Evicted};
use dvm_proto::grpcomm::GrpcommMsg;
use dvm_proto::rml::{Checkin, Contact, FrameHeader, Tag};
use dvm_proto::{Message, Payload};
pub use dvm_rml::{Rank, Route, Topology};
use tracing::{debug, error, info, warn};

/// xcast tags used by the daemon itself (beyond `grpcomm::tags`).
pub mod dtags {
    pub const TREE_QUERY: u32 = super::tags::USER + 1;
    pub const BENCH: u32 = super::tags::USER + 2;
    pub const BENCH_XCAST: u32 = super::tags::USER + 3;
    /// A PMIx event for ranks on other daemons (`dvm.daemon.PmixEvent`; dvmd delivers it).
    pub const PMIX_EVENT: u32 = super::tags::USER + 4;
    /// The link model the HNP measured (`probe::encode_link`): every daemon prices its fences
    /// with it. Delivered before `Ready`, so before any job's launch.
    pub const LINK_MODEL: u32 = super::tags::USER + 5;
    /// File staging (`dvm.daemon.StageMsg`): segments take scatter-allgather when large and
    /// are never deflated by xcast (their owner decides compression, off the loop).
    pub const STAGE: u32 = super::tags::USER + 6;
}

/// Who asked for a fence: its completion goes back to that owner only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FenceOwner {
    /// A PMIx fence_nb upcall; the key is the shell's.
    Pmix(u64),
    /// The collective benchmark with this id (run inside the core).
    Bench(u64),
    /// A PMI barrier (`crate::pmi`) with this key.
    Pmi(u64),
    /// The node's driver (the simulator's workloads): its end leaves as the node's
    /// `Effect::FenceDone`.
    Driver(u64),
}

/// Who asked for an xcast started on this daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XcastOwner {
    /// The core itself (WIREUP, DAEMON_DIED, TERMINATE).
    Core,
    /// One xcast of the xcast benchmark with this id: its completion times it.
    BenchXcast(u64),
    /// The shell, which wants no completion (job launch and control, tree queries).
    Shell,
    /// A part of the node that wants to know when every live daemon holds it
    /// ([`Effect::XcastHeld`] with this key).
    Keyed(u64),
}

/// Why a daemon's loop ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exit {
    /// Orderly: the DVM was terminated.
    Terminated,
    /// The HNP is gone; this daemon ends too.
    LostHnp(String),
    /// The DVM declared this daemon dead; it must not act any more.
    Evicted(String),
    /// HNP: the boot failed (a daemon's process ended before the DVM was ready, the start-up
    /// deadline passed, or a signal abandoned it); the message names the daemon and host. Set
    /// by the shell, which sees processes and the clock.
    BootFailed(String),
}

/// An input of the core. Every input comes with `now`.
#[derive(Debug)]
pub enum Input {
    /// A frame arrived on the link to `from_peer`.
    Frame { from_peer: Rank, header: FrameHeader, payload: Bytes },
    /// The link to `peer` was lost (connection closed, heartbeat silence, connect gave up).
    PeerLost { peer: Rank, reason: String },
    /// A send toward next hop `peer` failed at once.
    SendFailed { peer: Rank },
    /// Time passed (the shell calls this at [`Core::next_deadline`]).
    Tick,
    /// Daemon side of the boot: report `own` to the HNP.
    CheckIn(Contact),
    /// HNP of a one-daemon DVM: nothing to wait for.
    WireSingle,
    /// Start an xcast.
    Xcast { tag: u32, payload: Bytes },
    /// Start an xcast whose completion is reported ([`Effect::XcastHeld`] with `key`).
    XcastKeyed { tag: u32, payload: Bytes, key: u64 },
    /// Start a scatter (HNP: the launch residuals).
    Scatter { tag: u32, slices: Vec<(Rank, Bytes)> },
    /// Start (or join) a fence for `owner`.
    Fence { owner: FenceOwner, req: FenceRequest },
    /// The owner of this signature no longer wants its fences in flight (its job ended or
    /// failed, a group member died): each fails with `Abandoned` on every daemon holding it.
    AbandonFence(FenceSignature),
    /// The owner of this signature is gone (a job ended).
    ForgetFence(FenceSignature),
    /// Send a daemon command to `dst` along the tree (to self: handled at once).
    Cmd { dst: Rank, body: daemon_cmd::Body },
    /// HNP: terminate the DVM.
    Terminate,
    /// HNP: run a collective benchmark.
    Bench {
        kind: BenchKind,
        count: u64,
        bytes: u64,
        /// Run the fences on this movement instead of the DVM's.
        fence_movement: Option<FenceMovementMode>,
        /// Run the xcasts on this movement instead of the DVM's.
        bcast_movement: Option<BcastMovementMode>,
    },
}

/// An effect of the core, carried out by the shell in the order produced.
#[derive(Debug)]
pub enum Effect {
    /// Put this frame on the link to `next_hop`.
    Transmit { next_hop: Rank, header: FrameHeader, payload: Payload },
    /// The contact table (WIREUP): address of every other daemon.
    SetContacts(Vec<(Rank, SocketAddr)>),
    /// HNP: the WIREUP broadcast is held by every daemon; the DVM is ready.
    Ready,
    /// An xcast the shell handles (job launch and control, tree query, TERMINATE).
    Deliver { tag: u32, payload: Bytes },
    /// This daemon's slice of a scatter.
    ScatterDeliver { tag: u32, data: Bytes },
    /// A daemon command for the shell (jobs, output, PMIx, tree views).
    Cmd { origin: Rank, body: daemon_cmd::Body },
    /// Every live daemon holds the xcast started with [`Input::XcastKeyed`] and this key.
    XcastHeld { key: u64 },
    /// These daemons were declared dead (applied here; HNP: their jobs fail).
    DaemonsFailed { newly: Vec<Rank> },
    /// A fence owned by PMIx hosting finished.
    FenceDone { key: u64, result: Result<Bytes, FenceError> },
    /// A fence the node's driver started finished.
    DriverFenceDone { key: u64, result: Result<Bytes, FenceError> },
    /// A PMI barrier's fence (started with `FenceOwner::Pmi(key)`) ended.
    PmiFenceDone { key: u64, result: Result<Bytes, FenceError> },
    /// HNP: a benchmark finished.
    BenchDone(Result<BenchReply, String>),
    /// HNP: every daemon holds TERMINATE.
    Terminated,
    /// This daemon's loop must end.
    Exit(Exit),
}

/// Fixed inputs of a daemon's core.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    pub me: Rank,
    pub host: String,
    /// This daemon's boot incarnation (non-zero, different on every start).
    pub epoch: u64,
    pub radix: u32,
    pub size: u32,
    pub grpcomm: Config,
}

/// HNP-only state.
#[derive(Debug)]
struct HnpState {
    contacts: BTreeMap<Rank, Contact>,
    /// Each daemon's hardware, taken out of its check-in (WIREUP never carries it).
    hardware: BTreeMap<Rank, std::sync::Arc<crate::jobmap::NodeTopo>>,
    wireup: Option<XcastId>,
    ready: bool,
    terminate: Option<XcastId>,
    bench: Option<bench::HnpBench>,
    next_bench: u64,
    /// Measure the link once ready ([`Core::measure_link`]).
    probe_wanted: bool,
    probe: Option<probe::LinkProbe>,
    /// The broadcast of the measured link model; `Ready` waits for its completion.
    link_xcast: Option<XcastId>,
    /// The fence movements being measured ([`calibrate`]), after the probe.
    calibration: Option<calibrate::Calibration>,
    /// Calibration runs started so far (their benchmark ids carry `bench::CALIBRATION_RUN`).
    next_calibration: u64,
}

/// One daemon's decisions.
#[derive(Debug)]
pub struct Core {
    me: Rank,
    epoch: u64,
    g: Grpcomm,
    seq: u64,
    now: u64,
    contacts_known: bool,
    terminating: bool,
    /// Boot incarnation of every daemon: from check-ins (HNP) and WIREUP (everyone).
    epochs: BTreeMap<Rank, u64>,
    hosts: BTreeMap<Rank, String>,
    hnp: Option<HnpState>,
    /// Every deadline grpcomm asked for and that has not passed yet.
    deadlines: BTreeSet<u64>,
    fence_owners: BTreeMap<FenceId, FenceOwner>,
    xcast_owners: BTreeMap<XcastId, XcastOwner>,
    bench: Option<bench::DaemonBench>,
    /// The last finished benchmark's fence signature, forgotten when the next one starts (not
    /// at once: a participant that finished an allgather may still have to hand its results
    /// to a peer whose blocks were lost with a lateral link).
    bench_done_sig: Option<FenceSignature>,
    /// Failed daemons already told to exit (each once).
    evicted: BTreeSet<Rank>,
    hnp_pid: Option<u32>,
    /// The last grpcomm message encoded: forwards of one op to many children are encoded
    /// once and share their bytes.
    last_encoded: Option<(GrpcommMsg, Payload)>,
    /// HNP: why each daemon was declared lost (for the error text).
    loss_reasons: BTreeMap<Rank, String>,
    out: Vec<Effect>,
    /// The daemon whose grpcomm frame (sent straight to us) is being handled: answers to it
    /// go back on that link.
    answering: Option<Rank>,
    /// Frames dropped by the epoch check (for tests and the simulator).
    pub stale_frames: u64,
}

impl Core {
    /// A daemon's core; `hnp_own` is the HNP's own contact (rank 0 only).
    pub fn new(mut cfg: CoreConfig, hnp_own: Option<Contact>) -> Result<Core, dvm_rml::TopologyError> {
        cfg.grpcomm.bulk_tags.insert(dtags::STAGE);
        cfg.grpcomm.raw_tags.insert(dtags::STAGE);
        let topo = Topology::new(cfg.me, cfg.radix, cfg.size)?;
        let hnp_pid = hnp_own.as_ref().map(|c| c.pid);
        let hnp = hnp_own.map(|mut own| {
            own.epoch = cfg.epoch;
            let mut hardware = BTreeMap::new();
            take_hardware(&mut own, &mut hardware);
            let mut contacts = BTreeMap::new();
            contacts.insert(0, own);
            HnpState {
                contacts,
                hardware,
                wireup: None,
                ready: false,
                terminate: None,
                bench: None,
                next_bench: 1,
                probe_wanted: false,
                probe: None,
                link_xcast: None,
                calibration: None,
                next_calibration: 0,
            }
        });
        let mut epochs = BTreeMap::new();
        epochs.insert(cfg.me, cfg.epoch);
        let mut hosts = BTreeMap::new();
        hosts.insert(cfg.me, cfg.host.clone());
        Ok(Core {
            me: cfg.me,
            epoch: cfg.epoch,
            g: Grpcomm::new(topo, cfg.grpcomm),
            seq: 0,
            now: 0,
            contacts_known: false,
            terminating: false,
            epochs,
            hosts,
            hnp,
            deadlines: BTreeSet::new(),
            fence_owners: BTreeMap::new(),
            xcast_owners: BTreeMap::new(),
            bench: None,
            bench_done_sig: None,
            evicted: BTreeSet::new(),
            hnp_pid,
            last_encoded: None,
            loss_reasons: BTreeMap::new(),
            out: Vec::new(),
            answering: None,
            stale_frames: 0,
        })
    }

    // ------------------------------------------------------------------ accessors

    /// Fences this daemon holds state for (shown in the tree views).
    pub fn fences_in_flight(&self) -> usize {
        self.g.fences_in_flight()
    }

    pub fn topology(&self) -> &Topology {
        self.g.topology()
    }
    pub fn is_ready(&self) -> bool {
        self.hnp.as_ref().is_some_and(|h| h.ready)
    }
    pub fn is_terminating(&self) -> bool {
        self.terminating
    }
    /// HNP: the contacts of every daemon that checked in.
    pub fn contacts(&self) -> Option<&BTreeMap<Rank, Contact>> {
        self.hnp.as_ref().map(|h| &h.contacts)
    }
    /// HNP: the hardware daemon `rank` reported at check-in.
    pub fn hardware_of(&self, rank: Rank) -> Option<std::sync::Arc<crate::jobmap::NodeTopo>> {
        self.hnp.as_ref().and_then(|h| h.hardware.get(&rank).cloned())
    }
    /// Host name of a daemon (from WIREUP or check-in).
    pub fn host_of(&self, rank: Rank) -> String {
        self.hosts.get(&rank).cloned().unwrap_or_else(|| format!("daemon-{rank}"))
    }
    /// The earliest deadline not yet passed: call `step(Input::Tick, now)` at or after it.
    pub fn next_deadline(&self) -> Option<u64> {
        self.deadlines.first().copied()
    }
    /// Fences and xcasts this core still owns (0 once everything it started ended).
    pub fn owned_ops(&self) -> usize {
        self.fence_owners.len() + self.xcast_owners.len()
    }
    /// HNP: why daemon `r` was declared lost.
    pub fn loss_reason(&self, r: Rank) -> Option<&str> {
        self.loss_reasons.get(&r).map(String::as_str)
    }
    /// The HNP's pid (its own, or from WIREUP).
    pub fn hnp_pid(&self) -> Option<u32> {
        self.hnp_pid
    }
    /// This daemon's rank.
    pub fn me(&self) -> Rank {
        self.me
    }
    /// This DVM's identity (the HNP's host and pid), the same on every daemon after WIREUP.
    pub fn dvm_id(&self) -> String {
        format!("{}-{}", self.host_of(0), self.hnp_pid.unwrap_or(0))
    }
    pub fn grpcomm(&self) -> &Grpcomm {
        &self.g
    }
    /// Names of daemons with their host, for error text: "daemon 3 on host n3".
    pub fn describe(&self, ranks: &[Rank]) -> String {
        ranks.iter().map(|&r| format!("daemon {r} on host {}", self.host_of(r))).collect::<Vec<_>>().join(", ")
    }

    /// Take every effect produced so far, in order.
    pub fn drain(&mut self) -> std::vec::Drain<'_, Effect> {
        self.out.drain(..)
    }

    // ------------------------------------------------------------------ the one entry

    /// Feed one input at time `now` (ns, monotonic). Effects accumulate for [`Core::drain`].
    pub fn step(&mut self, input: Input, now: u64) {
        self.now = self.now.max(now);
        self.g.advance(self.now);
        match input {
            Input::Frame { from_peer, header, payload } => self.on_frame(from_peer, header, payload),
            Input::PeerLost { peer, reason } => self.on_peer_lost(peer, reason),
            Input::SendFailed { peer } => {
                if peer == 0 && self.me != 0 {
                    let why = "cannot send to the HNP over the lifeline".to_string();
                    let exit = if self.terminating { Exit::Terminated } else { Exit::LostHnp(why) };
                    self.out.push(Effect::Exit(exit));
                } else if peer < self.g.topology().size() && self.g.topology().is_alive(peer) {
                    self.g.peer_unreachable(peer);
                }
            }
            Input::Tick => {
                let passed: Vec<u64> = self.deadlines.range(..=self.now).copied().collect();
                for d in passed {
                    self.deadlines.remove(&d);
                }
                self.g.tick(self.now);
            }
            Input::CheckIn(own) => {
                let payload = Bytes::from(Checkin { contacts: vec![own] }.encode_to_vec());
                self.transmit_direct(0, Tag::Checkin, payload);
            }
            Input::WireSingle => self.maybe_wireup(),
            Input::Xcast { tag, payload } => {
                let id = self.g.xcast(tag, payload);
                self.xcast_owners.insert(id, XcastOwner::Shell);
            }
            Input::XcastKeyed { tag, payload, key } => {
                let id = self.g.xcast(tag, payload);
                self.xcast_owners.insert(id, XcastOwner::Keyed(key));
            }
            Input::Scatter { tag, slices } => {
                self.g.scatter(tag, slices);
            }
            Input::Fence { owner, req } => self.start_fence(owner, req, None),
            Input::AbandonFence(sig) => {
                let n = self.g.abandon_fences(&sig);
                if n > 0 {
                    info!(fences = n, "fences abandoned by their owner");
                }
            }
            Input::ForgetFence(sig) => {
                self.g.forget_fence_signature(&sig);
            }
            Input::Cmd { dst, body } => self.send_cmd(dst, body),
            Input::Terminate => self.terminate(),
            Input::Bench { kind, count, bytes, fence_movement, bcast_movement } => {
                self.start_bench(kind, count, bytes, fence_movement, bcast_movement, false)
            }
        }
        self.pump();
        self.answering = None;
    }

    // ------------------------------------------------------------------ frames and routing

    fn header(&mut self, dst: Rank, tag: Tag) -> FrameHeader {
        self.seq += 1;
        FrameHeader { origin: self.me, dst, tag: tag as u32, epoch: self.epoch, seq: self.seq }
    }

    /// Straight to `dst` over its own link (check-in, loss reports, eviction).
    fn transmit_direct(&mut self, dst: Rank, tag: Tag, payload: impl Into<Payload>) {
        let header = self.header(dst, tag);
        self.out.push(Effect::Transmit { next_hop: dst, header, payload: payload.into() });
    }

    /// Toward `header.dst`: along the tree once contacts are known, else directly.
    fn route(&mut self, header: FrameHeader, payload: impl Into<Payload>) {
        let dst = header.dst;
        let next = if self.contacts_known {
            match self.g.topology().route_to(dst) {
                Route::Up(n) | Route::Down(n) => n,
                Route::Local => {
                    warn!(dst, "frame for this daemon routed to itself");
                    return;
                }
                Route::Unreachable => {
                    debug!(dst, tag = header.tag, "no route to daemon {dst} (failed): frame dropped");
                    return;
                }
            }
        } else {
            dst
        };
        self.out.push(Effect::Transmit { next_hop: next, header, payload: payload.into() });
    }

    /// A daemon command to `dst`. Reports to the HNP go straight over the lifeline every
    /// daemon keeps to it: a relay that dies would otherwise take the report with it (a
    /// benchmark's end, a proc's exit), and nothing resends daemon commands after a repair.
    fn send_cmd(&mut self, dst: Rank, body: daemon_cmd::Body) {
        if dst == self.me {
            self.on_cmd(self.me, body);
            return;
        }
        let payload = Bytes::from(DaemonCmd { body: Some(body) }.encode_to_vec());
        if dst == 0 {
            self.transmit_direct(0, Tag::DaemonCmd, payload);
            return;
        }
        let header = self.header(dst, Tag::DaemonCmd);
        self.route(header, payload);
    }

    /// The incarnation check every frame passes before it can change anything.
    fn admit(&mut self, from_peer: Rank, h: &FrameHeader, payload: &Bytes) -> bool {
        let topo = self.g.topology();
        let failed_hop = from_peer != self.me && from_peer < topo.size() && !topo.is_alive(from_peer);
        let failed_origin = h.origin < topo.size() && !topo.is_alive(h.origin) && h.origin != self.me;
        if h.tag == Tag::Checkin as u32
            && from_peer == h.origin
            && self.hnp.is_some()
            && own_checkin(from_peer, payload)
        {
            let new_incarnation = self.epochs.get(&from_peer).is_some_and(|&e| e != h.epoch);
            if failed_hop || new_incarnation {
                // A daemon started again after the DVM was wired up: it cannot rejoin, and it
                // must not wait for a WIREUP that never comes.
                self.stale_frames += 1;
                warn!(rank = from_peer, "daemon {from_peer} checked in again (a new incarnation): telling it to exit");
                let reason = format!(
                    "daemon {from_peer} was started again after the DVM was wired up; a daemon cannot rejoin a \
                     running DVM"
                );
                let payload = Bytes::from(
                    DaemonCmd { body: Some(daemon_cmd::Body::Evicted(Evicted { reason })) }.encode_to_vec(),
                );
                self.transmit_direct(from_peer, Tag::DaemonCmd, payload);
                return false;
            }
        }
        if failed_hop || failed_origin {
            self.stale_frames += 1;
            let who = if failed_hop { from_peer } else { h.origin };
            debug!(from_peer, origin = h.origin, tag = h.tag, "frame from daemon {who}, declared dead: dropped");
            if failed_hop && self.evicted.insert(from_peer) {
                warn!(peer = from_peer, "daemon {from_peer} was declared dead but spoke again: telling it to exit");
                let ev = Evicted {
                    reason: format!("daemon {} declared daemon {from_peer} dead; it may not rejoin", self.me),
                };
                let payload = Bytes::from(DaemonCmd { body: Some(daemon_cmd::Body::Evicted(ev)) }.encode_to_vec());
                self.transmit_direct(from_peer, Tag::DaemonCmd, payload);
            }
            return false;
        }
        if let Some(&e) = self.epochs.get(&h.origin) {
            if e != h.epoch {
                self.stale_frames += 1;
                warn!(origin = h.origin, epoch = h.epoch, known = e, "frame from a stale incarnation: dropped");
                return false;
            }
        }
        true
    }

    fn on_frame(&mut self, from_peer: Rank, header: FrameHeader, payload: Bytes) {
        // Eviction is the one message a failed daemon must still accept.
        if header.tag == Tag::DaemonCmd as u32 && header.dst == self.me {
            if let Ok(DaemonCmd { body: Some(daemon_cmd::Body::Evicted(e)) }) = DaemonCmd::decode(payload.clone()) {
                if !self.g.topology().is_alive(header.origin) {
                    return;
                }
                error!(by = header.origin, "this daemon was declared dead: {}", e.reason);
                self.out.push(Effect::Exit(Exit::Evicted(e.reason)));
                return;
            }
        }
        if !self.admit(from_peer, &header, &payload) {
            return;
        }
        if header.dst != self.me {
            self.route(header, payload);
            return;
        }
        match Tag::try_from(header.tag as i32) {
            Ok(Tag::Grpcomm) => match GrpcommMsg::decode(payload) {
                Ok(msg) => {
                    // A neighbour that applied a repair before us (it took us as its child)
                    // is not on our route to it yet: answer on the link it used.
                    self.answering = (from_peer == header.origin).then_some(from_peer);
                    self.g.handle(header.origin, msg)
                }
                Err(e) => warn!(from_peer, origin = header.origin, "undecodable grpcomm message: {e}"),
            },
            Ok(Tag::Checkin) => self.on_checkin(from_peer, header.epoch, payload),
            Ok(Tag::DaemonCmd) => match DaemonCmd::decode(payload) {
                Ok(DaemonCmd { body: Some(b) }) => self.on_cmd(header.origin, b),
                _ => warn!(origin = header.origin, "undecodable daemon command"),
            },
            Ok(Tag::Heartbeat) => {}
            _ => warn!(from_peer, tag = header.tag, "frame with unknown tag dropped"),
        }
    }

    fn on_cmd(&mut self, origin: Rank, body: daemon_cmd::Body) {
        match body {
            daemon_cmd::Body::DaemonLost(l) => self.on_daemon_lost(origin, l),
            daemon_cmd::Body::BenchDone(d) => self.on_bench_done(d),
            daemon_cmd::Body::Ping(p) => self.send_cmd(origin, daemon_cmd::Body::Pong(p)),
            daemon_cmd::Body::Pong(p) if p.seq & probe::PROBE_SEQ_BIT != 0 => self.on_probe_pong(p.seq),
            daemon_cmd::Body::Pong(_) => self.on_pong(),
            daemon_cmd::Body::Evicted(_) => {}
            other => self.out.push(Effect::Cmd { origin, body: other }),
        }
    }
}

#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod tests;

/// Whether a check-in's payload is `rank`'s own contact (a daemon reporting itself).
fn own_checkin(rank: Rank, payload: &Bytes) -> bool {
    Checkin::decode(payload.clone()).is_ok_and(|c| c.contacts.len() == 1 && c.contacts[0].rank == rank)
}

/// Move a contact's hardware summary into `hardware` (validated; a bad one is dropped with a
/// warning, and the node runs its ranks unbound).
fn take_hardware(c: &mut Contact, hardware: &mut BTreeMap<Rank, std::sync::Arc<crate::jobmap::NodeTopo>>) {
    let Some(w) = c.topo.take() else { return };
    match crate::jobmap::NodeTopo::from_wire(&w) {
        Ok(t) => {
            hardware.insert(c.rank, std::sync::Arc::new(t));
        }
        Err(e) => warn!(rank = c.rank, host = %c.host, "hardware summary refused: {e}"),
    }
}
