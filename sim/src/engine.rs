//! The discrete-event engine: N `Grpcomm` instances, the carrier that routes `Effect::Send`
//! hop by hop with each hop's own `Topology::route_to`, crashes, staggered repairs and timers.
//! One seeded RNG, one event queue (`queue::EventQueue`, ordered by `(time, insertion)`): the
//! same scenario always produces the same trace.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use dvm_grpcomm::{Effect, FenceId, FenceRequest, FenceSignature, Grpcomm, Rank, Topology, Via};
use dvm_proto::grpcomm::GrpcommMsg;
use dvm_rml::Route;
use prost::Message;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::net::Carrier;
use crate::queue::EventQueue;
use crate::scenario::{FenceChain, Scenario};
use crate::trace::{Delivery, FenceCall, ScatterGot, ScatterStart, Trace, XcastStart};

#[derive(Debug)]
enum Kind {
    /// A message reached `to`'s NIC (this hop); `dst` is its final destination.
    Arrive {
        from: Rank,
        to: Rank,
        dst: Rank,
        msg: GrpcommMsg,
        hops: u32,
        sent_at: u64,
    },
    /// `to` has processed the receive and hands the message on (or up to grpcomm).
    Handle {
        from: Rank,
        to: Rank,
        dst: Rank,
        msg: GrpcommMsg,
        hops: u32,
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

struct Node {
    g: Grpcomm,
    alive: bool,
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
    nodes: Vec<Node>,
    rng: StdRng,
    carrier: Carrier,
    failed: BTreeSet<Rank>,
    sig_chain: BTreeMap<FenceSignature, usize>,
    /// `(daemon, chain) -> index in trace.fence_calls` of the fence pending there.
    pending_fence: BTreeMap<(Rank, usize), usize>,
    hop_limit: u32,
    /// The first payload recorded per op id: an equal one delivered elsewhere is recorded as a
    /// clone of it (a scatter-allgather op is reassembled by each daemon into its own buffer;
    /// 4096 copies of 4 MiB would not fit).
    first_payload: BTreeMap<u64, Bytes>,
    pub trace: Trace,
}

/// One line describing a message, without payload bytes.
pub fn describe(msg: &GrpcommMsg) -> String {
    use dvm_proto::grpcomm::grpcomm_msg::Body;
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
            "XBlock{{op {} step {} first {} from {} {} blocks}}",
            m.op_id,
            m.step,
            m.first,
            m.sender,
            m.blocks.len()
        ),
        Some(Body::Ack(m)) => format!("Ack{{held {} ack_id {} request {}}}", m.held, m.ack_id, m.is_request),
        Some(Body::Done(m)) => format!("Done{{id {} op {}}}", m.origin_id, m.op_id),
        Some(Body::Contrib(m)) => format!(
            "Contrib{{key {:?} seq {} mv {} epoch {} count {} entries {:?} status {} {}}}",
            m.sig.as_ref().map(|s| String::from_utf8_lossy(&s.key).into_owned()),
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
            m.sig.as_ref().map(|s| String::from_utf8_lossy(&s.key).into_owned()),
            m.seq,
            m.status,
            m.error,
            m.data.len()
        ),
        Some(Body::Scatter(m)) => format!("Scatter{{{}:{} {} slices}}", m.origin, m.scatter_id, m.slices.len()),
        Some(Body::Block(m)) => format!(
            "Block{{key {:?} seq {} mv {} step {} first {} {} blocks}}",
            m.sig.as_ref().map(|s| String::from_utf8_lossy(&s.key).into_owned()),
            m.seq,
            m.movement,
            m.step,
            m.first,
            m.blocks.len()
        ),
        None => "empty".into(),
    }
}

impl<'s> Engine<'s> {
    pub fn new(sc: &'s Scenario) -> Self {
        let nodes: Vec<Node> = (0..sc.n)
            .map(|r| Node {
                g: Grpcomm::new(Topology::new(r, sc.radix, sc.n).expect("scenario geometry is valid"), sc.cfg.clone()),
                alive: true,
                crashed_at: None,
                armed: BTreeSet::new(),
                last_repair_at: 0,
            })
            .collect();
        let trace = Trace {
            deliveries: vec![Vec::new(); sc.n as usize],
            initial_next_op: nodes.iter().map(|n| n.g.xcast_next_op()).collect(),
            ..Trace::default()
        };
        let sig_chain = sc.chains.iter().enumerate().map(|(i, c)| (c.sig.clone(), i)).collect();
        let mut e = Engine {
            sc,
            q: EventQueue::new(|k| matches!(k, Kind::Tick { .. }), sc.bound_ns, MAX_EVENTS),
            nodes,
            rng: StdRng::seed_from_u64(sc.seed),
            carrier: Carrier::new(sc.n),
            failed: BTreeSet::new(),
            sig_chain,
            pending_fence: BTreeMap::new(),
            hop_limit: 4 * (sc.height() + 2) + 8,
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
            if self.q.only_idle_left() && self.nodes.iter().all(|n| !n.alive || n.g.is_quiescent()) {
                break;
            }
        }
        self.trace.stats.events = self.q.handled();
        self.trace.engine_errors.extend(self.q.overrun().map(str::to_string));
        self.trace.end_ns = self.q.now();
        self.trace.final_alive = self.nodes.iter().map(|n| n.alive).collect();
        self.trace.final_quiescent = self.nodes.iter().map(|n| n.g.is_quiescent()).collect();
        self.trace.final_next_op = self.nodes.iter().map(|n| n.g.xcast_next_op()).collect();
        let log = self.q.take_log();
        (self.trace, log)
    }

    fn step(&mut self, kind: Kind) {
        match kind {
            Kind::Arrive { from, to, dst, msg, hops, sent_at } => {
                if self.nodes[from as usize].crashed_at.is_some_and(|c| c <= sent_at) {
                    return; // still queued on the sender's NIC when it died: never left
                }
                if !self.nodes[to as usize].alive {
                    self.refuse(from, to);
                    return;
                }
                let at = self.carrier.handled_at(&self.sc.net, self.q.now(), to);
                self.q.push(at, Kind::Handle { from, to, dst, msg, hops });
            }
            Kind::Handle { from, to, dst, msg, hops } => {
                if !self.nodes[to as usize].alive {
                    return; // in the dead daemon's receive buffer
                }
                if dst == to {
                    self.q.note(|| format!("d{to} <- d{from} {}", describe(&msg)));
                    self.nodes[to as usize].g.handle(from, msg);
                    self.pump(to);
                } else {
                    self.forward(to, dst, msg, hops);
                }
            }
            Kind::Tick { daemon, at } => {
                let n = &mut self.nodes[daemon as usize];
                n.armed.remove(&at);
                if n.alive {
                    n.g.tick(self.q.now());
                    self.pump(daemon);
                }
            }
            Kind::Crash { daemon, detect_after } => {
                let n = &mut self.nodes[daemon as usize];
                if n.alive {
                    n.alive = false;
                    n.crashed_at = Some(self.q.now());
                    self.trace.crashes.push((daemon, self.q.now()));
                    self.q.note(|| format!("CRASH d{daemon}"));
                    self.q.push(self.q.now() + detect_after, Kind::Detect { daemon });
                }
            }
            Kind::Detect { daemon } => {
                self.failed.insert(daemon);
                let epoch = self.trace.epochs.len();
                self.trace.epochs.push((self.q.now(), self.failed.clone()));
                for r in 0..self.sc.n {
                    if !self.nodes[r as usize].alive {
                        continue;
                    }
                    let stagger = self.rng.gen_range(0..=self.sc.repair_stagger_ns);
                    let n = &mut self.nodes[r as usize];
                    let at = (self.q.now() + stagger).max(n.last_repair_at);
                    n.last_repair_at = at;
                    self.q.push(at, Kind::Repair { daemon: r, epoch });
                }
            }
            Kind::Repair { daemon, epoch } => {
                if !self.nodes[daemon as usize].alive {
                    return;
                }
                let failed = self.trace.epochs[epoch].1.clone();
                match self.nodes[daemon as usize].g.topology_changed(&failed) {
                    Err(e) => self
                        .trace
                        .engine_errors
                        .push(format!("daemon {daemon}: topology_changed({failed:?}) failed: {e}")),
                    Ok(delta) => self.q.note(|| format!("d{daemon} REPAIR epoch {epoch} failed {failed:?}: {delta:?}")),
                }
                self.trace.repairs_applied.insert((daemon, epoch), self.q.now());
                self.pump(daemon);
            }
            Kind::Unreachable { daemon, peer } => {
                let n = &mut self.nodes[daemon as usize];
                // A carrier that already applied the repair knows the peer is gone.
                if n.alive && n.g.topology().is_alive(peer) {
                    n.g.peer_unreachable(peer);
                    self.q.note(|| format!("d{daemon} peer_unreachable({peer})"));
                    self.pump(daemon);
                }
            }
            Kind::Xcast { plan } => {
                let p = &self.sc.xcasts[plan];
                let daemon = p.origin;
                if !self.nodes[daemon as usize].alive {
                    return;
                }
                let id = self.nodes[daemon as usize].g.xcast(p.tag, p.payload.clone());
                let tag = p.tag;
                self.q.note(|| format!("d{daemon} XCAST {id:?} tag {tag}"));
                self.trace.xcast_starts.push(XcastStart {
                    daemon,
                    id,
                    tag: p.tag,
                    payload: p.payload.clone(),
                    at: self.q.now(),
                });
                self.pump(daemon);
            }
            Kind::Scatter { plan } => {
                let p = &self.sc.scatters[plan];
                let daemon = p.origin;
                if !self.nodes[daemon as usize].alive {
                    return;
                }
                let scatter_id = self.nodes[daemon as usize].g.scatter(p.tag, p.slices.clone());
                self.trace.scatter_starts.push(ScatterStart {
                    daemon,
                    scatter_id,
                    tag: p.tag,
                    slices: p.slices.clone(),
                    at: self.q.now(),
                });
                self.pump(daemon);
            }
            Kind::FenceStep { daemon, chain, step } => self.fence_step(daemon, chain, step),
        }
    }

    fn fence_step(&mut self, daemon: Rank, chain: usize, step: usize) {
        if !self.nodes[daemon as usize].alive {
            return;
        }
        let c: &FenceChain = &self.sc.chains[chain];
        let s = &c.steps[step];
        let data = c.contribution(chain, step, daemon);
        let req = FenceRequest { sig: c.sig.clone(), collect: s.collect, data: data.clone(), timeout: s.timeout };
        let id = self.nodes[daemon as usize].g.fence(req, self.q.now());
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
        self.pump(daemon);
    }

    /// Carry out every effect `daemon` produced, including those produced while doing so.
    fn pump(&mut self, daemon: Rank) {
        loop {
            let effects: Vec<Effect> = self.nodes[daemon as usize].g.drain().collect();
            if effects.is_empty() {
                break;
            }
            for e in effects {
                self.apply(daemon, e);
            }
        }
        let sb = self.nodes[daemon as usize].g.state_bytes();
        let peak = &mut self.trace.stats.peak_state_bytes;
        *peak = (*peak).max(sb);
    }

    fn apply(&mut self, daemon: Rank, e: Effect) {
        match e {
            Effect::Send { to, msg, via: Via::Tree } => {
                self.q.note(|| format!("d{daemon} -> d{to} {}", describe(&msg)));
                self.forward(daemon, to, msg, 0)
            }
            // A lateral link: one hop straight to the destination, costed like a tree link.
            Effect::Send { to, msg, via: Via::Direct } => {
                self.q.note(|| format!("d{daemon} => d{to} {}", describe(&msg)));
                if to == daemon || to >= self.sc.n {
                    self.trace.engine_errors.push(format!("daemon {daemon}: direct send to {to}"));
                    return;
                }
                self.trace.stats.direct += 1;
                self.transmit(daemon, to, to, msg, 1)
            }
            Effect::Deliver { op_id, origin, tag, payload } => {
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
                if self.sc.cfg.process_first.contains(&tag) {
                    self.nodes[daemon as usize].g.xcast_processed(op_id);
                }
            }
            Effect::XcastComplete { id, op_id } => {
                self.q.note(|| format!("d{daemon} XCAST_COMPLETE {id:?} op {op_id}"));
                self.trace.xcast_completes.push((daemon, id, op_id, self.q.now()))
            }
            Effect::FenceComplete { id, result } => {
                self.q.note(|| format!("d{daemon} FENCE_COMPLETE seq {} {result:?}", id.seq));
                self.fence_done(daemon, id, result)
            }
            Effect::ScatterDeliver { origin, scatter_id, tag, data } => {
                self.trace.scatter_got.push(ScatterGot { daemon, origin, scatter_id, tag, data, at: self.q.now() })
            }
            Effect::ArmTimer { at } => {
                if self.nodes[daemon as usize].armed.insert(at) {
                    self.q.push(at, Kind::Tick { daemon, at });
                }
            }
            Effect::Dropped { from, reason } => {
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

    /// Move `msg` one hop from `at` toward `dst`, or hand it to grpcomm if `at` is `dst`.
    fn forward(&mut self, at: Rank, dst: Rank, msg: GrpcommMsg, hops: u32) {
        match self.nodes[at as usize].g.topology().route_to(dst) {
            Route::Local => self.q.push(self.q.now(), Kind::Handle { from: at, to: at, dst, msg, hops }),
            Route::Unreachable => {
                self.q.note(|| format!("d{at} -> d{dst} UNROUTABLE {}", describe(&msg)));
                self.trace.stats.unroutable += 1
            }
            Route::Up(next) | Route::Down(next) => {
                if hops >= self.hop_limit {
                    self.trace.stats.looped += 1;
                    return;
                }
                self.transmit(at, next, dst, msg, hops + 1);
            }
        }
    }

    fn transmit(&mut self, from: Rank, to: Rank, dst: Rank, msg: GrpcommMsg, hops: u32) {
        if !self.nodes[to as usize].alive {
            self.refuse(from, to);
            return;
        }
        let bytes = msg.encoded_len();
        let (start, arrive) = self.carrier.send(&self.sc.net, &mut self.rng, self.q.now(), from, to, bytes);
        self.trace.stats.messages += 1;
        self.trace.stats.bytes += bytes as u64;
        self.q.push(arrive, Kind::Arrive { from, to, dst, msg, hops, sent_at: start });
    }

    /// A send toward a crashed daemon: dropped, and the sender hears of it like a refused or
    /// reset connection.
    fn refuse(&mut self, from: Rank, to: Rank) {
        self.trace.stats.refused += 1;
        self.q.note(|| format!("d{from} -> d{to} REFUSED (crashed)"));
        if self.nodes[from as usize].alive {
            self.q.push(self.q.now() + self.sc.net.alpha_ns, Kind::Unreachable { daemon: from, peer: to });
        }
    }
}
