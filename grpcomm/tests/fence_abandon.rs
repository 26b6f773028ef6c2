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
