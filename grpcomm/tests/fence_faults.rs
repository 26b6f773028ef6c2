//! Fences under faults: movement mismatch, timeout, a lost participant, and a crash of a relay
//! at every point of a fence. Every participant must end with the same outcome; nothing hangs
//! and no tracker is left behind.

mod fence_support;

use std::collections::VecDeque;

use dvm_grpcomm::{FenceError, FenceRequest, FenceSignature, Participants, Rank};
use fence_support::{members, oracle, request, Net};

#[test]
fn movement_mismatch_fails_every_participant_with_the_named_error() {
    // Odd daemons: leaves, relays with big subtrees, and the root.
    for (n, radix, odd) in [(16, 2, 5), (16, 2, 15), (16, 2, 0), (16, 64, 5), (64, 3, 4), (64, 3, 63), (7, 2, 1)] {
        for seed in 0..5 {
            let sig = FenceSignature::new("mm", Participants::All);
            // The odd daemon's collect flag differs (a rank-varying input): it runs the barrier.
            let mut net = Net::new(n, radix, seed);
            let plans = (0..n).map(|r| VecDeque::from([request(&sig, r, 0, r != odd)])).collect();
            net.drive(plans, true);
            let want = FenceError::MovementMismatch {
                expected: "tree-gather-release".into(),
                got: "tree-barrier".into(),
                daemon: odd,
            };
            for r in 0..n {
                assert_eq!(net.done[r as usize].len(), 1, "n {n} radix {radix} odd {odd}: daemon {r}");
                assert_eq!(net.done[r as usize][0].1, Err(want.clone()), "n {n} radix {radix}: daemon {r}");
            }
            assert!(net.all_quiescent());
        }
    }
}

#[test]
fn timeout_fails_every_participant_even_one_that_starts_late() {
    for (n, radix, late) in [(16, 2, 9), (16, 2, 1), (16, 64, 3), (30, 3, 0)] {
        let sig = FenceSignature::new("to", Participants::All);
        let mut net = Net::new(n, radix, 3);
        let with_timeout = |r: Rank| FenceRequest { timeout: Some(1_000), ..request(&sig, r, 0, true) };
        for r in (0..n).filter(|&r| r != late) {
            net.start(r, with_timeout(r), 0);
            assert_eq!(net.timers[r as usize], vec![1_000]);
        }
        net.run();
        assert!(net.done.iter().all(Vec::is_empty), "nobody completes without daemon {late}");
        for r in 0..n {
            net.tick(r, 999);
        }
        net.run();
        assert!(net.done.iter().all(Vec::is_empty), "not yet expired");
        for r in 0..n {
            net.tick(r, 1_000);
        }
        net.run();
        let first = net.done[if late == 0 { 1 } else { 0 }][0].1.clone();
        assert!(matches!(first, Err(FenceError::Timeout { timeout_ns: 1_000, .. })), "{first:?}");
        for r in (0..n).filter(|&r| r != late) {
            assert_eq!(net.done[r as usize].len(), 1);
            assert_eq!(net.done[r as usize][0].1, first, "daemon {r}");
        }
        // The late daemon fails at once with the same error, and the next fence works.
        net.start(late, with_timeout(late), 2_000);
        assert_eq!(net.done[late as usize][0].1, first);
        assert!(net.all_quiescent());
        let plans = (0..n).map(|r| VecDeque::from([request(&sig, r, 1, true)])).collect();
        net.drive(plans, true);
        for r in 0..n {
            assert_eq!(net.done[r as usize][1].1, Ok(oracle(&sig, n, 1, true)));
        }
    }
}

#[test]
fn lost_participant_fails_fence_everywhere_and_survivors_fence_on() {
    for (n, radix, victim) in [(16, 2, 5), (16, 2, 1), (16, 3, 4), (64, 64, 9)] {
        for seed in 0..5 {
            let all = FenceSignature::new("all", Participants::All);
            let mut net = Net::new(n, radix, seed);
            let late: Rank = n - 1;
            for r in (0..n).filter(|&r| r != late && r != victim) {
                net.start(r, request(&all, r, 0, true), 0);
            }
            for _ in 0..seed * 3 {
                net.step();
            }
            net.crash(victim);
            let mut order = net.live();
            for i in (1..order.len()).rev() {
                let j = net.rng.below(i + 1);
                order.swap(i, j);
            }
            for r in order {
                net.repair(r);
                for _ in 0..net.rng.below(4) {
                    net.step();
                }
            }
            net.run();
            let lost = Err(FenceError::LostConnection { lost: vec![victim] });
            for r in net.live().into_iter().filter(|&r| r != late) {
                assert_eq!(net.done[r as usize].len(), 1, "daemon {r}");
                assert_eq!(net.done[r as usize][0].1, lost, "daemon {r}");
            }
            net.start(late, request(&all, late, 0, true), 0);
            assert_eq!(net.done[late as usize][0].1, lost);
            assert!(net.all_quiescent());

            // A fence over the survivors completes with the oracle's bytes.
            let survivors = FenceSignature::new("survivors", Participants::Daemons(net.live()));
            let plans = (0..n).map(|r| VecDeque::from([request(&survivors, r, 0, true)])).collect();
            net.drive(plans, true);
            for r in net.live() {
                let last = net.done[r as usize].last().unwrap();
                assert_eq!(last.0.sig, survivors);
                assert_eq!(last.1, Ok(oracle(&survivors, n, 0, true)), "daemon {r}");
            }
            assert!(net.all_quiescent());
        }
    }
}

/// A relay that is not a participant dies at a random point of a fence (possibly while the
/// release is under way); survivors repair at random moments. The fence lost nobody, so every
/// participant must complete it exactly once with the oracle's bytes.
#[test]
fn fence_that_lost_nobody_reconverges_after_a_relay_crash() {
    let mut cases = 0;
    for (n, radix, victims) in [(16, 2, vec![1, 2, 3, 6]), (30, 3, vec![1, 2, 4]), (64, 2, vec![1, 3, 5])] {
        for victim in victims {
            for seed in 0..60u64 {
                let parts: Vec<Rank> =
                    (0..n).filter(|&r| r != victim && !(r + seed as u32).is_multiple_of(4)).collect();
                let sig = FenceSignature::new("rc", Participants::Daemons(parts.clone()));
                let collect = seed % 2 == 0;
                let mut net = Net::new(n, radix, seed);
                let mut plans: Vec<VecDeque<FenceRequest>> = (0..n)
                    .map(|r| {
                        if parts.contains(&r) {
                            VecDeque::from([request(&sig, r, 0, collect)])
                        } else {
                            VecDeque::new()
                        }
                    })
                    .collect();
                // Start everyone, deliver a random prefix of the traffic, then crash.
                for r in &parts {
                    let req = plans[*r as usize].pop_front().unwrap();
                    net.start(*r, req, 0);
                }
                let budget = net.rng.below(8 * n as usize);
                for _ in 0..budget {
                    net.step();
                }
                net.crash(victim);
                let mut unrepaired = net.live();
                while !unrepaired.is_empty() {
                    let i = net.rng.below(unrepaired.len());
                    net.repair(unrepaired.swap_remove(i));
                    for _ in 0..net.rng.below(6) {
                        net.step();
                    }
                }
                net.run();
                for &r in &parts {
                    let got = &net.done[r as usize];
                    assert_eq!(got.len(), 1, "n {n} radix {radix} victim {victim} seed {seed}: daemon {r} {got:?}");
                    assert_eq!(got[0].1, Ok(oracle(&sig, n, 0, collect)), "seed {seed}: daemon {r}");
                }
                assert!(net.all_quiescent(), "n {n} radix {radix} victim {victim} seed {seed}: state left");
                assert!(net.dropped.is_empty(), "seed {seed}: {:?}", net.dropped);
                cases += 1;
            }
        }
    }
    assert!(cases > 500);
}

/// A participant dies at a random point: every survivor reports either the result (the fence
/// finished before the crash reached it) or LostConnection naming the dead daemon; nobody hangs.
#[test]
fn participant_crash_at_any_point_never_hangs() {
    for seed in 0..100u64 {
        let (n, radix) = if seed % 2 == 0 { (16, 2) } else { (27, 3) };
        let victim = 1 + (seed as u32 % (n - 1));
        let sig = FenceSignature::new("pc", Participants::All);
        let mut net = Net::new(n, radix, seed);
        for r in 0..n {
            net.start(r, request(&sig, r, 0, true), 0);
        }
        let budget = net.rng.below(4 * n as usize);
        for _ in 0..budget {
            net.step();
        }
        net.crash_then_repair(victim);
        net.run();
        for r in net.live() {
            let got = &net.done[r as usize];
            assert_eq!(got.len(), 1, "seed {seed}: daemon {r}");
            let ok = got[0].1 == Ok(oracle(&sig, n, 0, true))
                || got[0].1 == Err(FenceError::LostConnection { lost: vec![victim] });
            assert!(ok, "seed {seed}: daemon {r}: {:?}", got[0].1);
        }
        assert!(net.all_quiescent(), "seed {seed}");
        let _ = members(&sig, n);
    }
}

/// Back-to-back fences over one set while a non-participant relay dies somewhere in the run:
/// every participant still completes every fence, in order, with the oracle's bytes.
#[test]
fn back_to_back_fences_survive_a_relay_crash() {
    for seed in 0..40u64 {
        let (n, radix, victim) = if seed % 2 == 0 { (16, 2, 1) } else { (30, 3, 2) };
        let parts: Vec<Rank> = (0..n).filter(|&r| r != victim).collect();
        let sig = FenceSignature::new("b2b", Participants::Daemons(parts.clone()));
        let collects: Vec<bool> = (0..30).map(|k| (k + seed) % 2 == 0).collect();
        let mut net = Net::new(n, radix, seed);
        net.scheduled_crashes = vec![(net.rng.below(30 * n as usize) as u64, victim)];
        let plans = (0..n)
            .map(|r| {
                if parts.contains(&r) {
                    collects.iter().enumerate().map(|(k, &c)| request(&sig, r, k as u64, c)).collect()
                } else {
                    VecDeque::new()
                }
            })
            .collect();
        net.drive(plans, seed % 4 < 2);
        assert!(net.failed.contains(&victim), "seed {seed}: the crash happened");
        for &r in &parts {
            let got = &net.done[r as usize];
            assert_eq!(got.len(), collects.len(), "seed {seed}: daemon {r}");
            for (k, (id, res)) in got.iter().enumerate() {
                assert_eq!(id.seq, k as u64);
                assert_eq!(res, &Ok(oracle(&sig, n, k as u64, collects[k])), "seed {seed}: daemon {r} fence {k}");
            }
        }
        assert!(net.all_quiescent(), "seed {seed}");
    }
}

/// A chain of fences over every daemon while two daemons die at random points and survivors
/// repair at staggered moments: every survivor finishes every fence it started, every seq has
/// one outcome on all survivors, and a failure names only crashed daemons.
#[test]
fn fence_chain_over_all_survives_two_crashes() {
    for seed in 0..80u64 {
        let (n, radix) = [(7, 2), (16, 2), (16, 3), (30, 64)][seed as usize % 4];
        let sig = FenceSignature::new("job:*", Participants::All);
        let collects: Vec<bool> = (0..10).map(|k| (k + seed) % 3 != 0).collect();
        let mut net = Net::new(n, radix, seed);
        let a = 1 + net.rng.below(n as usize - 1) as Rank;
        let b = 1 + (a + net.rng.below(n as usize - 2) as Rank) % (n - 1);
        let first = net.rng.below(6 * n as usize) as u64;
        net.scheduled_crashes = vec![(first, a), (first + net.rng.below(6 * n as usize) as u64, b)];
        let plans = (0..n)
            .map(|r| collects.iter().enumerate().map(|(k, &c)| request(&sig, r, k as u64, c)).collect())
            .collect();
        net.drive(plans, true);
        assert_eq!(net.failed.len(), 2, "seed {seed}");
        let live = net.live();
        let mut outcome = std::collections::BTreeMap::new();
        for &r in &live {
            let got = &net.done[r as usize];
            assert_eq!(got.len(), collects.len(), "seed {seed}: daemon {r} finished {} fences", got.len());
            for (id, res) in got {
                let want = outcome.entry(id.seq).or_insert_with(|| res.clone());
                assert_eq!(res, want, "seed {seed}: daemon {r} fence {}", id.seq);
                match res {
                    Ok(bytes) => assert_eq!(bytes, &oracle(&sig, n, id.seq, collects[id.seq as usize])),
                    Err(FenceError::LostConnection { lost }) => {
                        assert!(!lost.is_empty() && lost.iter().all(|x| net.failed.contains(x)), "seed {seed}")
                    }
                    Err(e) => panic!("seed {seed}: unexpected error {e}"),
                }
            }
        }
        assert!(net.all_quiescent(), "seed {seed}");
    }
}
