//! Settings shared by the fuzz targets (proptest, stable toolchain): `cargo test` runs a small
//! slice of each; scripts/fuzz.sh runs millions in release mode through the environment.
//!
//! - `DVM_FUZZ_CASES`: inputs per target (default: the target's slice);
//! - `DVM_FUZZ_SEED`: the fixed seed of a run, so a failure replays with the same two values.

use proptest::test_runner::{Config, RngSeed};

/// Inputs per target: `DVM_FUZZ_CASES`, else `slice`.
pub fn cases(slice: u32) -> u32 {
    std::env::var("DVM_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(slice)
}

/// A proptest configuration for a fuzz target whose `cargo test` slice is `slice` inputs.
pub fn config(slice: u32) -> Config {
    let seed = std::env::var("DVM_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0xF0CC_A5E5);
    Config {
        cases: cases(slice),
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        max_shrink_iters: 2_000,
        ..Config::default()
    }
}
