//! Seeded campaigns over N daemon cores (`dvm-core`): boot, PMIx-like jobs, fence benchmarks
//! and xcasts under kills, freezes, link cuts and HNP loss. Zero violations.
//!
//! `DVM_SIM_SCALE` (default 1) multiplies every seed count, for longer soak runs. The long
//! campaign is `scripts/sim_core_campaign.sh`.

mod support;

use dvm_sim::daemons::{campaign, run, CoreProfile, CoreScenario};
use support::{assert_no_failures, scale};

/// Runs the seeds and fails with one replay line per failing seed.
fn campaign_ok(n: u32, radix: u32, profile: CoreProfile, seeds: u64, first: u64) {
    let rep = campaign(first..first + seeds * scale(), n, radix, profile);
    assert_no_failures(&rep.failures, rep.runs, &format!("core schedules at n={n} radix={radix} ({profile})"));
    if profile == CoreProfile::HnpLoss {
        assert_eq!(rep.hnp_losses, rep.runs, "every hnp schedule kills the HNP");
    }
    eprintln!(
        "n={n} radix={radix} {profile}: {} schedules, {} kills, {} mid-step kills, {} freezes, {} cuts, {} HNP losses, \
         {} fence calls, {} benchmarks, {} jobs ({} failed), {} PMIx upcalls, {} PMI ranks ({} barriers passed), \
         {} evictions, 0 violations",
        rep.runs,
        rep.kills,
        rep.step_kills,
        rep.stops,
        rep.cuts,
        rep.hnp_losses,
        rep.fences,
        rep.benches,
        rep.jobs,
        rep.failed_jobs,
        rep.pmix_upcalls,
        rep.pmi_ranks,
        rep.pmi_barriers,
        rep.evictions
    );
}

// 2,002 schedules: 1,500 with faults, 300 with HNP loss, 202 clean.
#[test]
fn faults_n7_radix2() {
    campaign_ok(7, 2, CoreProfile::Faults, 400, 0);
}
#[test]
fn faults_n7_radix3() {
    campaign_ok(7, 3, CoreProfile::Faults, 300, 10_000);
}
#[test]
fn faults_n16_radix2() {
    campaign_ok(16, 2, CoreProfile::Faults, 300, 20_000);
}
#[test]
fn faults_n16_radix3() {
    campaign_ok(16, 3, CoreProfile::Faults, 250, 30_000);
}
#[test]
fn faults_n64() {
    campaign_ok(64, 2, CoreProfile::Faults, 100, 40_000);
    campaign_ok(64, 3, CoreProfile::Faults, 80, 50_000);
    campaign_ok(64, 64, CoreProfile::Faults, 70, 60_000);
}
#[test]
fn hnp_loss_every_size() {
    for (i, &(n, r)) in [(7, 2), (7, 3), (16, 2), (16, 3), (64, 2), (64, 64)].iter().enumerate() {
        campaign_ok(n, r, CoreProfile::HnpLoss, 50, 70_000 + 1_000 * i as u64);
    }
}
#[test]
fn clean_every_size() {
    for (i, &(n, r)) in [(7, 2), (7, 3), (16, 2), (16, 3), (64, 2), (64, 64)].iter().enumerate() {
        let seeds = if n == 64 { 25 } else { 38 };
        campaign_ok(n, r, CoreProfile::Clean, seeds, 80_000 + 1_000 * i as u64);
    }
}

/// Seeds that found bugs in dvm-core or grpcomm (see the commit that fixed each).
#[test]
fn regression_seeds() {
    let cases: &[(u64, u32, u32, CoreProfile, &str)] = &[
        // A benchmark's end report routed along the tree died on a cut link before the
        // sender applied DAEMON_DIED: the HNP waited forever (BenchDone now goes straight).
        (3, 7, 2, CoreProfile::Faults, "BenchDone lost on a broken tree link"),
        // Ops forwarded to a killed parent left a gap before the DAEMON_DIED that repairs
        // the tree; the new parent's forward and poll were answered up the dead route.
        (5, 7, 2, CoreProfile::Faults, "xcast gap before DAEMON_DIED"),
        (14, 7, 2, CoreProfile::Faults, "xcast gap before DAEMON_DIED"),
        (19, 7, 2, CoreProfile::Faults, "xcast gap before DAEMON_DIED"),
        // Jobs under faults (the daemon as one Node). A residual scatter through a daemon
        // frozen past the bound lost its subtree's slices: the job never ended (the HNP now
        // sends running jobs' residuals again after a loss); the copy then started procs on
        // daemons that had already applied the job's kill (a daemon now never starts a proc
        // of a job it was told to kill).
        (20040, 16, 2, CoreProfile::Faults, "residuals lost with a frozen relay"),
        (20042, 16, 2, CoreProfile::Faults, "residuals lost with a frozen relay; procs after the kill"),
        (30070, 16, 3, CoreProfile::Faults, "jobs under faults"),
        // A residual scatter reached a relay from the new parent a repair gave it while that
        // relay's DAEMON_DIED still waited behind a gap (its old parent frozen past the bound):
        // the relay sent a slice up to the dead parent and the job, killed by the loss, waited
        // for a rank that never started; pterm then waited for the job (grpcomm now sends a
        // slice routed by a newer tree straight to its destination).
        (308715, 16, 2, CoreProfile::Faults, "residual slice sent up to a frozen parent"),
        (309750, 16, 2, CoreProfile::Faults, "residual slice sent up to a frozen parent; pterm waits"),
        // The job-timeout timer is idle to the event queue: a run stopped with a job still in
        // the HNP's table before its --timeout fired (the engine now runs until the table empties).
        (80001, 7, 2, CoreProfile::Clean, "a hanging job's --timeout"),
        // An MPI rank's direct modex was asked of a daemon that was then lost: the request
        // was never answered, and its daemon's PMIx hosting never went idle (a lost owner
        // now answers it with PMIX_ERR_LOST_CONNECTION, an ended job with NOT_FOUND).
        (10167, 7, 3, CoreProfile::Faults, "a direct modex asked of a lost daemon"),
        // An MPI job ended (its --timeout) while its ranks' PMIx fence was in flight: the HNP's
        // daemon abandoned it and forgot the signature, then another daemon's contribution,
        // sent before it heard, opened a tracker there that waited for ever (grpcomm now
        // releases such a contribution as abandoned).
        (109647, 7, 2, CoreProfile::Faults, "a fence contribution after its job ended"),
        (104198, 7, 2, CoreProfile::Faults, "a fence contribution after its job ended; the run never quiesced"),
        // A daemon whose job had ended got a fence's result pushed again after a repair (its
        // new parent's), which made the forgotten signature live again; the re-sent
        // contribution of a new child, which had missed the release on a lossy cut, then
        // opened a tracker that waited for ever (a release for a forgotten signature is now
        // dropped).
        (303194, 16, 2, CoreProfile::Faults, "a release for a forgotten signature after a repair"),
        // The engine delivered an upcall of a killed daemon's server to its next incarnation.
        (202541, 7, 3, CoreProfile::Faults, "a restarted daemon and its former server's upcall"),
        (312099, 16, 2, CoreProfile::Faults, "a restarted daemon and its former server's upcall"),
    ];
    // Found before ranks spoke PMI: replayed with the workload they had then.
    for &(seed, n, radix, profile, what) in cases {
        let out = run(&CoreScenario::generate(seed, n, radix, profile).pmix_only());
        assert!(out.violations.is_empty(), "seed {seed} n={n} radix={radix} ({what}): {:#?}", out.violations);
    }
    let pmi: &[(u64, u32, u32, CoreProfile, &str)] = &[
        // A PMI rank killed in a barrier: its fd closed while its daemon's contribution was in
        // flight, and the barrier's end then wrote `barrier_out` on the closed fd (an answer
        // on a closed fd is now dropped: `Pmi::answer`).
        (900011, 7, 3, CoreProfile::Clean, "a PMI barrier answered on a closed fd"),
        (100224, 7, 2, CoreProfile::Faults, "a PMI barrier answered on a closed fd"),
    ];
    for &(seed, n, radix, profile, what) in pmi {
        let out = run(&CoreScenario::generate(seed, n, radix, profile));
        assert!(out.violations.is_empty(), "seed {seed} n={n} radix={radix} ({what}): {:#?}", out.violations);
    }
}

/// Simulated MPI ranks speak PMI-1 and PMI-2 on their fds beside PMIx ranks, and pass their
/// barriers (the PMI invariants are judged on every run of every slice).
#[test]
fn pmi_ranks_pass_barriers_beside_pmix_ranks() {
    let rep = campaign(900_000..900_200, 7, 3, CoreProfile::Clean);
    assert_no_failures(&rep.failures, rep.runs, "clean core schedules at n=7 radix=3");
    assert!(rep.pmix_upcalls > 0, "PMIx ranks ran");
    assert!(
        rep.pmi_ranks > 100 && rep.pmi_barriers > 100,
        "{} PMI ranks, {} barriers",
        rep.pmi_ranks,
        rep.pmi_barriers
    );
    assert!(rep.pmi_requests > 10 * rep.pmi_ranks / 2, "each PMI rank sends init, puts, barriers and gets");
}

/// The same schedule twice gives the same trace.
#[test]
fn core_runs_are_reproducible() {
    for seed in [1u64, 2, 3] {
        let sc = CoreScenario::generate(seed, 16, 2, CoreProfile::Faults);
        let (a, b) = (run(&sc), run(&sc));
        let (ta, tb) = (a.trace.unwrap(), b.trace.unwrap());
        assert_eq!(ta.end_ns, tb.end_ns);
        assert_eq!(ta.stats.frames, tb.stats.frames);
        assert_eq!(format!("{:?}", ta.ends), format!("{:?}", tb.ends));
        assert_eq!(format!("{:?}", ta.fence_calls), format!("{:?}", tb.fence_calls));
        assert_eq!(a.violations, b.violations);
    }
}

/// The checker is not blind: a schedule whose HNP dies must see every daemon exit, and a
/// faulty schedule must lose somebody.
#[test]
fn faults_have_consequences() {
    let sc = CoreScenario::generate(11, 16, 3, CoreProfile::HnpLoss);
    let t = run(&sc).trace.unwrap();
    assert!((1..16).all(|r| !t.running(r)), "every daemon ended after the HNP died: {:?}", t.ends);
    let mut lost = 0;
    for seed in 0..20 {
        let t = run(&CoreScenario::generate(seed, 7, 2, CoreProfile::Faults)).trace.unwrap();
        lost += t.final_failed[0].len();
    }
    assert!(lost > 10, "faults declared {lost} daemons dead over 20 schedules");
}

/// The faults slice with the lateral movements forced (fences on the allgather, launch maps
/// and user broadcasts on scatter-allgather) and with `auto` for both: kills, freezes,
/// lateral and tree link cuts (some lossy) while jobs fence back to back.
#[test]
fn faults_with_every_movement() {
    use dvm_sim::daemons::campaign_with;
    use dvm_sim::{BcastMovementMode as B, FenceMovementMode as F, Movements};
    // Forced lateral movements (launch maps on scatter-allgather too) and auto for both.
    for mode in [Movements::new(F::Allgather, B::Bulk), Movements::new(F::Auto, B::Auto)] {
        for &(n, radix, seeds) in &[(7, 2, 150), (16, 2, 150), (16, 3, 100)] {
            let rep = campaign_with(0..seeds * scale(), n, radix, CoreProfile::Faults, mode);
            assert_no_failures(&rep.failures, rep.runs, &format!("core schedules at n={n} radix={radix} ({mode})"));
            assert!(rep.cuts > 0 && rep.kills > 0, "the slice has cuts and kills");
        }
    }
}

/// Faults-profile seeds that once failed, replayed with the movements they failed with.
#[test]
fn core_regression_seeds() {
    use dvm_sim::daemons::campaign_with;
    use dvm_sim::{BcastMovementMode as B, FenceMovementMode as F, Movements};
    // A lateral link cut silently under a stream of scatter-allgather broadcasts: the blocks
    // sent on it before the loss was noticed were owed by exchanges already finished and
    // forgotten (only four were kept), and ops started after the loss sent on it again.
    let cases: [(u64, u32, u32, Movements); 10] = [
        (2_000_363, 10, 2, Movements::new(F::Tree, B::Bulk)),
        (2_000_709, 10, 2, Movements::new(F::Allgather, B::Bulk)),
        (2_000_719, 10, 2, Movements::new(F::Allgather, B::Bulk)),
        (2_001_176, 10, 2, Movements::new(F::Allgather, B::Bulk)),
        (2_000_078, 16, 2, Movements::new(F::Allgather, B::Bulk)),
        // A detoured block sent to a parent that had just died: nothing sent it again after
        // the repair, and no degrade reached the partner (it held its chunk, not the whole).
        (3_000_193, 7, 2, Movements::new(F::Tree, B::Bulk)),
        (3_001_104, 7, 2, Movements::new(F::Tree, B::Bulk)),
        (3_001_720, 7, 2, Movements::new(F::Tree, B::Bulk)),
        // pterm while a link was cut: the daemon behind it never got TERMINATE, nothing is
        // repaired once the DVM terminates, and the HNP waited for ever (it now ends after
        // a deadline of a few loss bounds; the daemons it did not reach lose it and end).
        (37, 16, 2, Movements::new(F::Allgather, B::Bulk)),
        (146, 16, 2, Movements::new(F::Allgather, B::Bulk)),
    ];
    for (seed, n, radix, mode) in cases {
        let rep = campaign_with(seed..seed + 1, n, radix, CoreProfile::Faults, mode);
        assert_no_failures(&rep.failures, rep.runs, &format!("seed {seed} n {n} radix {radix} ({mode})"));
    }
}
