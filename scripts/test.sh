#!/usr/bin/env bash
# The test command: every crate's unit, property, simulation and multi-process tests.
# Multi-daemon tests run real dvmd processes on loopback addresses (and, as root, in network
# namespaces); they run at radix 2 as well as the default 64.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --workspace --all-targets
cargo test --workspace -- --test-threads="${DVM_TEST_THREADS:-2}"
