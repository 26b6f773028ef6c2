#!/usr/bin/env bash
# Run every fuzz target in release mode with many inputs (docs/security.md shows a run).
#
#   scripts/fuzz.sh                    # 1,500,000 inputs per target (11 targets: 16.5 million)
#   CASES=100000 scripts/fuzz.sh       # fewer per target
#   SEED=7 scripts/fuzz.sh             # another fixed seed (a failure replays with the same CASES/SEED)
#   PROFILE=test scripts/fuzz.sh       # the test profile (opt-level 1) instead of release
#
# Targets are proptest properties (stable toolchain); `cargo test` runs a small slice of each.
# A target passes when every input passed its oracle (no panic, no hang, no frame accepted
# that was not sealed, no handshake without the secret). Prints one line per target and a total.
set -euo pipefail
cd "$(dirname "$0")/.."
CASES=${CASES:-1500000}
SEED=${SEED:-4040404040}
PROFILE=${PROFILE:-release}
export DVM_FUZZ_CASES=$CASES DVM_FUZZ_SEED=$SEED

# package  test-binary(--lib or --test X)  target
TARGETS=(
    "dvm-core --lib fuzz_tests::fuzz_core_message_handlers"
    "dvmd --test=fuzz_edge fuzz_frame_decoder"
    "dvmd --test=fuzz_edge fuzz_sealed_decoder"
    "dvmd --test=fuzz_edge fuzz_sealed_chunks"
    "dvmd --test=fuzz_edge fuzz_handshake"
    "dvmd --test=fuzz_edge fuzz_hostfile_parser"
    "dvmd --test=fuzz_edge fuzz_prun_command_line"
    "dvmd --test=fuzz_edge fuzz_pmi_decoder"
    "dvmd --test=fuzz_edge fuzz_pmi_server"
    "dvmd --test=jobmap_wire garbage_never_panics"
    "dvmd --test=jobmap_wire corrupted_fields_never_panic"
)
# The core's target boots an 8-daemon DVM per input: it runs a tenth as many.
core_cases=$((CASES / 10))

cargo test --profile "$PROFILE" -q -p dvm-core --lib --no-run
cargo test --profile "$PROFILE" -q -p dvmd --test fuzz_edge --test jobmap_wire --no-run

total=0
failed=0
printf '%-48s %12s %10s %s\n' target inputs seconds result
for t in "${TARGETS[@]}"; do
    read -r pkg bin name <<<"$t"
    n=$CASES
    [ "$pkg" = dvm-core ] && n=$core_cases
    start=$(date +%s.%N)
    if DVM_FUZZ_CASES=$n cargo test --profile "$PROFILE" -q -p "$pkg" "$bin" -- --exact "$name" >/tmp/dvm-fuzz-$$.log 2>&1; then
        result="ok (0 panics)"
    else
        result="FAILED (see below)"
        failed=$((failed + 1))
        tail -40 /tmp/dvm-fuzz-$$.log
    fi
    secs=$(echo "$(date +%s.%N) - $start" | bc)
    printf '%-48s %12d %10.1f %s\n' "$name" "$n" "$secs" "$result"
    total=$((total + n))
done
rm -f /tmp/dvm-fuzz-$$.log
echo "total inputs: $total; seed $SEED; profile $PROFILE; failed targets: $failed"
[ "$failed" = 0 ]
