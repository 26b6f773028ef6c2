//! Fences on the allgather movement (forced, and chosen by `auto`): every geometry and
//! participant count, subsets, back-to-back and pipelined fences, blocks that arrive before
//! their fence started, movement mismatches, timeouts, participants lost mid-exchange, and
//! malformed blocks. Outputs are compared with a naive concatenation in daemon order.

mod fence_support;

use std::collections::VecDeque;

use bytes::Bytes;
use dvm_grpcomm::{
    Config, Effect, FenceError, FenceMovementMode, FenceRequest, FenceSignature, Grpcomm, Participants, Rank, Topology,
    Via,
};
use dvm_proto::grpcomm::{grpcomm_msg::Body, FenceBlock, GrpcommMsg};
use fence_support::{check, members, oracle, request, Net, XorShift};

fn net(n: u32, radix: u32, seed: u64, mode: FenceMovementMode) -> Net {
    Net::with_configs(n, radix, seed, |_| Config { fence_movement: mode, ..Config::default() })
}

fn plans(net: &Net, sigs: &[&FenceSignature], collects: &[bool]) -> Vec<VecDeque<FenceRequest>> {
    (0..net.size())
        .map(|r| {
            let mut q = VecDeque::new();
            for (k, &c) in collects.iter().enumerate() {
                for sig in sigs.iter().filter(|s| s.participants.contains(r)) {
                    q.push_back(request(sig, r, k as u64, c));
                }
            }
            q
        })
        .collect()
}

#[test]
fn every_participant_count_and_subset_matches_the_oracle() {
    let mut rng = XorShift::new(5);
    for radix in [2, 3, 64] {
        for n in 1..=33u32 {
            let subset: Vec<Rank> = (0..n).filter(|_| rng.below(3) != 0).collect();
            let mut sigs = vec![FenceSignature::new("all", Participants::All)];
            if !subset.is_empty() {
                sigs.push(FenceSignature::new("sub", Participants::Daemons(subset)));
            }
            for sig in &sigs {
                for seed in 0..2 {
                    let mut net = net(n, radix, seed, FenceMovementMode::Allgather);
                    let collects = [true, false, true];
                    let p = plans(&net, &[sig], &collects);
                    net.drive(p, true);
                    check(&net, sig, &collects, true);
                    assert!(net.dropped.is_empty(), "n {n} radix {radix}: {:?}", net.dropped);
                    assert!(net.all_quiescent(), "n {n} radix {radix}: state left behind");
                    let p = members(sig, n).len() as u64;
                    assert_eq!(net.direct_sends() > 0, p > 1, "n {n}: lateral sends only when there is a peer");
                }
            }
        }
    }
}

#[test]
fn no_tree_message_moves_a_clean_allgather() {
    for (n, radix) in [(16, 2), (10, 2), (64, 64)] {
        let sig = FenceSignature::new("lat", Participants::All);
        let mut net = net(n, radix, 3, FenceMovementMode::Allgather);
        let p = plans(&net, &[&sig], &[true, true, false, true]);
        net.drive(p, true);
        check(&net, &sig, &[true, true, false, true], true);
        let total = net.hops;
        assert_eq!(total, net.direct_sends(), "n {n}: every message was a lateral block");
        // Recursive doubling sends log2 N messages per daemon per fence; Bruck ceil(log2 N).
        let steps = u64::from(32 - (n - 1).leading_zeros());
        assert_eq!(net.direct_sends(), 4 * u64::from(n) * steps, "n {n}");
    }
}

#[test]
fn thousand_back_to_back_fences_alternating_barrier_and_modex() {
    for mode in [FenceMovementMode::Allgather, FenceMovementMode::Auto] {
        for (n, radix) in [(10, 2), (16, 2), (7, 3), (16, 64)] {
            let sig = FenceSignature::new("loop", Participants::All);
            let collects: Vec<bool> = (0..1000).map(|k| k % 2 == 1).collect();
            let mut net = net(n, radix, 7, mode);
            let p = plans(&net, &[&sig], &collects);
            net.drive(p, true);
            check(&net, &sig, &collects, true);
            assert!(net.all_quiescent());
        }
    }
}

#[test]
fn pipelined_fences_and_concurrent_signatures_stay_apart() {
    for mode in [FenceMovementMode::Allgather, FenceMovementMode::Auto] {
        for (n, radix) in [(16, 2), (30, 3), (64, 64)] {
            let a = FenceSignature::new("a", Participants::All);
            let b = FenceSignature::new("b", Participants::Daemons((0..n).filter(|r| r % 3 != 1).collect()));
            let collects: Vec<bool> = (0..20).map(|k| k % 3 == 0).collect();
            let mut net = net(n, radix, 11, mode);
            let p = plans(&net, &[&a, &b], &collects);
            net.drive(p, false);
            check(&net, &a, &collects, false);
            check(&net, &b, &collects, false);
            assert!(net.all_quiescent());
        }
    }
}

#[test]
fn a_block_for_the_next_fence_waits_until_that_fence_starts() {
    let sig = FenceSignature::new("next", Participants::All);
    let mut net = net(2, 2, 1, FenceMovementMode::Allgather);
    net.start(0, request(&sig, 0, 0, true), 0);
    net.start(1, request(&sig, 1, 0, true), 0);
    net.run();
    assert_eq!(net.done[0].len(), 1);
    assert_eq!(net.done[1].len(), 1);
    // Daemon 0 runs ahead into fence 1; its block reaches daemon 1 first.
    net.start(0, request(&sig, 0, 1, true), 0);
    net.run();
    assert_eq!((net.done[0].len(), net.done[1].len()), (1, 1), "nobody finished fence 1 yet");
    assert!(!net.node(1).is_quiescent(), "daemon 1 holds the early block");
    net.start(1, request(&sig, 1, 1, true), 0);
    assert_eq!(net.done[1][1].1, Ok(oracle(&sig, 2, 1, true)), "completes at its own start");
    net.run();
    assert_eq!(net.done[0][1].1, Ok(oracle(&sig, 2, 1, true)));
    assert!(net.all_quiescent());
}

fn mixed(n: u32, radix: u32, seed: u64, odd: Rank, odd_mode: FenceMovementMode, rest: FenceMovementMode) -> Net {
    Net::with_configs(n, radix, seed, |r| Config {
        fence_movement: if r == odd { odd_mode } else { rest },
        ..Config::default()
    })
}

#[test]
fn movement_mismatch_fails_every_participant_with_one_named_error() {
    use FenceMovementMode::{Allgather, Tree};
    let mut cases = 0;
    for (n, radix, odd) in [(16, 2, 5), (16, 2, 15), (16, 2, 0), (16, 64, 5), (10, 2, 3), (27, 3, 26), (2, 2, 1)] {
        for (odd_mode, rest) in [(Allgather, Tree), (Tree, Allgather)] {
            for seed in 0..4 {
                for collect in [true, false] {
                    let sig = FenceSignature::new("mm", Participants::All);
                    let mut net = mixed(n, radix, seed, odd, odd_mode, rest);
                    let p = plans(&net, &[&sig], &[collect]);
                    net.drive(p, true);
                    let first = net.done[0].first().map(|d| d.1.clone());
                    let Some(Err(FenceError::MovementMismatch { expected, got, daemon })) = first else {
                        panic!("n {n} odd {odd}: daemon 0 got {first:?}");
                    };
                    let tree = if collect { "tree-gather-release" } else { "tree-barrier" };
                    let names = [expected.as_str(), got.as_str()];
                    assert!(names.contains(&"allgather") && names.contains(&tree), "{names:?}");
                    assert!(daemon < n);
                    for r in 0..n {
                        assert_eq!(net.done[r as usize].len(), 1, "n {n} odd {odd}: daemon {r}");
                        assert_eq!(net.done[r as usize][0].1, net.done[0][0].1, "n {n} odd {odd}: daemon {r}");
                    }
                    assert!(net.all_quiescent(), "n {n} odd {odd}");
                    cases += 1;
                }
            }
        }
    }
    assert_eq!(cases, 7 * 2 * 4 * 2);
}

#[test]
fn timeout_fails_every_participant_even_one_that_starts_late() {
    for (n, radix, late) in [(16, 2, 9), (16, 2, 1), (10, 2, 0), (16, 64, 3), (30, 3, 0)] {
        let sig = FenceSignature::new("to", Participants::All);
        let mut net = net(n, radix, 3, FenceMovementMode::Allgather);
        let with_timeout = |r: Rank| FenceRequest { timeout: Some(1_000), ..request(&sig, r, 0, true) };
        for r in (0..n).filter(|&r| r != late) {
            net.start(r, with_timeout(r), 0);
        }
        net.run();
        assert!(net.done.iter().all(Vec::is_empty), "nobody completes without daemon {late}");
        for r in 0..n {
            net.tick(r, 1_000);
        }
        net.run();
        for r in (0..n).filter(|&r| r != late) {
            let got = &net.done[r as usize];
            assert_eq!(got.len(), 1, "n {n}: daemon {r}");
            assert!(matches!(got[0].1, Err(FenceError::Timeout { timeout_ns: 1_000, .. })), "{:?}", got[0].1);
            assert_eq!(got[0].1, net.done[if late == 0 { 1 } else { 0 }][0].1, "one error everywhere");
        }
        net.start(late, with_timeout(late), 0);
        net.run();
        let want = net.done[if late == 0 { 1 } else { 0 }][0].1.clone();
        assert_eq!(net.done[late as usize][0].1, want, "the late starter gets the same error");
        assert!(net.all_quiescent());
    }
}

/// A participant dies at a random point of the exchange: every survivor reports either the
/// oracle's bytes (it held every block before the loss reached it) or LostConnection naming
/// the dead daemon; nobody hangs; a survivor that had not finished always fails.
#[test]
fn participant_crash_mid_exchange_never_hangs() {
    let mut failed_somewhere = 0;
    for seed in 0..200u64 {
        let (n, radix) = [(16, 2), (10, 2), (27, 3), (16, 64)][seed as usize % 4];
        let victim = 1 + (seed as u32 % (n - 1));
        let sig = FenceSignature::new("pc", Participants::All);
        let mut net = net(n, radix, seed, FenceMovementMode::Allgather);
        for r in 0..n {
            net.start(r, request(&sig, r, 0, seed % 3 != 0), 0);
        }
        let budget = net.rng.below(3 * n as usize);
        for _ in 0..budget {
            net.step();
        }
        net.crash_then_repair(victim);
        net.run();
        for r in net.live() {
            let got = &net.done[r as usize];
            assert_eq!(got.len(), 1, "seed {seed}: daemon {r}");
            let lost = Err(FenceError::LostConnection { lost: vec![victim] });
            let ok = got[0].1 == Ok(oracle(&sig, n, 0, seed % 3 != 0)) || got[0].1 == lost;
            assert!(ok, "seed {seed}: daemon {r}: {:?}", got[0].1);
            failed_somewhere += u32::from(got[0].1 == lost);
        }
        assert!(net.all_quiescent(), "seed {seed}");
    }
    assert!(failed_somewhere > 0, "some crash hit a fence in flight");
}

/// Back-to-back fences over the survivors while a non-participant relay dies: the lateral
/// exchange does not notice, every fence completes with the oracle's bytes.
#[test]
fn back_to_back_fences_survive_a_relay_crash() {
    for seed in 0..30u64 {
        let (n, radix, victim) = if seed % 2 == 0 { (16, 2, 1) } else { (30, 3, 2) };
        let parts: Vec<Rank> = (0..n).filter(|&r| r != victim).collect();
        let sig = FenceSignature::new("b2b", Participants::Daemons(parts));
        let collects: Vec<bool> = (0..30).map(|k| (k + seed) % 2 == 0).collect();
        let mut net = net(n, radix, seed, FenceMovementMode::Allgather);
        net.scheduled_crashes = vec![(net.rng.below(30 * n as usize) as u64, victim)];
        let p = plans(&net, &[&sig], &collects);
        net.drive(p, true);
        check(&net, &sig, &collects, true);
        assert!(net.all_quiescent(), "seed {seed}");
    }
}

/// A lateral link drops mid-exchange with blocks queued on it: both ends send those blocks
/// again along the tree, and every participant completes with the oracle's bytes (no repair).
#[test]
fn a_lost_lateral_link_detours_along_the_tree() {
    let mut lost_frames = 0;
    for seed in 0..120u64 {
        let (n, radix) = [(16, 2), (10, 2), (27, 3), (12, 64)][seed as usize % 4];
        let sig = FenceSignature::new("cut", Participants::All);
        let collects = [true, false, true];
        let mut net = net(n, radix, seed, FenceMovementMode::Allgather);
        for r in 0..n {
            net.start(r, request(&sig, r, 0, true), 0);
        }
        for _ in 0..net.rng.below(2 * n as usize) {
            net.step();
        }
        // A lateral link: a pair that is not a tree edge (a tree edge's loss is a repair).
        let (a, b) = loop {
            let a = net.rng.below(n as usize) as Rank;
            let b = (a + 1 + net.rng.below(n as usize - 1) as Rank) % n;
            let t = Topology::new(a, radix, n).unwrap();
            if t.parent() != Some(b) && !t.children().contains(&b) {
                break (a, b);
            }
        };
        lost_frames += net.lose_link(a, b);
        net.run();
        let p: Vec<VecDeque<FenceRequest>> = (0..n)
            .map(|r| collects[1..].iter().enumerate().map(|(k, &c)| request(&sig, r, k as u64 + 1, c)).collect())
            .collect();
        net.drive(p, true);
        check(&net, &sig, &collects, true);
        assert!(net.all_quiescent(), "seed {seed}");
    }
    assert!(lost_frames >= 10, "the loss hit blocks in flight ({lost_frames})");
}

fn block(
    sender: Rank,
    sig: &FenceSignature,
    seq: u64,
    movement: u32,
    step: u32,
    first: u32,
    blocks: Vec<Bytes>,
) -> GrpcommMsg {
    let (all, daemons) = match &sig.participants {
        Participants::All => (true, vec![]),
        Participants::Daemons(d) => (false, d.clone()),
    };
    let sig = Some(dvm_proto::grpcomm::FenceSignature { key: sig.key.clone(), all_daemons: all, daemons });
    GrpcommMsg { body: Some(Body::Block(FenceBlock { sig, seq, movement, step, first, blocks, sender })) }
}

#[test]
fn malformed_blocks_fail_the_fence_by_name_never_panic() {
    let cfg = Config { fence_movement: FenceMovementMode::Allgather, ..Config::default() };
    let sig = FenceSignature::new("h", Participants::Daemons(vec![0, 2, 3]));
    let b = |s: &'static [u8]| Bytes::from_static(s);
    // Not a participant, or from a non-participant: dropped by name, no state.
    let mut g = Grpcomm::new(Topology::new(1, 2, 4).unwrap(), cfg.clone());
    g.handle(0, block(0, &sig, 0, 5, 0, 0, vec![b(b"x")]));
    let mut g0 = Grpcomm::new(Topology::new(0, 2, 4).unwrap(), cfg.clone());
    g0.handle(1, block(1, &sig, 0, 5, 0, 1, vec![b(b"x")]));
    // Far ahead of any fence started here.
    g0.handle(2, block(2, &sig, 5_000, 5, 0, 1, vec![b(b"x")]));
    for g in [&mut g, &mut g0] {
        let fx: Vec<Effect> = g.drain().collect();
        assert!(
            matches!(&fx[..], [Effect::Dropped { .. }, ..]) && fx.iter().all(|e| matches!(e, Effect::Dropped { .. }))
        );
        assert!(g.is_quiescent());
    }
    // Bruck over 3: position 0 (daemon 0) receives from position 1 (daemon 2) at step 0 one
    // block owned by position 1. Each wrong field fails the fence naming the sender.
    let bad = [
        block(2, &sig, 0, 5, 7, 1, vec![b(b"x")]),
        block(2, &sig, 0, 5, 0, 2, vec![b(b"x")]),
        block(2, &sig, 0, 5, 0, 1, vec![]),
        block(2, &sig, 0, 5, 0, 1, vec![b(b"x"), b(b"y"), b(b"z"), b(b"w")]),
    ];
    for msg in bad {
        let mut g = Grpcomm::new(Topology::new(0, 2, 4).unwrap(), cfg.clone());
        g.fence(FenceRequest { sig: sig.clone(), collect: true, data: b(b"me"), timeout: None, size_hint: None }, 0);
        let sends: Vec<Effect> = g.drain().collect();
        assert!(matches!(&sends[..], [Effect::Send { via: Via::Direct, .. }]), "{sends:?}");
        g.handle(2, msg);
        let fx: Vec<Effect> = g.drain().collect();
        assert!(
            matches!(&fx[..], [.., Effect::FenceComplete { result: Err(FenceError::Protocol(m)), .. }] if m.contains("daemon 2")),
            "{fx:?}"
        );
        assert!(g.is_quiescent());
    }
    // A block from a daemon whose wrong sender is a participant: also named.
    let mut g = Grpcomm::new(Topology::new(0, 2, 4).unwrap(), cfg);
    g.fence(FenceRequest { sig: sig.clone(), collect: true, data: b(b"me"), timeout: None, size_hint: None }, 0);
    g.drain().for_each(drop);
    g.handle(3, block(3, &sig, 0, 5, 0, 1, vec![b(b"x")]));
    let fx: Vec<Effect> = g.drain().collect();
    assert!(
        matches!(&fx[..], [.., Effect::FenceComplete { result: Err(FenceError::Protocol(m)), .. }] if m.contains("daemon 3")),
        "{fx:?}"
    );
}

/// A success release (results a new parent pushes after a repair) does not end a running
/// allgather: the daemon still sends the blocks its partners wait for, then finishes on its own.
#[test]
fn a_success_release_does_not_cut_a_running_exchange_short() {
    use dvm_proto::grpcomm::FenceRelease;
    let sig = FenceSignature::new("rel", Participants::All);
    let mut net = net(4, 2, 1, FenceMovementMode::Allgather);
    for r in 0..4 {
        net.start(r, request(&sig, r, 0, true), 0);
    }
    let want = oracle(&sig, 4, 0, true);
    let wire_sig = dvm_proto::grpcomm::FenceSignature { key: sig.key.clone(), all_daemons: true, daemons: vec![] };
    let release = FenceRelease { sig: Some(wire_sig), seq: 0, status: 0, error: String::new(), data: want.clone() };
    net.node_mut(3).handle(1, GrpcommMsg { body: Some(Body::Release(release)) });
    let fx: Vec<Effect> = net.node_mut(3).drain().collect();
    assert!(fx.is_empty(), "ignored: {fx:?}");
    net.run();
    for r in 0..4 {
        assert_eq!(net.done[r as usize], vec![(net.done[r as usize][0].0.clone(), Ok(want.clone()))], "daemon {r}");
    }
    assert!(net.all_quiescent());
}
