//! A tiny in-process network for fence tests: N `Grpcomm` instances, one FIFO queue per
//! directed link, a seeded xorshift choosing which link delivers next. Every tree `Send` must
//! name a tree neighbour of the sender (checked), except allgather blocks on a detour and
//! results handed to a peer after its lateral link was lost, which are relayed hop by hop; a direct `Send` goes straight to its destination over a lateral
//! link of its own. Crashed daemons lose their queues.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;
use dvm_grpcomm::{
    Config, Effect, FenceError, FenceId, FenceRequest, FenceSignature, Grpcomm, Participants, Rank, Topology, Via,
};
use dvm_proto::grpcomm::{grpcomm_msg::Body, GrpcommMsg};

pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> Self {
        XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

pub type Outcome = (FenceId, Result<Bytes, FenceError>);

pub struct Net {
    pub nodes: Vec<Option<Grpcomm>>,
    /// Per directed link: (final destination, message).
    links: BTreeMap<(Rank, Rank), VecDeque<(Rank, GrpcommMsg)>>,
    pub rng: XorShift,
    /// Completed fences per daemon, in completion order.
    pub done: Vec<Vec<Outcome>>,
    pub dropped: Vec<(Rank, Rank, String)>,
    pub timers: Vec<Vec<u64>>,
    pub failed: BTreeSet<Rank>,
    pub delivered: u64,
    /// Sends that went over lateral links.
    pub direct_sends: u64,
    /// `drive` crashes each daemon once this many messages were delivered, then repairs the
    /// survivors one by one at random moments (ascending delivery counts).
    pub scheduled_crashes: Vec<(u64, Rank)>,
}

impl Net {
    pub fn new(n: u32, radix: u32, seed: u64) -> Self {
        Self::with_configs(n, radix, seed, |_| Config::default())
    }

    pub fn with_configs(n: u32, radix: u32, seed: u64, cfg: impl Fn(Rank) -> Config) -> Self {
        let nodes =
            (0..n).map(|r| Some(Grpcomm::new(Topology::new(r, radix, n).expect("valid geometry"), cfg(r)))).collect();
        Net {
            nodes,
            links: BTreeMap::new(),
            rng: XorShift::new(seed),
            done: vec![Vec::new(); n as usize],
            dropped: Vec::new(),
            timers: vec![Vec::new(); n as usize],
            failed: BTreeSet::new(),
            delivered: 0,
            direct_sends: 0,
            scheduled_crashes: Vec::new(),
        }
    }

    pub fn size(&self) -> u32 {
        self.nodes.len() as u32
    }

    pub fn node(&mut self, r: Rank) -> &mut Grpcomm {
        self.nodes[r as usize].as_mut().expect("daemon is alive")
    }

    fn collect(&mut self, r: Rank) {
        let Some(g) = self.nodes[r as usize].as_mut() else { return };
        let topo = g.topology().clone();
        let effects: Vec<Effect> = g.drain().collect();
        for e in effects {
            match e {
                Effect::Send { to, msg, via } => {
                    if via == Via::Direct {
                        self.direct_sends += 1;
                    }
                    let neighbour = topo.parent() == Some(to) || topo.children().contains(&to);
                    let detour = matches!(msg.body, Some(Body::Block(_) | Body::Release(_)));
                    assert!(
                        via == Via::Direct || neighbour || detour,
                        "daemon {r} sent to {to}, not a tree neighbour (parent {:?}, children {:?})",
                        topo.parent(),
                        topo.children()
                    );
                    let hop = if via == Via::Direct || neighbour { Some(to) } else { topo.route_to(to).next_hop() };
                    match hop {
                        Some(hop) if self.nodes[hop as usize].is_some() => {
                            self.links.entry((r, hop)).or_default().push_back((to, msg))
                        }
                        Some(hop) => self.node(r).peer_unreachable(hop),
                        None => {}
                    }
                }
                Effect::FenceComplete { id, result } => self.done[r as usize].push((id, result)),
                Effect::ArmTimer { at } => self.timers[r as usize].push(at),
                Effect::Dropped { from, reason } => self.dropped.push((r, from, reason)),
                other => panic!("unexpected effect from a fence: {other:?}"),
            }
        }
    }

    pub fn start(&mut self, r: Rank, req: FenceRequest, now: u64) -> FenceId {
        let id = self.node(r).fence(req, now);
        self.collect(r);
        id
    }

    pub fn pending_messages(&self) -> usize {
        self.links.values().map(VecDeque::len).sum()
    }

    /// Deliver the head of one randomly chosen non-empty link; false when nothing is queued.
    pub fn step(&mut self) -> bool {
        let busy: Vec<(Rank, Rank)> = self.links.iter().filter(|(_, q)| !q.is_empty()).map(|(&k, _)| k).collect();
        if busy.is_empty() {
            return false;
        }
        let (from, to) = busy[self.rng.below(busy.len())];
        let (dst, msg) = self.links.get_mut(&(from, to)).and_then(VecDeque::pop_front).expect("busy link");
        self.delivered += 1;
        if self.nodes[to as usize].is_none() {
            return true;
        }
        if dst != to {
            // A relay hands it on along its own route.
            let hop = self.node(to).topology().route_to(dst).next_hop();
            match hop {
                Some(hop) if self.nodes[hop as usize].is_some() => {
                    self.links.entry((to, hop)).or_default().push_back((dst, msg))
                }
                _ => {}
            }
            return true;
        }
        self.node(to).handle(from, msg);
        self.collect(to);
        true
    }

    pub fn run(&mut self) {
        let mut steps = 0u64;
        while self.step() {
            steps += 1;
            assert!(steps < 10_000_000, "no quiescence after {steps} deliveries");
        }
    }

    pub fn crash(&mut self, victim: Rank) {
        self.nodes[victim as usize] = None;
        self.failed.insert(victim);
        self.links.retain(|&(a, b), _| a != victim && b != victim);
    }

    /// The connection between `a` and `b` (both alive) drops: frames queued on it both ways
    /// are lost and each end hears `peer_unreachable` (no daemon failed, no repair).
    pub fn lose_link(&mut self, a: Rank, b: Rank) -> usize {
        let lost = [(a, b), (b, a)].iter().filter_map(|k| self.links.remove(k)).map(|q| q.len()).sum();
        self.node(a).peer_unreachable(b);
        self.collect(a);
        self.node(b).peer_unreachable(a);
        self.collect(b);
        lost
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

    pub fn repair(&mut self, r: Rank) {
        let failed = self.failed.clone();
        if let Some(g) = self.nodes[r as usize].as_mut() {
            g.topology_changed(&failed).expect("repair");
        }
        self.collect(r);
    }

    pub fn tick(&mut self, r: Rank, now: u64) {
        if let Some(g) = self.nodes[r as usize].as_mut() {
            g.tick(now);
        }
        self.collect(r);
    }

    pub fn live(&self) -> Vec<Rank> {
        (0..self.size()).filter(|r| self.nodes[*r as usize].is_some()).collect()
    }

    pub fn all_quiescent(&self) -> bool {
        // `state_bytes` also counts xcast's standing per-child bookkeeping, so fence state
        // bytes are checked by the unit tests in fence.rs; here: no op in flight anywhere.
        self.nodes.iter().flatten().all(Grpcomm::is_quiescent)
    }

    /// Start the requests of each daemon in order, interleaved at random with deliveries. In
    /// sequential mode a daemon starts its next fence only after its previous one completed.
    pub fn drive(&mut self, mut plans: Vec<VecDeque<FenceRequest>>, sequential: bool) {
        let mut started: Vec<usize> = self.done.iter().map(Vec::len).collect();
        let mut unrepaired: Vec<Rank> = Vec::new();
        let mut rounds = 0u64;
        loop {
            rounds += 1;
            assert!(rounds < 10_000_000, "drive: no quiescence after {rounds} rounds");
            if let Some(&(at, victim)) = self.scheduled_crashes.first() {
                if self.delivered >= at && unrepaired.is_empty() {
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
                .filter(|&r| !plans[r].is_empty() && self.nodes[r].is_some())
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

pub fn members(sig: &FenceSignature, n: u32) -> Vec<Rank> {
    match &sig.participants {
        Participants::All => (0..n).collect(),
        Participants::Daemons(d) => d.clone(),
    }
}

/// Deterministic per-daemon, per-fence contribution of varying length (sometimes empty).
pub fn data_of(r: Rank, seq: u64) -> Bytes {
    let len = ((r as u64 * 7 + seq * 3) % 11) as usize;
    Bytes::from((0..len).map(|i| (r as u64 + seq + i as u64) as u8).collect::<Vec<u8>>())
}

/// The obviously-correct result: contributions concatenated in daemon rank order.
pub fn oracle(sig: &FenceSignature, n: u32, seq: u64, collect: bool) -> Bytes {
    if !collect {
        return Bytes::new();
    }
    let mut out = Vec::new();
    for r in members(sig, n) {
        out.extend_from_slice(&data_of(r, seq));
    }
    Bytes::from(out)
}

pub fn request(sig: &FenceSignature, r: Rank, seq: u64, collect: bool) -> FenceRequest {
    FenceRequest { sig: sig.clone(), collect, data: data_of(r, seq), timeout: None }
}

/// Every participant completed fences 0..k over `sig` exactly once with the oracle's bytes
/// (in sequence order if `in_order`; pipelined allgather fences may finish out of order, each
/// participant finishing on its own); non-participants completed nothing.
pub fn check(net: &Net, sig: &FenceSignature, collects: &[bool], in_order: bool) {
    let n = net.size();
    let who = members(sig, n);
    for r in 0..n {
        let mut mine: Vec<_> = net.done[r as usize].iter().filter(|(id, _)| id.sig == *sig).collect();
        if !in_order {
            mine.sort_by_key(|(id, _)| id.seq);
        }
        if !who.contains(&r) {
            assert!(mine.is_empty(), "non-participant {r} completed {mine:?}");
            continue;
        }
        assert_eq!(mine.len(), collects.len(), "daemon {r} completed {} of {} fences", mine.len(), collects.len());
        for (k, (id, result)) in mine.iter().enumerate() {
            assert_eq!(id.seq, k as u64, "daemon {r}");
            let want = oracle(sig, n, k as u64, collects[k]);
            assert_eq!(result.as_ref(), Ok(&want), "daemon {r} fence {k}");
        }
    }
}
