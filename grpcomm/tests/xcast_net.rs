//! xcast on grpcomm's shared test network (`dvm_grpcomm::testnet::Links`: FIFO per link,
//! seeded interleaving across links, process-first confirmations held as steps of their own).
//! The simulator runs the same network at scale with a timed carrier.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use dvm_grpcomm::testnet::{Frame, Links as Net};
use dvm_grpcomm::{tags, BcastMovementMode, Config, LinkModel, XcastId};
use dvm_proto::grpcomm::grpcomm_msg::Body;

/// A link model where every scatter-allgather step is paced (waits for its receiver's
/// ready): latency negligible against any message.
const PACED: LinkModel = LinkModel { alpha_ns: 1.0, beta_ns_per_byte: 1_000.0 };

/// Slow links and quick messages: auto takes the lateral movement for the larger payloads
/// here (a few hundred bytes once compressed) and the tree for 8 bytes.
const SLOW: LinkModel = LinkModel { alpha_ns: 1_000.0, beta_ns_per_byte: 10.0 };

/// Every daemon broadcasts with `mode` over `link`; USER tags are bulk-capable.
fn net_with_link(n: u32, radix: u32, seed: u64, mode: BcastMovementMode, link: LinkModel) -> Net {
    let cfg = Config {
        compress_threshold: 64,
        bcast_movement: mode,
        link,
        bulk_tags: [tags::LAUNCH, tags::USER].into_iter().collect(),
        ..Config::default()
    };
    Net::with_configs(n, radix, seed, |_| cfg.clone())
}

fn net_with(n: u32, radix: u32, seed: u64, mode: BcastMovementMode) -> Net {
    net_with_link(n, radix, seed, mode, SLOW)
}

fn tree_net(n: u32, radix: u32, seed: u64) -> Net {
    net_with(n, radix, seed, BcastMovementMode::Tree)
}

/// Crash `victim`; every survivor repairs at once.
fn crash(net: &mut Net, victim: u32) {
    net.crash(victim);
    net.repair_all();
}

fn payload(i: u64, big: bool) -> Bytes {
    let len = if big { 4096 } else { 8 };
    Bytes::from((0..len).map(|k| (i as usize * 31 + k) as u8).collect::<Vec<u8>>())
}

fn check_in_order(net: &Net, expect_ops: u64) {
    net.assert_driver_rules_kept();
    assert!(net.dropped.is_empty(), "dropped: {:?}", net.dropped);
    let reference = &net.delivered[0];
    assert_eq!(reference.len() as u64, expect_ops);
    for (r, d) in net.delivered.iter().enumerate() {
        if !net.is_alive(r as u32) {
            continue;
        }
        let ids: Vec<u64> = d.iter().map(|(op, _)| *op).collect();
        assert_eq!(ids, (0..expect_ops).collect::<Vec<_>>(), "daemon {r} delivered out of order or twice");
        assert_eq!(d, reference, "daemon {r} delivered different payloads");
        assert!(net.node(r as u32).is_quiescent(), "daemon {r} not quiescent");
    }
}

#[test]
fn every_daemon_delivers_every_op_once_in_order() {
    for mode in BcastMovementMode::ALL {
        every_op_once_in_order(mode, None);
    }
}

/// The same with every scatter-allgather exchange step paced (ready messages in any order).
#[test]
fn paced_scatter_allgather_delivers_every_op_once_in_order() {
    every_op_once_in_order(BcastMovementMode::Bulk, Some(PACED));
}

fn every_op_once_in_order(mode: BcastMovementMode, link: Option<LinkModel>) {
    let mut lateral = 0;
    for radix in [2, 3, 64] {
        for n in [1, 2, 7, 16, 65] {
            for seed in 0..6 {
                let mut net = match link {
                    Some(l) => net_with_link(n, radix, seed, mode, l),
                    None => net_with(n, radix, seed, mode),
                };
                let mut started = Vec::new();
                for i in 0..20u64 {
                    let origin = net.rng.below(n as usize) as u32;
                    let id = net.xcast(origin, tags::USER, payload(i, i % 5 == 0));
                    started.push(id);
                    for _ in 0..net.rng.below(8) {
                        net.step();
                    }
                }
                net.run();
                check_in_order(&net, 20);
                let mut done: Vec<XcastId> = net.completed.iter().flatten().copied().collect();
                done.sort();
                started.sort();
                assert_eq!(done, started, "{mode} n={n} radix={radix} seed={seed}: completions");
                lateral += net.direct_sends();
            }
        }
    }
    // Forced bulk moves over lateral links; the tree never does; auto does for the larger
    // payloads at this link model.
    match mode {
        BcastMovementMode::Tree => assert_eq!(lateral, 0),
        BcastMovementMode::Bulk | BcastMovementMode::Auto => assert!(lateral > 0, "{mode}: no lateral message"),
    }
}

/// A 64 KiB payload on scatter-allgather: each child receives only its subtree's chunks, so
/// no tree link carries the whole payload, and every daemon delivers identical bytes.
#[test]
fn scatter_allgather_sends_each_child_its_subtree_share_only() {
    for (n, radix) in [(16, 64), (16, 2), (13, 3), (64, 4)] {
        let mut net = net_with(n, radix, 5, BcastMovementMode::Bulk);
        net.trace = Some(Vec::new());
        let big: Bytes = (0..65_536u32).map(|i| (i * 7 % 251) as u8).collect::<Vec<u8>>().into();
        // Incompressible enough: deflate leaves most of it.
        net.xcast(0, tags::USER, big.clone());
        net.run();
        check_in_order(&net, 1);
        for d in &net.delivered {
            assert_eq!(d[0].1, big);
        }
        let trace = net.trace.take().unwrap();
        let widest = trace
            .iter()
            .filter_map(|h| match &h.msg.body {
                Some(Body::Forward(f)) => Some(f.chunks.iter().map(|c| c.data.len()).sum::<usize>() + f.payload.len()),
                _ => None,
            })
            .max()
            .unwrap();
        // The root's first child at radix 2 holds half the DVM below it.
        assert!(widest * 2 <= big.len() + 2 * n as usize, "n={n} radix={radix}: a forward carried {widest} bytes");
        assert!(net.direct_sends() > 0);
    }
}

/// A process-first op (WIREUP, DAEMON_DIED) leaves a daemon only after its driver confirmed
/// it, and nothing later is delivered there in between. The harness holds each confirmation
/// as a step of its own, so messages keep arriving while a daemon waits for its driver.
#[test]
fn process_first_tags_wait_for_the_driver() {
    // Directed: the root holds WIREUP unconfirmed; nothing goes down the tree until it
    // confirms, and then it goes to every child.
    let mut net = tree_net(7, 2, 3);
    net.xcast(0, tags::WIREUP, Bytes::from_static(b"contacts"));
    assert_eq!(net.net.unconfirmed(0), Some(0), "the root delivered WIREUP to its driver");
    assert_eq!(net.pending_messages(), 0, "the root sent before its driver confirmed WIREUP: {:?}", net.busy_links());
    net.confirm(0);
    let mut sent_to: Vec<u32> = net.busy_links().into_iter().map(|(_, to)| to).collect();
    sent_to.sort();
    assert_eq!(sent_to, vec![1, 2], "after the confirmation WIREUP goes to each child");
    net.run();
    check_in_order(&net, 1);

    // Seeded: process-first and ordinary tags mixed, from every origin, on a deep tree.
    let mut held = 0;
    for radix in [2, 3] {
        for seed in 0..40 {
            let n = 16;
            let mut net = tree_net(n, radix, seed);
            for i in 0..12u64 {
                let origin = net.rng.below(n as usize) as u32;
                let tag = match net.rng.below(3) {
                    0 => tags::WIREUP,
                    1 => tags::DAEMON_DIED,
                    _ => tags::USER,
                };
                net.xcast(origin, tag, payload(i, false));
                for _ in 0..net.rng.below(6) {
                    net.step();
                }
            }
            net.run();
            check_in_order(&net, 12);
            held += net.held_across_traffic;
        }
    }
    // The window the rule is about was exercised: daemons received traffic while holding an
    // unconfirmed op.
    assert!(held > 100, "only {held} messages arrived while a confirmation was held");
}

/// After a repair a promoted daemon takes its failed parent's slot. It no longer holds an op
/// its new children lack (its own subtree had it, so it let it go); it holds their replay
/// until its new parent replays that op, and passes it on in order. Scenario, radix 2 over 15:
/// daemon 1 (children 3 and 5) received op K, passed it to 3 only and died; 3's subtree
/// acknowledged K to 3. 3 is promoted into slot 1 under the root, with 5 as a new child
/// whose subtree (5, 9, 13) lacks K. Later ops start from inside that subtree.
#[test]
fn a_promoted_daemon_holds_replays_until_its_new_parent_replays_in_order() {
    const K: u64 = 4;
    for seed in 0..30 {
        let mut net = tree_net(15, 2, seed);
        for i in 0..K {
            net.xcast(0, tags::USER, payload(i, false));
        }
        net.run();
        // Op K: 0 -> 1 -> 3 only, then 3's subtree (7, 11) acknowledges it to 3.
        net.xcast(0, tags::USER, payload(K, true));
        net.deliver_hop(0, 1);
        net.deliver_hop(1, 3);
        for (from, to) in [(3, 7), (3, 11), (7, 3), (11, 3)] {
            net.deliver_hop(from, to);
        }
        assert!(net.delivered[3].iter().any(|(op, _)| *op == K));
        assert!(!net.delivered[5].iter().any(|(op, _)| *op == K));
        // 1 dies with the forward to 5 unsent (and 3's ack to it unread).
        // (Its queued frames are dropped as stale by receivers that applied the repair.)
        net.crash(1);
        let failed = net.failed.clone();
        net.trace = Some(Vec::new());
        let mut deltas = BTreeMap::new();
        for r in (0..15).filter(|r| *r != 1) {
            deltas.insert(r, net.with(r, |g| g.topology_changed(&failed)).unwrap());
        }
        let d3 = &deltas[&3];
        assert!(d3.promoted, "daemon 3 takes slot 1");
        assert_eq!(d3.parent_changed, Some((Some(1), Some(0))));
        assert_eq!(d3.children_added, vec![5]);
        // Ops started inside the subtree that lacks K, while the repair settles.
        let mut started = Vec::new();
        for (i, origin) in [5u32, 13, 9].into_iter().enumerate() {
            started.push(net.xcast(origin, tags::USER, payload(K + 1 + i as u64, i == 1)));
            for _ in 0..net.rng.below(5) {
                net.step();
            }
        }
        net.run();

        let total = K + 4;
        let want: Vec<u64> = (0..total).collect();
        let reference = net.delivered[0].clone();
        for r in (0..15u32).filter(|r| *r != 1) {
            let ids: Vec<u64> = net.delivered[r as usize].iter().map(|(op, _)| *op).collect();
            assert_eq!(ids, want, "seed {seed}: daemon {r} delivered out of order, twice or not at all");
            assert_eq!(net.delivered[r as usize], reference, "seed {seed}: daemon {r} payloads");
        }
        for r in (0..15u32).filter(|r| *r != 1) {
            assert!(net.node(r).is_quiescent(), "seed {seed}: daemon {r} not quiescent");
        }
        let done: BTreeSet<XcastId> = net.completed.iter().flatten().copied().collect();
        for id in &started {
            assert!(done.contains(id), "seed {seed}: xcast {id:?} never completed");
        }
        net.assert_driver_rules_kept();

        // Where 5 got K from: its new parent 3, only after 3's new parent (the root) replayed
        // K to it; 3 never sent K to 5 from a copy of its own.
        let trace = net.trace.take().unwrap();
        let is_fwd = |h: &Frame, from: u32, to: u32| {
            h.from == from && h.to == to && matches!(&h.msg.body, Some(Body::Forward(f)) if f.op_id == K)
        };
        let replay_in = trace.iter().position(|h| is_fwd(h, 0, 3)).expect("the root replays K to 3");
        let to_five: Vec<usize> = (0..trace.len()).filter(|&i| is_fwd(&trace[i], 3, 5)).collect();
        assert!(!to_five.is_empty(), "seed {seed}: K never reached 5");
        assert!(to_five[0] > replay_in, "seed {seed}: 3 sent K to 5 before the root replayed it to 3");
        // The replay arrives in op order: the root never hands 3 an op before the ones below
        // it (replays may repeat; the first time each op comes is ascending).
        let mut from_root: Vec<u64> = trace
            .iter()
            .filter(|h| h.from == 0 && h.to == 3)
            .filter_map(|h| match &h.msg.body {
                Some(Body::Forward(f)) => Some(f.op_id),
                _ => None,
            })
            .collect();
        let mut seen = BTreeSet::new();
        from_root.retain(|op| seen.insert(*op));
        assert_eq!(from_root, (K..total).collect::<Vec<_>>(), "seed {seed}: what the root sent 3 after the repair");
    }
}

/// Daemons that can open no lateral link at all still take part: their blocks, and blocks
/// meant for them, go along the tree once the lateral send fails; nothing repairs the tree.
#[test]
fn scatter_allgather_without_lateral_links_detours_along_the_tree() {
    for (n, radix) in [(16, 64), (16, 2), (13, 3)] {
        for seed in 0..10 {
            let mut net = net_with(n, radix, seed, BcastMovementMode::Bulk);
            net.net.no_lateral = [3, n - 1].into_iter().collect();
            for i in 0..10u64 {
                let origin = net.rng.below(n as usize) as u32;
                net.xcast(origin, tags::USER, payload(i, i % 2 == 0));
                for _ in 0..net.rng.below(8) {
                    net.step();
                }
            }
            net.run();
            check_in_order(&net, 10);
            for r in net.live() {
                assert!(net.node(r).topology().failed().is_empty(), "a lateral loss repaired the tree");
            }
        }
    }
}

#[test]
fn crash_mid_stream_keeps_survivors_in_order() {
    for mode in [BcastMovementMode::Tree, BcastMovementMode::Bulk] {
        crash_mid_stream(mode, None);
    }
}

/// Crashes while every scatter-allgather step waits for its receiver's ready: a partner lost
/// before it said it was ready never leaves a survivor waiting (the degrade delivers).
#[test]
fn crash_mid_paced_stream_keeps_survivors_in_order() {
    crash_mid_stream(BcastMovementMode::Bulk, Some(PACED));
}

fn crash_mid_stream(mode: BcastMovementMode, link: Option<LinkModel>) {
    let mut violations = 0;
    for radix in [2, 3] {
        for n in [7, 16, 40] {
            for seed in 0..150 {
                let mut net = match link {
                    Some(l) => net_with_link(n, radix, seed, mode, l),
                    None => net_with(n, radix, seed, mode),
                };
                let victim = 1 + net.rng.below(n as usize - 1) as u32;
                let crash_at = net.rng.below(30) as u64;
                // Half the runs lose a second daemon: the victim's parent slot or a child.
                let second = (seed % 2 == 1).then(|| {
                    let t = net.node(victim).topology();
                    t.parent().filter(|&p| p != 0).or_else(|| t.children().first().copied())
                });
                let second_at = net.rng.below(30) as u64;
                let mut started: Vec<XcastId> = Vec::new();
                for i in 0..30u64 {
                    if i == crash_at {
                        crash(&mut net, victim);
                    }
                    if let Some(Some(v2)) = second {
                        if i == second_at && net.is_alive(v2) {
                            crash(&mut net, v2);
                        }
                    }
                    let mut origin = net.rng.below(n as usize) as u32;
                    if !net.is_alive(origin) {
                        origin = 0;
                    }
                    started.push(net.xcast(origin, tags::USER, payload(i, i % 7 == 0)));
                    for _ in 0..net.rng.below(12) {
                        net.step();
                    }
                }
                net.run();
                net.assert_driver_rules_kept();
                let reference: Vec<u64> = net.delivered[0].iter().map(|(op, _)| *op).collect();
                for r in 0..n {
                    if !net.is_alive(r) {
                        continue;
                    }
                    let ids: Vec<u64> = net.delivered[r as usize].iter().map(|(op, _)| *op).collect();
                    if ids != reference || !net.node(r).is_quiescent() {
                        violations += 1;
                        eprintln!("{mode} n={n} radix={radix} seed={seed} victim={victim}: daemon {r} delivered {ids:?}, root {reference:?}, quiescent {}", net.node(r).is_quiescent());
                    }
                }
                assert_eq!(reference, (0..reference.len() as u64).collect::<Vec<_>>());
                // Every xcast started by a survivor completed.
                let done: BTreeSet<XcastId> = net.completed.iter().flatten().copied().collect();
                for id in started.iter().filter(|id| net.is_alive(id.origin)) {
                    if !done.contains(id) {
                        violations += 1;
                        eprintln!(
                            "{mode} n={n} radix={radix} seed={seed} victim={victim}: xcast {id:?} never completed"
                        );
                    }
                }
            }
        }
    }
    assert_eq!(violations, 0);
}
