#!/usr/bin/env bash
# The long campaign of the daemon-core simulator: >= 100,000 seeded schedules in release
# (N 7/16/64, radix 2/3/64; faults, HNP loss and clean), two at a time. Prints each slice's
# counts and every failing seed's replay line; exits non-zero on any violation.
#   DVM_SIM_CORE_SCALE=2 scripts/sim_core_campaign.sh   # twice as many seeds
set -euo pipefail
cd "$(dirname "$0")/.."
scale="${DVM_SIM_CORE_SCALE:-1}"
jobs="${DVM_SIM_JOBS:-2}"
cargo build --release -p dvm-sim --quiet
bin=target/release/dvm-sim
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# profile n radix first count
slices="
faults 7 2 100000 20000
faults 7 3 200000 20000
faults 16 2 300000 15000
faults 16 3 400000 15000
faults 64 2 500000 8000
faults 64 3 600000 8000
faults 64 64 700000 8000
hnp 7 2 800000 1000
hnp 16 3 810000 1000
hnp 64 64 820000 1000
clean 7 3 900000 1000
clean 16 2 910000 1000
clean 64 64 920000 1000
"
start=$(date +%s)
echo "$slices" | awk 'NF' | while read -r p n r first count; do
    echo "$p $n $r $first $((count * scale))"
done | xargs -P "$jobs" -L 1 sh -c '
    "$0" campaign --engine core --profile "$1" --n "$2" --radix "$3" --first "$4" --count "$5" \
        > "'"$out"'/$1-$2-$3.txt" 2>&1 || true' "$bin"
status=0
total=0
for f in "$out"/*.txt; do
    name=$(basename "$f" .txt)
    summary=$(grep -E "^[0-9]+ runs" "$f" || echo "no summary (crashed?)")
    printf '%-14s %s\n' "$name" "$summary"
    grep "^FAIL" "$f" || true
    runs=$(echo "$summary" | awk '{print $1}')
    total=$((total + ${runs:-0}))
    if ! echo "$summary" | grep -q ": 0 failing$"; then status=1; fi
done
echo "total: $total schedules in $(( $(date +%s) - start )) s; $([ $status = 0 ] && echo 'no violations' || echo 'VIOLATIONS FOUND')"
exit $status
