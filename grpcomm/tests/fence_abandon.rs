//! Abandoned fences: a participant whose owner no longer wants a fence (its job failed, a group
//! member died) abandons it; every participant and relay retires it, every caller hears
//! `Abandoned`, nothing is left behind, and the next fence over the signature runs as usual.

mod fence_support;

use dvm_grpcomm::{Config, FenceError, FenceMovementMode, FenceSignature, Participants, Rank};
use fence_support::{members, oracle, request, Net, XorShift};

fn net(n: u32, radix: u32, seed: u64, mode: FenceMovementMode) -> Net {
    Net::with_configs(n, radix, seed, |_| Config { fence_movement: mode, ..Config::default() })
}

#[test]
fn an_abandoned_fence_is_retired_everywhere_and_the_next_one_runs() {
    let mut rng = XorShift::new(0xab);
    let mut abandoned_mid_flight = 0;
    for seed in 0..240u64 {
        let mode = [FenceMovementMode::Tree, FenceMovementMode::Allgather, FenceMovementMode::Auto][seed as usize % 3];
        let (n, radix) = [(16, 2), (13, 3), (10, 64), (27, 3)][(seed / 3) as usize % 4];
        let sig = if seed % 2 == 0 {
            FenceSignature::new("ab", Participants::All)
        } else {
            FenceSignature::new("ab", Participants::Daemons((0..n).filter(|r| r % 4 != 1).collect()))
        };
        let who = members(&sig, n);
        let collect = seed % 5 != 0;
        // One participant never starts fence 0 (its rank died); another's owner abandons it.
        let silent = who[rng.below(who.len())];
        let started: Vec<Rank> = who.iter().copied().filter(|&r| r != silent).collect();
        let owner = started[rng.below(started.len())];
        let mut net = net(n, radix, seed, mode);
        for &r in &started {
            net.start(r, request(&sig, r, 0, collect), 0);
        }
        for _ in 0..rng.below(4 * n as usize) {
            net.step();
        }
        abandoned_mid_flight += usize::from(net.pending_messages() > 0);
        let held = net.with(owner, |g| g.abandon_fences(&sig));
        assert!(held > 0, "seed {seed}: the owner's daemon holds the fence it started");
        net.run();
        let what = format!("seed {seed} {mode} n {n} radix {radix} silent {silent} owner {owner}");
        let want = Err(FenceError::Abandoned { daemon: owner });
        for &r in &started {
            let got: Vec<_> = net.done[r as usize].iter().map(|(id, res)| (id.seq, res.clone())).collect();
            assert_eq!(got, [(0, want.clone())], "{what}: daemon {r}");
        }
        assert!(net.done[silent as usize].is_empty(), "{what}");
        assert!(net.all_quiescent(), "{what}: a tracker was left behind");
        // The silent daemon's own fence 0 (its other ranks call it late) fails alike, and
        // fence 1 runs everywhere.
        net.start(silent, request(&sig, silent, 0, collect), 0);
        net.run();
        assert_eq!(net.done[silent as usize].last().map(|d| &d.1), Some(&want), "{what}");
        for &r in &who {
            net.start(r, request(&sig, r, 1, true), 0);
        }
        net.run();
        for &r in &who {
            let last = net.done[r as usize].last().expect("fence 1 completed");
            assert_eq!((last.0.seq, &last.1), (1, &Ok(oracle(&sig, n, 1, true))), "{what}: daemon {r}");
        }
        assert!(net.all_quiescent(), "{what}");
    }
    assert!(abandoned_mid_flight > 100, "only {abandoned_mid_flight} abandons came with messages in flight");
}

#[test]
fn abandoning_what_is_not_held_does_nothing() {
    let sig = FenceSignature::new("none", Participants::All);
    let mut net = net(8, 2, 1, FenceMovementMode::Auto);
    assert_eq!(net.with(3, |g| g.abandon_fences(&sig)), 0);
    net.run();
    assert!(net.done.iter().all(Vec::is_empty));
    for r in 0..8 {
        net.start(r, request(&sig, r, 0, true), 0);
    }
    net.run();
    for r in 0..8 {
        assert_eq!(net.done[r as usize][0].1, Ok(oracle(&sig, 8, 0, true)));
    }
}

/// A job ends while its fence is in flight: its daemons abandon the fence and forget the
/// signature, each as soon as it hears. A contribution sent before its sender heard reaches a
/// daemon that forgot the signature already: it is dropped there, not made a tracker that
/// waits for ever.
#[test]
fn a_contribution_that_reaches_a_daemon_after_it_forgot_the_signature_is_dropped() {
    let mut late = 0;
    for seed in 0..120u64 {
        let mut rng = XorShift::new(seed + 1);
        let (n, radix) = [(7, 2), (16, 2), (13, 3)][seed as usize % 3];
        let sig = FenceSignature::new("job-ends", Participants::All);
        let mut net = net(n, radix, seed, FenceMovementMode::Tree);
        // Fence 0 everywhere, then fence 1 on every daemon but the root, whose job ends.
        for r in 0..n {
            net.start(r, request(&sig, r, 0, false), 0);
        }
        net.run();
        for r in 1..n {
            net.start(r, request(&sig, r, 1, false), 0);
        }
        for _ in 0..rng.below(3 * n as usize) {
            net.step();
        }
        let in_flight = net.pending_messages();
        net.with(0, |g| {
            g.abandon_fences(&sig);
            assert!(g.forget_fence_signature(&sig), "nothing of it is held after the abandon");
        });
        // The job's kill reaches every other daemon a little later: its fence is abandoned
        // there too (if it still holds it) and the signature forgotten.
        let mut ends: Vec<(usize, Rank)> = (1..n).map(|r| (rng.below(4 * n as usize), r)).collect();
        ends.sort_unstable();
        let mut step = 0;
        let mut left = ends.into_iter().peekable();
        loop {
            while let Some(&(at, r)) = left.peek().filter(|e| e.0 <= step) {
                let _ = at;
                left.next();
                net.with(r, |g| {
                    g.abandon_fences(&sig);
                    g.forget_fence_signature(&sig)
                });
            }
            if !net.step() && left.peek().is_none() {
                break;
            }
            step += 1;
        }
        // A daemon that still held a tracker when its job ended forgets once it is released.
        for r in 1..n {
            net.with(r, |g| g.forget_fence_signature(&sig));
        }
        net.run();
        late += usize::from(in_flight > 0);
        let held: Vec<(Rank, usize)> =
            (0..n).map(|r| (r, net.with(r, |g| g.fences_in_flight()))).filter(|h| h.1 > 0).collect();
        let done: Vec<usize> = (0..n).map(|r| net.done[r as usize].len()).collect();
        assert!(net.all_quiescent(), "seed {seed} n {n} radix {radix}: trackers left {held:?}, results {done:?}");
    }
    assert!(late > 20, "only {late} job ends came with contributions in flight");
}
