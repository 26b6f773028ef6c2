//! xcast over a small in-memory network: FIFO per link, seeded interleaving across links.
//! (The simulator in `sim` runs the same machines at scale with timing; this is the unit-level
//! check kept next to the code.)

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;
use dvm_grpcomm::{tags, Config, Effect, Grpcomm, Topology, XcastId};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

struct Net {
    nodes: Vec<Grpcomm>,
    dead: BTreeSet<u32>,
    links: BTreeMap<(u32, u32), VecDeque<(u32, dvm_proto::grpcomm::GrpcommMsg)>>,
    delivered: Vec<Vec<(u64, Bytes)>>,
    completed: Vec<Vec<XcastId>>,
    rng: Rng,
}

impl Net {
    fn new(n: u32, radix: u32, seed: u64) -> Self {
        Net {
            nodes: (0..n)
                .map(|r| {
                    Grpcomm::new(
                        Topology::new(r, radix, n).unwrap(),
                        Config { compress_threshold: 64, ..Config::default() },
                    )
                })
                .collect(),
            dead: BTreeSet::new(),
            links: BTreeMap::new(),
            delivered: vec![Vec::new(); n as usize],
            completed: vec![Vec::new(); n as usize],
            rng: Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1),
        }
    }

    fn pump(&mut self, r: u32) {
        let effects: Vec<Effect> = self.nodes[r as usize].drain().collect();
        for e in effects {
            match e {
                Effect::Send { to, msg } => {
                    // Route hop by hop with the sender's own topology.
                    let hop = self.nodes[r as usize].topology().route_to(to).next_hop().unwrap_or(to);
                    if self.dead.contains(&hop) {
                        self.nodes[r as usize].peer_unreachable(hop);
                        self.pump(r);
                    } else {
                        self.links.entry((r, hop)).or_default().push_back(msg_with_dst(msg, to));
                    }
                }
                Effect::Deliver { op_id, tag, payload, .. } => {
                    self.delivered[r as usize].push((op_id, payload));
                    if tag == tags::WIREUP || tag == tags::DAEMON_DIED {
                        self.nodes[r as usize].xcast_processed(op_id);
                        self.pump(r);
                    }
                }
                Effect::XcastComplete { id, .. } => self.completed[r as usize].push(id),
                Effect::Dropped { reason, .. } => panic!("daemon {r} dropped a message: {reason}"),
                _ => {}
            }
        }
    }

    /// Deliver one message from a random non-empty link. Returns false when idle.
    fn step(&mut self) -> bool {
        let live: Vec<(u32, u32)> = self.links.iter().filter(|(_, q)| !q.is_empty()).map(|(k, _)| *k).collect();
        if live.is_empty() {
            return false;
        }
        let (from, to) = live[self.rng.below(live.len() as u64) as usize];
        let (dst, msg) = self.links.get_mut(&(from, to)).unwrap().pop_front().unwrap();
        if self.dead.contains(&to) {
            return true;
        }
        if dst != to {
            // Relay: forward along this hop's route.
            let hop = self.nodes[to as usize].topology().route_to(dst).next_hop().unwrap_or(dst);
            self.links.entry((to, hop)).or_default().push_back((dst, msg));
            return true;
        }
        self.nodes[to as usize].handle(from, msg);
        self.pump(to);
        true
    }

    fn run(&mut self) {
        let mut steps = 0;
        while self.step() {
            steps += 1;
            assert!(steps < 5_000_000, "no quiescence");
        }
    }

    fn crash(&mut self, victim: u32) {
        self.dead.insert(victim);
        let failed = self.dead.clone();
        for r in 0..self.nodes.len() as u32 {
            if !self.dead.contains(&r) {
                self.nodes[r as usize].topology_changed(&failed).unwrap();
                self.pump(r);
            }
        }
    }
}

fn msg_with_dst(msg: dvm_proto::grpcomm::GrpcommMsg, dst: u32) -> (u32, dvm_proto::grpcomm::GrpcommMsg) {
    (dst, msg)
}

fn payload(i: u64, big: bool) -> Bytes {
    let len = if big { 4096 } else { 8 };
    Bytes::from((0..len).map(|k| (i as usize * 31 + k) as u8).collect::<Vec<u8>>())
}

fn check_in_order(net: &Net, expect_ops: u64) {
    let reference = &net.delivered[0];
    assert_eq!(reference.len() as u64, expect_ops);
    for (r, d) in net.delivered.iter().enumerate() {
        if net.dead.contains(&(r as u32)) {
            continue;
        }
        let ids: Vec<u64> = d.iter().map(|(op, _)| *op).collect();
        assert_eq!(ids, (0..expect_ops).collect::<Vec<_>>(), "daemon {r} delivered out of order or twice");
        assert_eq!(d, reference, "daemon {r} delivered different payloads");
        assert!(net.nodes[r].is_quiescent(), "daemon {r} not quiescent");
    }
}

#[test]
fn every_daemon_delivers_every_op_once_in_order() {
    for radix in [2, 3, 64] {
        for n in [1, 2, 7, 16, 65] {
            for seed in 0..6 {
                let mut net = Net::new(n, radix, seed);
                let mut started = Vec::new();
                for i in 0..20u64 {
                    let origin = net.rng.below(n as u64) as u32;
                    let id = net.nodes[origin as usize].xcast(tags::USER, payload(i, i % 5 == 0));
                    started.push(id);
                    net.pump(origin);
                    for _ in 0..net.rng.below(8) {
                        net.step();
                    }
                }
                net.run();
                check_in_order(&net, 20);
                let mut done: Vec<XcastId> = net.completed.iter().flatten().copied().collect();
                done.sort();
                started.sort();
                assert_eq!(done, started, "n={n} radix={radix} seed={seed}: completions");
            }
        }
    }
}

#[test]
fn process_first_tags_wait_for_the_driver() {
    let mut net = Net::new(7, 2, 3);
    net.nodes[3].xcast(tags::WIREUP, Bytes::from_static(b"contacts"));
    net.pump(3);
    net.nodes[5].xcast(tags::USER, Bytes::from_static(b"after"));
    net.pump(5);
    net.run();
    check_in_order(&net, 2);
}

#[test]
fn crash_mid_stream_keeps_survivors_in_order() {
    let mut violations = 0;
    for radix in [2, 3] {
        for n in [7, 16, 40] {
            for seed in 0..150 {
                let mut net = Net::new(n, radix, seed);
                let victim = 1 + net.rng.below(n as u64 - 1) as u32;
                let crash_at = net.rng.below(30);
                // Half the runs lose a second daemon: the victim's parent slot or a child.
                let second = (seed % 2 == 1).then(|| {
                    let t = net.nodes[victim as usize].topology();
                    t.parent().filter(|&p| p != 0).or_else(|| t.children().first().copied())
                });
                let second_at = net.rng.below(30);
                let mut started: Vec<XcastId> = Vec::new();
                for i in 0..30u64 {
                    if i == crash_at {
                        net.crash(victim);
                    }
                    if let Some(Some(v2)) = second {
                        if i == second_at && !net.dead.contains(&v2) {
                            net.crash(v2);
                        }
                    }
                    let mut origin = net.rng.below(n as u64) as u32;
                    if net.dead.contains(&origin) {
                        origin = 0;
                    }
                    started.push(net.nodes[origin as usize].xcast(tags::USER, payload(i, i % 7 == 0)));
                    net.pump(origin);
                    for _ in 0..net.rng.below(12) {
                        net.step();
                    }
                }
                net.run();
                let reference: Vec<u64> = net.delivered[0].iter().map(|(op, _)| *op).collect();
                for r in 0..n {
                    if net.dead.contains(&r) {
                        continue;
                    }
                    let ids: Vec<u64> = net.delivered[r as usize].iter().map(|(op, _)| *op).collect();
                    if ids != reference || !net.nodes[r as usize].is_quiescent() {
                        violations += 1;
                        eprintln!("n={n} radix={radix} seed={seed} victim={victim}: daemon {r} delivered {ids:?}, root {reference:?}, quiescent {}", net.nodes[r as usize].is_quiescent());
                    }
                }
                assert_eq!(reference, (0..reference.len() as u64).collect::<Vec<_>>());
                // Every xcast started by a survivor completed.
                let done: BTreeSet<XcastId> = net.completed.iter().flatten().copied().collect();
                for id in started.iter().filter(|id| !net.dead.contains(&id.origin)) {
                    if !done.contains(id) {
                        violations += 1;
                        eprintln!("n={n} radix={radix} seed={seed} victim={victim}: xcast {id:?} never completed");
                    }
                }
            }
        }
    }
    assert_eq!(violations, 0);
}
