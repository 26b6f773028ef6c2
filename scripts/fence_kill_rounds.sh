#!/usr/bin/env bash
# Acceptance run for fences under daemon loss (not in CI; takes a few minutes):
# ROUNDS times: boot 16 daemons at radix 2, start a fence storm (dvm-bench --check-fences,
# barrier and modex alternating, checked on every daemon), kill -9 one random daemon (a leaf,
# an interior relay or a child of the HNP), and require that the storm ends with an error
# naming that daemon within BOUND seconds, then that the survivors pass 1000 checked fences.
#
#   scripts/fence_kill_rounds.sh              # 10 rounds, prints a table, exits 1 on any failure
#   ROUNDS=3 SEED=7 scripts/fence_kill_rounds.sh
#
# Every DVM is stopped with pterm; any of its dvmd pids still alive afterwards is killed by
# pid and counted as a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-10}
BOUND=${BOUND:-5}
N=16
SEED=${SEED:-$RANDOM}
RANDOM=$SEED
OUT=$(mktemp -d /tmp/dvm-fence-kill.XXXXXX)
[ "${SKIP_BUILD:-0}" = 1 ] || cargo build --release --bins -q
B=$OUT/bin; mkdir -p "$B"; cp target/release/{dvmd,dvm-bench,pterm} "$B/"
export DVM_TMPDIR=$OUT/tmp; mkdir -p "$DVM_TMPDIR"
echo "seed $SEED; git $(git rev-parse --short HEAD); $N daemons radix 2; bound ${BOUND}s"
printf '%-5s %-7s %-9s %-10s %-8s %s\n' round victim kind ended_ms next first_error
fail=0
PIDS=()
storm=
# Whatever happens (a failure under set -e included): the DVM's daemons, the storm and the
# scratch directory go.
cleanup() {
    for p in "${PIDS[@]}" $storm; do kill -9 "$p" 2>/dev/null || true; done
    rm -rf "$OUT"
}
trap cleanup EXIT
for round in $(seq 1 "$ROUNDS"); do
    uri=$OUT/uri.$round
    "$B/dvmd" --local $N --radix 2 --report-uri "$uri" --daemonize >/dev/null
    hnp=$(sed -E 's#.*/dvm-([0-9]+)-[0-9a-f]+$#\1#' "$uri")
    mapfile -t PIDS < <(echo "$hnp"; ps -o pid= --ppid "$hnp" | tr -d ' ')
    # Victim kinds at radix 2, 16 daemons: 1 and 2 are the HNP's children; 3..7 relay; 8..15 are leaves.
    case $((RANDOM % 3)) in
        0) victim=$((1 + RANDOM % 2)); kind=hnp-child ;;
        1) victim=$((3 + RANDOM % 5)); kind=interior ;;
        *) victim=$((8 + RANDOM % 8)); kind=leaf ;;
    esac
    vpid=$(ps -o pid=,args= --ppid "$hnp" | awk -v r="--rank=$victim" '$0 ~ r" " {print $1}')
    [ -n "$vpid" ] || { echo "round $round: no process for daemon $victim under HNP $hnp" >&2; exit 1; }
    "$B/dvm-bench" --dvm-uri "file:$uri" --check-fences 100000000 >"$OUT/storm.$round" 2>&1 &
    storm=$!
    sleep 1
    kill -9 "$vpid"
    t0=$(date +%s%N)
    ended=
    for _ in $(seq $((BOUND * 100))); do
        if ! kill -0 "$storm" 2>/dev/null; then ended=$(( ($(date +%s%N) - t0) / 1000000 )); break; fi
        sleep 0.01
    done
    if [ -z "$ended" ]; then kill "$storm" 2>/dev/null || true; ended=hang; fi
    wait "$storm" 2>/dev/null && storm_rc=0 || storm_rc=$?
    storm=
    err=$(grep -o 'first: .*' "$OUT/storm.$round" | head -1 | cut -c8- || true)
    if "$B/dvm-bench" --dvm-uri "file:$uri" --check-fences 1000 >"$OUT/next.$round" 2>&1; then next=pass; else next=FAIL; fi
    ok=1
    [ "$ended" = hang ] && ok=0
    [ "$storm_rc" -ne 0 ] || ok=0
    echo "$err" | grep -q "lost daemon $victim on host" || ok=0
    [ "$next" = pass ] || ok=0
    [ $ok = 1 ] || fail=$((fail + 1))
    printf '%-5s %-7s %-9s %-10s %-8s %s\n' "$round" "$victim" "$kind" "$ended" "$next" "$err"
    "$B/pterm" --dvm-uri "file:$uri" >/dev/null || { echo "pterm failed" >&2; fail=$((fail + 1)); }
    for _ in $(seq 100); do
        left=(); for p in "${PIDS[@]}"; do [ -d /proc/$p ] && [ "$(awk '{print $3}' /proc/$p/stat 2>/dev/null)" != Z ] && left+=("$p"); done
        [ ${#left[@]} -eq 0 ] && break; sleep 0.05
    done
    if [ ${#left[@]} -ne 0 ]; then echo "dvmd pids left after pterm: ${left[*]}" >&2; kill -9 "${left[@]}"; fail=$((fail + 1)); fi
    PIDS=()
done
echo "rounds $ROUNDS, failures $fail"
[ $fail -eq 0 ]
