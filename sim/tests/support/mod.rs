//! What the campaign tests of both engines share: the seed-count scale and the assertion
//! that fails with one replay line per failing seed.

use dvm_sim::{Failure, ReplayProfile};

/// `DVM_SIM_SCALE` (default 1): multiplies every seed count, for longer soak runs.
pub fn scale() -> u64 {
    std::env::var("DVM_SIM_SCALE").ok().map_or(1, |s| s.parse().expect("DVM_SIM_SCALE must be an integer"))
}

/// Fails naming, for each failing seed (the first 20), the command that replays it and its
/// first violations. `what` says which schedules `runs` counts.
pub fn assert_no_failures<P: ReplayProfile>(failures: &[Failure<P>], runs: u64, what: &str) {
    let mut msg = String::new();
    for f in failures.iter().take(20) {
        msg.push_str(&format!(
            "\n  {}\n      {}",
            f.replay(),
            f.violations.iter().take(4).cloned().collect::<Vec<_>>().join("\n      ")
        ));
    }
    assert!(failures.is_empty(), "{} of {runs} {what} violated invariants:{msg}", failures.len());
}
