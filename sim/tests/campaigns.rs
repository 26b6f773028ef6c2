//! Seeded campaigns over the real grpcomm state machines: crashes at random points, xcasts,
//! barrier and modex chains over every daemon and over subsets, scatters. Zero violations.
//!
//! `DVM_SIM_SCALE` (default 1) multiplies every seed count, for longer soak runs.

mod support;

use bytes::Bytes;
use dvm_grpcomm::{tags, FenceSignature, Participants};
use dvm_sim::scenario::{FenceChain, FenceStep, ScatterPlan};
use dvm_sim::{campaign, run, NetModel, Profile, Scenario};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use support::{assert_no_failures, scale};

/// Runs the seeds and fails with one replay line per failing seed.
fn campaign_ok(n: u32, radix: u32, profile: Profile, seeds: u64, first: u64) -> u64 {
    let rep = campaign(first..first + seeds * scale(), n, radix, profile);
    assert_no_failures(&rep.failures, rep.runs, &format!("schedules at n={n} radix={radix} ({profile})"));
    assert!(profile != Profile::Crash || rep.crashes >= rep.runs, "every crash schedule crashes a daemon");
    eprintln!(
        "n={n} radix={radix} {profile}: {} schedules, {} crashes, {} xcasts, {} fence calls, 0 violations",
        rep.runs, rep.crashes, rep.xcasts, rep.fences
    );
    rep.runs
}

// 2 x (500 + 380 + 120) = 2,000 schedules with crashes.
#[test]
fn crashes_n7_radix2() {
    campaign_ok(7, 2, Profile::Crash, 500, 0);
}
#[test]
fn crashes_n7_radix3() {
    campaign_ok(7, 3, Profile::Crash, 500, 10_000);
}
#[test]
fn crashes_n16_radix2() {
    campaign_ok(16, 2, Profile::Crash, 380, 20_000);
}
#[test]
fn crashes_n16_radix3() {
    campaign_ok(16, 3, Profile::Crash, 380, 30_000);
}
#[test]
fn crashes_n64_radix2() {
    campaign_ok(64, 2, Profile::Crash, 120, 40_000);
}
#[test]
fn crashes_n64_radix3() {
    campaign_ok(64, 3, Profile::Crash, 120, 50_000);
}

#[test]
fn clean_runs_every_size() {
    for (i, &(n, r)) in [(7, 2), (7, 3), (16, 2), (16, 3), (64, 2), (64, 3)].iter().enumerate() {
        campaign_ok(n, r, Profile::Clean, 40, 60_000 + 1_000 * i as u64);
    }
}

/// 10,000 fences back to back over one participant set of `n` daemons, alternating barrier
/// and modex, with jitter reordering across links, on `mode`: every one completes with
/// identical output on every daemon (the engine's checks). Returns the run's trace.
fn back_to_back_fences(n: u32, radix: u32, seed: u64, mode: dvm_sim::FenceMovementMode) -> dvm_sim::Trace {
    let net = NetModel {
        alpha_ns: 50_000,
        beta_ps_per_byte: 1_000,
        cpu_ns: 1_000,
        jitter_ns: 100_000,
        ingress_serialized: true,
    };
    let mut sc = Scenario::empty(n, radix, seed, net);
    sc.cfg.fence_movement = mode;
    sc.think_ns = 20_000;
    let steps: Vec<FenceStep> = (0..10_000).map(|k| FenceStep { collect: k % 2 == 1, timeout: None }).collect();
    sc.chains.push(FenceChain {
        sig: FenceSignature::new(Bytes::from_static(b"job7:*"), Participants::All),
        members: (0..n).collect(),
        steps,
        first_start: (0..n as u64).map(|r| r * 7_000).collect(),
        contrib_len: None,
    });
    sc.bound_ns = 10_000 * 2_000_000;
    let out = run(&sc);
    assert!(out.violations.is_empty(), "n {n}: {:#?}", &out.violations[..out.violations.len().min(10)]);
    let t = out.trace.unwrap();
    let done = t.fence_calls.iter().filter(|c| matches!(c.done, Some((_, Ok(_))))).count();
    assert_eq!(done, 10_000 * n as usize, "n {n}: every daemon completed every fence successfully");
    t
}

/// On the tree (radix 3).
#[test]
fn ten_thousand_back_to_back_fences() {
    back_to_back_fences(16, 3, 7, dvm_sim::FenceMovementMode::Tree);
}

/// Scatter of random maps from random origins: every destination receives exactly its slice
/// and the slices reassembled equal the origin's map. Radix 64 with more than 66 daemons so
/// the tree is not flat.
#[test]
fn scatter_oracle_random_maps() {
    for &(n, radix) in &[(100u32, 2u32), (300, 64), (5000, 64)] {
        for seed in 0..5u64 {
            let mut rng = StdRng::seed_from_u64(seed * 977 + n as u64);
            let net = NetModel {
                alpha_ns: 50_000,
                beta_ps_per_byte: 1_000,
                cpu_ns: 500,
                jitter_ns: 20_000,
                ingress_serialized: true,
            };
            let mut sc = Scenario::empty(n, radix, seed, net);
            for k in 0..3 {
                let mut slices = Vec::new();
                for dst in 0..n {
                    if rng.gen_bool(0.5) {
                        let len = rng.gen_range(0..100);
                        slices.push((dst, Bytes::from((0..len).map(|_| rng.gen::<u8>()).collect::<Vec<u8>>())));
                    }
                }
                let origin = rng.gen_range(0..n);
                sc.scatters.push(ScatterPlan { at: k * 10_000, origin, tag: tags::LAUNCH_RESIDUALS, slices });
            }
            let out = run(&sc);
            assert!(out.violations.is_empty(), "n={n} radix={radix} seed={seed}: {:#?}", out.violations);
            let t = out.trace.unwrap();
            // Reassemble independently of the checker.
            for (si, plan) in sc.scatters.iter().enumerate() {
                let start = &t.scatter_starts[si];
                let mut got: Vec<(u32, Bytes)> = t
                    .scatter_got
                    .iter()
                    .filter(|g| g.origin == start.daemon && g.scatter_id == start.scatter_id)
                    .map(|g| (g.daemon, g.data.clone()))
                    .collect();
                got.sort();
                let mut want = plan.slices.clone();
                want.sort();
                assert_eq!(got, want, "n={n} radix={radix} seed={seed} scatter {si}");
            }
        }
    }
}

/// The same schedule twice gives the same trace.
#[test]
fn runs_are_reproducible() {
    for seed in [1u64, 2, 3] {
        let sc = Scenario::generate(seed, 16, 2, Profile::Crash);
        let a = run(&sc);
        let b = run(&sc);
        let (ta, tb) = (a.trace.unwrap(), b.trace.unwrap());
        assert_eq!(ta.end_ns, tb.end_ns);
        assert_eq!(ta.stats.messages, tb.stats.messages);
        assert_eq!(ta.crashes, tb.crashes);
        assert_eq!(format!("{:?}", ta.fence_calls), format!("{:?}", tb.fence_calls));
        assert_eq!(a.violations, b.violations);
    }
}

/// The campaign assertion is not blind: a failing seed fails it, named by its replay line.
#[test]
#[should_panic(expected = "replay --seed 9 --n 7 --radix 2 --profile crash\n      lost op 4")]
fn a_failing_seed_is_named_by_its_replay_line() {
    let f = dvm_sim::Failure {
        seed: 9,
        n: 7,
        radix: 2,
        profile: Profile::Crash,
        movements: dvm_sim::FenceMovementMode::Tree.into(),
        violations: vec!["lost op 4".into()],
    };
    assert_no_failures(&[f], 1, "schedules");
}

/// The crash campaigns with each lateral movement forced (fences on the allgather, broadcasts
/// on scatter-allgather, both) and with `auto` for both: 4 x 2,000 schedules with crashes at
/// random points, lateral links costed like tree links.
#[test]
fn crashes_with_every_movement() {
    use dvm_sim::{campaign_with, BcastMovementMode as B, FenceMovementMode as F, Movements};
    // Each forced lateral movement, and auto for both (the tree for both is the default slice).
    for mode in [
        Movements::new(F::Allgather, B::Tree),
        Movements::new(F::Tree, B::Bulk),
        Movements::new(F::Auto, B::Auto),
        Movements::new(F::Allgather, B::Bulk),
    ] {
        let mut runs = 0;
        for (i, &(n, r, seeds)) in [(7, 2, 500), (16, 2, 500), (10, 2, 500), (16, 3, 500)].iter().enumerate() {
            let first = 100_000 + 10_000 * i as u64;
            let rep = campaign_with(first..first + seeds * scale(), n, r, Profile::Crash, mode);
            assert_no_failures(&rep.failures, rep.runs, &format!("schedules at n={n} radix={r} (crash, {mode})"));
            assert!(rep.crashes >= rep.runs, "every crash schedule crashes a daemon");
            runs += rep.runs;
        }
        eprintln!("{mode}: {runs} crash schedules, 0 violations");
    }
}

/// With the allgather forced, at N 10 (Bruck) and 16 (recursive doubling), radix 2: only
/// lateral links moved them, one message per step.
#[test]
fn ten_thousand_back_to_back_fences_on_the_allgather() {
    for n in [10u32, 16] {
        let t = back_to_back_fences(n, 2, 11, dvm_sim::FenceMovementMode::Allgather);
        let steps = u64::from(32 - (n - 1).leading_zeros());
        assert_eq!(t.stats.direct, 10_000 * u64::from(n) * steps, "n {n}: one lateral message per step");
        assert_eq!(t.stats.messages, t.stats.direct, "n {n}: nothing moved on the tree");
    }
}

/// Seeds that once failed, replayed with the movements they failed with.
#[test]
fn regression_seeds() {
    use dvm_sim::{campaign_with, BcastMovementMode as B, FenceMovementMode as F, Movements};
    // A daemon held blocks of a fence it had not started when it learned of a participant's
    // loss; its start then failed the fence at once and left that tracker waiting forever.
    let rep = campaign_with(303_965..303_966, 40, 3, Profile::Crash, Movements::new(F::Allgather, B::Bulk));
    assert_no_failures(&rep.failures, rep.runs, "regression seeds");
    // Dropping that tracker without a word hung this one: a relay's tree tracker held its
    // child's contribution, and the child never heard the fence had failed.
    let rep = campaign_with(100_184..100_185, 7, 2, Profile::Crash, Movements::new(F::Auto, B::Auto));
    assert_no_failures(&rep.failures, rep.runs, "regression seeds");
}
