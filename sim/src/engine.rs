//! The discrete-event engine: N `Grpcomm` daemons on grpcomm's shared test network
//! (`dvm_grpcomm::testnet::Net`: routing hop by hop with each hop's own `Topology::route_to`,
//! lateral links, the daemon's stale-frame and answer-on-the-same-link rules), carried by the
//! timed carrier (`net::Carrier`), with crashes, staggered repairs and timers. One seeded RNG,
//! one event queue (`queue::EventQueue`, ordered by `(time, insertion)`): the same scenario
//! always produces the same trace.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use dvm_grpcomm::testnet::{Event, Frame, Net};
use dvm_grpcomm::{FenceId, FenceRequest, FenceSignature, Rank};
use prost::Message;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::net::Carrier;
use crate::queue::EventQueue;
use crate::scenario::{FenceChain, Scenario};
use crate::trace::{Delivery, FenceCall, ScatterGot, ScatterStart, Trace, XcastStart};

#[derive(Debug)]
enum Kind {
    /// A frame reached the NIC at the far end of its link.
    Arrive {
        frame: Frame,
        sent_at: u64,
    },
    /// The receiver has processed the receive: relay it, or hand it to grpcomm.
    Handle {
        frame: Frame,
    },
    Tick {
        daemon: Rank,
        at: u64,
    },
    Crash {
        daemon: Rank,
        detect_after: u64,
    },
    Detect {
        daemon: Rank,
    },
    Repair {
        daemon: Rank,
        epoch: usize,
    },
    Unreachable {
        daemon: Rank,
        peer: Rank,
    },
    Xcast {
        plan: usize,
    },
    Scatter {
        plan: usize,
    },
    FenceStep {
        daemon: Rank,
        chain: usize,
        step: usize,
    },
}

/// What the engine keeps per daemon beside the network's own state.
struct Node {
    crashed_at: Option<u64>,
    armed: BTreeSet<u64>,
    last_repair_at: u64,
}

/// Hard limits that turn a livelock into a named violation instead of a hung test.
const MAX_EVENTS: u64 = 20_000_000;

pub struct Engine<'s> {
    sc: &'s Scenario,
    /// Pending events; timer ticks are idle.
    q: EventQueue<Kind>,
    net: Net,
    nodes: Vec<Node>,
    rng: StdRng,
    carrier: Carrier,
    failed: BTreeSet<Rank>,
    sig_chain: BTreeMap<FenceSignature, usize>,
    /// `(daemon, chain) -> index in trace.fence_calls` of the fence pending there.
    pending_fence: BTreeMap<(Rank, usize), usize>,
    /// The first payload recorded per op id: an equal one delivered elsewhere is recorded as a
    /// clone of it (a scatter-allgather op is reassembled by each daemon into its own buffer;
    /// 4096 copies of 4 MiB would not fit).
    first_payload: BTreeMap<u64, Bytes>,
    pub trace: Trace,
}

pub use dvm_grpcomm::testnet::describe;

impl<'s> Engine<'s> {
    pub fn new(sc: &'s Scenario) -> Self {
        let mut net = Net::new(sc.n, sc.radix, |_| sc.cfg.clone());
        net.hop_limit = 4 * (sc.height() + 2) + 8;
        let nodes: Vec<Node> =
            (0..sc.n).map(|_| Node { crashed_at: None, armed: BTreeSet::new(), last_repair_at: 0 }).collect();
        let trace = Trace {
            deliveries: vec![Vec::new(); sc.n as usize],
            initial_next_op: (0..sc.n).map(|r| net.node(r).xcast_next_op()).collect(),
            ..Trace::default()
        };
        let sig_chain = sc.chains.iter().enumerate().map(|(i, c)| (c.sig.clone(), i)).collect();
        let mut e = Engine {
            sc,
            q: EventQueue::new(|k| matches!(k, Kind::Tick { .. }), sc.bound_ns, MAX_EVENTS),
            net,
            nodes,
            rng: StdRng::seed_from_u64(sc.seed),
            carrier: Carrier::new(sc.n),
            failed: BTreeSet::new(),
            sig_chain,
            pending_fence: BTreeMap::new(),
            first_payload: BTreeMap::new(),
            trace,
        };
        for (ci, c) in sc.chains.iter().enumerate() {
            for (&daemon, &at) in c.members.iter().zip(&c.first_start) {
                e.q.push(at, Kind::FenceStep { daemon, chain: ci, step: 0 });
            }
        }
        for (i, x) in sc.xcasts.iter().enumerate() {
            e.q.push(x.at, Kind::Xcast { plan: i });
        }
        for (i, s) in sc.scatters.iter().enumerate() {
            e.q.push(s.at, Kind::Scatter { plan: i });
        }
        for c in &sc.crashes {
            assert!(c.rank != 0, "rank 0 (the HNP) cannot crash in a schedule: its loss ends the DVM");
            e.q.push(c.at, Kind::Crash { daemon: c.rank, detect_after: c.detect_after });
        }
        e
    }

    /// Record every event as a line of text (see [`Engine::run_logged`]).
    pub fn with_log(mut self) -> Self {
        self.q.enable_log();
        self
    }

    /// Run until nothing but idle timers is left and every live daemon is quiescent, or
    /// until a hard limit (far past the scenario's bound) is hit.
    pub fn run(self) -> Trace {
        self.run_logged().0
    }

    /// Like [`Engine::run`], also returning the event log (empty unless `with_log`).
    pub fn run_logged(mut self) -> (Trace, Vec<String>) {
        while let Some(kind) = self.q.pop() {
            self.step(kind);
            if self.q.only_idle_left() && self.net.live().into_iter().all(|r| self.net.node(r).is_quiescent()) {
                break;
            }
        }
        let net = &self.net.stats;
        let stats = &mut self.trace.stats;
        (stats.direct, stats.refused, stats.unroutable, stats.looped, stats.stale) =
            (net.direct, net.refused, net.unroutable, net.looped, net.stale);
        self.trace.engine_errors.extend(self.net.violations.iter().cloned());
        self.trace.stats.events = self.q.handled();
        self.trace.engine_errors.extend(self.q.overrun().map(str::to_string));
        self.trace.end_ns = self.q.now();
        let all = 0..self.sc.n;
        self.trace.final_alive = all.clone().map(|r| self.net.is_alive(r)).collect();
        self.trace.final_quiescent = all.clone().map(|r| self.net.node(r).is_quiescent()).collect();
        self.trace.final_next_op = all.map(|r| self.net.node(r).xcast_next_op()).collect();
        let log = self.q.take_log();
        (self.trace, log)
    }

    fn step(&mut self, kind: Kind) {
        match kind {
            Kind::Arrive { frame, sent_at } => {
                if self.nodes[frame.from as usize].crashed_at.is_some_and(|c| c <= sent_at) {
                    return; // still queued on the sender's NIC when it died: never left
                }
                if !self.net.is_alive(frame.to) {
                    self.q.note(|| format!("d{} -> d{} REFUSED (crashed)", frame.from, frame.to));
                    self.net.refuse(frame.from, frame.to);
                    self.settle(frame.from);
                    return;
                }
                let at = self.carrier.handled_at(&self.sc.net, self.q.now(), frame.to);
                self.q.push(at, Kind::Handle { frame });
            }
            Kind::Handle { frame } => {
                let to = frame.to;
                if frame.dst == to && self.net.is_alive(to) {
                    self.q.note(|| format!("d{to} <- d{} {}", frame.origin, describe(&frame.msg)));
                }
                self.net.arrive(frame);
                self.settle(to);
            }
            Kind::Tick { daemon, at } => {
                self.nodes[daemon as usize].armed.remove(&at);
                self.net.tick(daemon, self.q.now());
                self.settle(daemon);
            }
            Kind::Crash { daemon, detect_after } => {
                if self.net.is_alive(daemon) {
                    self.net.crash(daemon);
                    self.nodes[daemon as usize].crashed_at = Some(self.q.now());
                    self.trace.crashes.push((daemon, self.q.now()));
                    self.q.note(|| format!("CRASH d{daemon}"));
                    self.q.push(self.q.now() + detect_after, Kind::Detect { daemon });
                }
            }
            Kind::Detect { daemon } => {
                self.failed.insert(daemon);
                let epoch = self.trace.epochs.len();
                self.trace.epochs.push((self.q.now(), self.failed.clone()));
                for r in self.net.live() {
                    let stagger = self.rng.gen_range(0..=self.sc.repair_stagger_ns);
                    let n = &mut self.nodes[r as usize];
                    let at = (self.q.now() + stagger).max(n.last_repair_at);
                    n.last_repair_at = at;
                    self.q.push(at, Kind::Repair { daemon: r, epoch });
                }
            }
            Kind::Repair { daemon, epoch } => {
                let failed = self.trace.epochs[epoch].1.clone();
                match self.net.repair(daemon, &failed) {
                    None => return,
                    Some(Err(e)) => self
                        .trace
                        .engine_errors
                        .push(format!("daemon {daemon}: topology_changed({failed:?}) failed: {e}")),
                    Some(Ok(delta)) => {
                        self.q.note(|| format!("d{daemon} REPAIR epoch {epoch} failed {failed:?}: {delta:?}"))
                    }
                }
                self.trace.repairs_applied.insert((daemon, epoch), self.q.now());
                self.settle(daemon);
            }
            Kind::Unreachable { daemon, peer } => {
                if self.net.is_alive(daemon) && self.net.node(daemon).topology().is_alive(peer) {
                    self.q.note(|| format!("d{daemon} peer_unreachable({peer})"));
                }
                self.net.unreachable(daemon, peer);
                self.settle(daemon);
            }
            Kind::Xcast { plan } => {
                let p = &self.sc.xcasts[plan];
                let daemon = p.origin;
                if !self.net.is_alive(daemon) {
                    return;
                }
                let id = self.net.xcast(daemon, p.tag, p.payload.clone());
                let tag = p.tag;
                self.q.note(|| format!("d{daemon} XCAST {id:?} tag {tag}"));
                self.trace.xcast_starts.push(XcastStart {
                    daemon,
                    id,
                    tag: p.tag,
                    payload: p.payload.clone(),
                    at: self.q.now(),
                });
                self.settle(daemon);
            }
            Kind::Scatter { plan } => {
                let p = &self.sc.scatters[plan];
                let daemon = p.origin;
                if !self.net.is_alive(daemon) {
                    return;
                }
                let scatter_id = self.net.scatter(daemon, p.tag, p.slices.clone());
                self.trace.scatter_starts.push(ScatterStart {
                    daemon,
                    scatter_id,
                    tag: p.tag,
                    slices: p.slices.clone(),
                    at: self.q.now(),
                });
                self.settle(daemon);
            }
            Kind::FenceStep { daemon, chain, step } => self.fence_step(daemon, chain, step),
        }
    }

    fn fence_step(&mut self, daemon: Rank, chain: usize, step: usize) {
        if !self.net.is_alive(daemon) {
            return;
        }
        let c: &FenceChain = &self.sc.chains[chain];
        let s = &c.steps[step];
        let data = c.contribution(chain, step, daemon);
        // The hint every member derives alike: the chain's contribution size times its members.
        let size_hint = c.contrib_len.map(|l| l as u64 * c.members.len() as u64);
        let req =
            FenceRequest { sig: c.sig.clone(), collect: s.collect, data: data.clone(), timeout: s.timeout, size_hint };
        let id = self.net.fence(daemon, req, self.q.now());
        self.q.note(|| format!("d{daemon} FENCE chain {chain} step {step} seq {}", id.seq));
        self.pending_fence.insert((daemon, chain), self.trace.fence_calls.len());
        self.trace.fence_calls.push(FenceCall {
            daemon,
            chain,
            step,
            id,
            collect: s.collect,
            data,
            at: self.q.now(),
            done: None,
        });
        self.settle(daemon);
    }

    /// Carry out everything the network reported after an input to `daemon`: frames onto
    /// the timed carrier, refusals noticed one latency later, outcomes into the trace.
    fn settle(&mut self, daemon: Rank) {
        while let Some(ev) = self.net.pop_event() {
            self.event(ev);
        }
        if self.net.is_alive(daemon) {
            let sb = self.net.node(daemon).state_bytes();
            let peak = &mut self.trace.stats.peak_state_bytes;
            *peak = (*peak).max(sb);
        }
    }

    fn event(&mut self, ev: Event) {
        match ev {
            Event::Carry(frame) => {
                if frame.hops == 1 && frame.from == frame.origin {
                    let arrow = if frame.via == dvm_grpcomm::Via::Direct { "=>" } else { "->" };
                    self.q.note(|| format!("d{} {arrow} d{} {}", frame.from, frame.dst, describe(&frame.msg)));
                }
                let bytes = frame.msg.encoded_len();
                let now = self.q.now();
                let (start, arrive) = self.carrier.send(&self.sc.net, &mut self.rng, now, frame.from, frame.to, bytes);
                self.trace.stats.messages += 1;
                self.trace.stats.bytes += bytes as u64;
                self.q.push(arrive, Kind::Arrive { frame, sent_at: start });
            }
            Event::Refused { from, to } => {
                self.q.push(self.q.now() + self.sc.net.alpha_ns, Kind::Unreachable { daemon: from, peer: to });
            }
            Event::Deliver { daemon, op_id, origin, tag, payload } => {
                self.q.note(|| format!("d{daemon} DELIVER op {op_id} origin {origin} tag {tag}"));
                let payload = match self.first_payload.get(&op_id) {
                    Some(p) if *p == payload => p.clone(),
                    Some(_) => payload,
                    None => {
                        self.first_payload.insert(op_id, payload.clone());
                        payload
                    }
                };
                self.trace.deliveries[daemon as usize].push(Delivery { op_id, origin, tag, payload, at: self.q.now() });
                // The driver applies a process-first payload at once.
                self.net.confirm(daemon);
            }
            Event::XcastComplete { daemon, id, op_id } => {
                self.q.note(|| format!("d{daemon} XCAST_COMPLETE {id:?} op {op_id}"));
                self.trace.xcast_completes.push((daemon, id, op_id, self.q.now()))
            }
            Event::FenceComplete { daemon, id, result } => {
                self.q.note(|| format!("d{daemon} FENCE_COMPLETE seq {} {result:?}", id.seq));
                self.fence_done(daemon, id, result)
            }
            Event::ScatterDeliver { daemon, origin, scatter_id, tag, data } => {
                self.trace.scatter_got.push(ScatterGot { daemon, origin, scatter_id, tag, data, at: self.q.now() })
            }
            Event::ArmTimer { daemon, at } => {
                if self.nodes[daemon as usize].armed.insert(at) {
                    self.q.push(at, Kind::Tick { daemon, at });
                }
            }
            Event::Dropped { daemon, from, reason } => {
                self.q.note(|| format!("d{daemon} DROPPED from {from}: {reason}"));
                self.trace.dropped.push((daemon, from, reason))
            }
        }
    }

    fn fence_done(&mut self, daemon: Rank, id: FenceId, result: Result<Bytes, dvm_grpcomm::FenceError>) {
        let Some(&chain) = self.sig_chain.get(&id.sig) else {
            self.trace.engine_errors.push(format!("daemon {daemon}: FenceComplete for unknown signature {id:?}"));
            return;
        };
        let Some(idx) = self.pending_fence.remove(&(daemon, chain)) else {
            self.trace.engine_errors.push(format!(
                "daemon {daemon}: FenceComplete for seq {} of chain {chain} with no fence pending (duplicate completion?)",
                id.seq
            ));
            return;
        };
        let call = &mut self.trace.fence_calls[idx];
        if call.id != id {
            self.trace.engine_errors.push(format!(
                "daemon {daemon}: FenceComplete for seq {} of chain {chain} while seq {} (step {}) is pending",
                id.seq, call.id.seq, call.step
            ));
            self.pending_fence.insert((daemon, chain), idx);
            return;
        }
        call.done = Some((self.q.now(), result));
        let next = call.step + 1;
        if next < self.sc.chains[chain].steps.len() {
            let think = self.rng.gen_range(0..=self.sc.think_ns);
            self.q.push(self.q.now() + think, Kind::FenceStep { daemon, chain, step: next });
        }
    }
}
