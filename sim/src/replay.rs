//! The `dvm-sim` binary's replays and verdicts (declared by main.rs, not part of the library):
//! rerun one generated daemon-core schedule, and print a replay's or a campaign's violations
//! with the one-line replay of each failing seed. Never decides what is a violation: the
//! library's checks do.

use anyhow::{bail, Result};
use dvm_sim::daemons::{self, CoreProfile, CoreScenario};
use dvm_sim::{Failure, Movements, ReplayProfile};

/// Rerun one generated daemon-core schedule and print its violations.
pub(crate) fn replay_core(
    seed: u64,
    n: u32,
    radix: u32,
    profile: CoreProfile,
    verbose: bool,
    log: bool,
    mode: Movements,
) -> Result<()> {
    let mut sc = CoreScenario::generate(seed, n, radix, profile);
    mode.apply(&mut sc.cfg);
    if verbose {
        println!("{sc:#?}");
    }
    if log {
        let (_, lines) = daemons::engine::CoreEngine::new(&sc).with_log().run_logged();
        for l in lines {
            println!("{l}");
        }
    }
    let out = daemons::run(&sc);
    if let Some(t) = &out.trace {
        println!(
            "seed {seed} n {n} radix {radix} profile {profile}: faults {:?}, {} fence calls, {} benchmarks, {} xcasts, {} frames, ready t={:?}, ended t={} ns (bound {} ns after the last fault at {})",
            sc.faults.iter().map(|f| &f.kind).collect::<Vec<_>>(),
            t.fence_calls.len(),
            t.bench_starts.len(),
            t.xcast_starts.len(),
            t.stats.frames,
            t.ready_at,
            t.end_ns,
            sc.bound_ns,
            t.last_fault_at
        );
        if verbose {
            println!("stats: {:?}\nends: {:?}\nfailed at the HNP: {:?}", t.stats, t.ends, t.final_failed.first());
        }
    }
    replay_verdict(&out.violations)
}

/// Print a replayed schedule's violations and its verdict; an error if there are any.
pub(crate) fn replay_verdict(violations: &[String]) -> Result<()> {
    for v in violations {
        println!("VIOLATION: {v}");
    }
    if !violations.is_empty() {
        bail!("{} violation(s)", violations.len());
    }
    println!("ok: every invariant holds");
    Ok(())
}

/// Print each failing seed's replay line and first violation (all of them when `verbose`),
/// then the campaign's `summary`; an error if any seed failed.
pub(crate) fn campaign_verdict<P: ReplayProfile>(failures: &[Failure<P>], summary: &str, verbose: bool) -> Result<()> {
    for f in failures {
        println!("FAIL {}  # {}", f.replay(), f.violations[0]);
        if verbose {
            for v in &f.violations[1..] {
                println!("    {v}");
            }
        }
    }
    println!("{summary}");
    if !failures.is_empty() {
        bail!("{} failing seed(s)", failures.len());
    }
    Ok(())
}
