#!/usr/bin/env bash
# Liveness soak (issue 29; not in CI): N network-namespace nodes at radix R, every link limited
# to RATE with tbf, the default heartbeat bound, for DURATION seconds of, all at once:
#   - bulk broadcasts: dvm-bench --check-xcast of XCAST bytes on the bulk movement, and checked
#     barrier/modex fences, alternating (one benchmark at a time is what the HNP runs);
#   - PMIx collecting fences of 64 KiB per rank: the scaletest client, one rank per node;
#   - small jobs: prun -n 4 hostname, one after the other;
#   - SPIN spinning ranks (default 2 x this machine's cores), through the same DVM.
# Halfway, one daemon (STOP_RANK) is stopped with SIGSTOP: it must be declared lost within the
# bound + 1 s, and nobody else ever. Prints each loop's counts and failures, every daemon's
# timer lateness (p50/p99/max) and longest step before the stop, the stopped daemon's detection
# time, and the daemons declared lost.
#
#   sudo scripts/soak_liveness.sh                         # builds release binaries first
#   SKIP_BUILD=1 DURATION=120 N=8 OUT=/tmp/soak scripts/soak_liveness.sh
#
# Needs root (namespaces, tc). Everything it starts is stopped on exit, the nodes removed.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-16} RATE=${RATE:-1gbit} RADIX=${RADIX:-2} DURATION=${DURATION:-600} XCAST=${XCAST:-4194304}
SPIN=${SPIN:-$((2 * $(nproc)))} STOP_RANK=${STOP_RANK:-5} SLOTS=${SLOTS:-4}
BIN=${BIN:-target/release} OUT=${OUT:-/tmp/dvm-soak}
HB_MS=1000 HB_MISSES=5
if [ "$(id -u)" != 0 ]; then
    echo "soak_liveness.sh: needs root (network namespaces and tc); run it with sudo" >&2
    exit 1
fi
if [ -z "${SKIP_BUILD:-}" ]; then
    scripts/prereqs.sh build
    cargo build --release -p dvmd --bins -p dvm-tests --example fake_cluster
fi
rm -rf "$OUT" && mkdir -p "$OUT"
export DVM_TMPDIR=$OUT/tmp
mkdir -p "$DVM_TMPDIR"
gcc -O2 -o "$OUT/scaletest" contrib/dockerswarm/scaletest.c $(pkg-config --cflags --libs pmix)

source scripts/netns_cluster.sh
loops=()
cleanup() {
    for p in "${loops[@]}"; do kill "$p" 2>/dev/null || true; done
    netns_cluster_down
}
trap cleanup EXIT
netns_cluster_up soak_liveness.sh "$N" "$SLOTS" "$OUT"
netns_limit "$N" "$RATE"
echo "# soak: $N nodes x $SLOTS slots, radix $RADIX, links $RATE (tbf), heartbeat ${HB_MS} ms x $HB_MISSES," \
    "$DURATION s, $SPIN spinning ranks, $(nproc) cpus, $(git rev-parse --short HEAD)"
netns_dvm soak_liveness.sh "$OUT" --radix "$RADIX" --heartbeat-ms $HB_MS --heartbeat-misses $HB_MISSES
U=(--dvm-uri "file:$OUT/uri")
end=$(($(date +%s) + DURATION))

# Each loop appends "ok" or "fail <why>" per round to its file until the end.
loop() {
    local name=$1
    shift
    while [ "$(date +%s)" -lt "$end" ]; do
        # A failure's reason: the tool's own last sentence, not the job's last output line.
        if out=$("$@" 2>&1); then echo ok; else
            echo "fail $(echo "$out" | grep -E '^(prun|dvm-bench|scaletest)' | tail -1)"
        fi
    done >"$OUT/$name.rounds"
}
# The spinners run until the end; a job that lost a node is started again.
loop spin bash -c "left=\$(( $end - \$(date +%s) )); [ \$left -gt 0 ] || exit 0; timeout \$left '$BIN/prun' --dvm-uri file:$OUT/uri --oversubscribe \
    --map-by node -n $SPIN sh -c 'while :; do :; done'; [ \$? = 124 ]" &
spin_pid=$!
loops+=("$spin_pid")
loop bench bash -c "'$BIN/dvm-bench' --dvm-uri file:$OUT/uri --check-xcast 20 --xcast-bytes $XCAST --movement bulk &&
    '$BIN/dvm-bench' --dvm-uri file:$OUT/uri --check-fences 200" &
loops+=($!)
loop fences "$BIN/prun" "${U[@]}" --map-by node -n "$N" "$OUT/scaletest" --size 65536 --iters 5 &
loops+=($!)
loop jobs "$BIN/prun" "${U[@]}" -n 4 hostname &
loops+=($!)

# Halfway: the loops' lateness so far, then one daemon stopped.
sleep $((DURATION / 2))
"$BIN/dvm-bench" "${U[@]}" --tree >"$OUT/tree-before-stop.txt" 2>&1 || true
victim=""
for p in $(pgrep -f "dvmd --daemon"); do
    cmd=$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null || true)
    if [[ "$cmd" == *"--rank=$STOP_RANK "* && "$cmd" == *"--hnp=${fact[head]}:"* ]]; then
        victim=$p
    fi
done
[ -n "$victim" ] || { echo "soak_liveness.sh: no daemon $STOP_RANK to stop" >&2; exit 1; }
stopped_at=$(date +%s.%N)
kill -STOP "$victim"
for _ in $(seq 200); do
    grep -q "daemon $STOP_RANK on host .* was lost" "$OUT/dvmd.log" && break
    sleep 0.05
done
named_at=$(date +%s.%N)
grep -q "daemon $STOP_RANK on host .* was lost" "$OUT/dvmd.log" || named_at=never
kill -CONT "$victim" 2>/dev/null || true
wait "${loops[@]}" 2>/dev/null || true
"$BIN/dvm-bench" "${U[@]}" --tree >"$OUT/tree-end.txt" 2>&1 || true
"$BIN/pterm" "${U[@]}" >/dev/null 2>&1 || true
wait "$hnp_pid" 2>/dev/null || true
hnp_pid=

echo "## rounds (ok / failed; a failure after the stop may name daemon $STOP_RANK)"
for f in spin bench fences jobs; do
    okc=$(grep -c '^ok' "$OUT/$f.rounds" || true)
    failc=$(grep -c '^fail' "$OUT/$f.rounds" || true)
    echo "$f: $okc ok, $failc failed$(grep -m1 '^fail' "$OUT/$f.rounds" | sed 's/^fail/; first:/' || true)"
done
echo "## each daemon's loop before the stop (ms)"
cat "$OUT/tree-before-stop.txt"
if [ "$named_at" = never ]; then
    echo "## daemon $STOP_RANK stopped: NOT named lost within 10 s"
else
    echo "## daemon $STOP_RANK stopped: named lost after $(awk "BEGIN{printf \"%.2f\", $named_at - $stopped_at}") s (bound $((HB_MS * HB_MISSES / 1000)) s + 1 s)"
fi
echo "## daemons declared lost"
grep "^dvmd: daemon .* was lost" "$OUT/dvmd.log" || echo "(none)"
others=$(grep "^dvmd: daemon .* was lost" "$OUT/dvmd.log" | grep -vc "daemon $STOP_RANK on host" || true)
echo "healthy daemons declared lost: $others"
