#!/usr/bin/env bash
# The cost of link security (docs/security.md): barrier and 1 MiB xcast on DVMs that differ
# only in --link-security, booted side by side (same daemons, same loopback addresses, same
# radix), measured interleaved with the order rotated every repetition; paired ratios
# (aead/none, mac/none) per repetition, median with min and max.
#
#   scripts/bench_security.sh                        # 8 daemons, radix 2, 7 repetitions
#   N=16 RADIX=2 REPS=9 COUNT=300 scripts/bench_security.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench_common.sh
N=${N:-8}
RADIX=${RADIX:-2}
REPS=${REPS:-7}
COUNT=${COUNT:-300}        # barriers per measurement (xcasts: dvm-bench caps them at 100)
MODES=(none mac aead)
OUT=${OUT:-$(mktemp -d /tmp/dvm-bench-security.XXXXXX)}
mkdir -p "$OUT/bin"
[ "${SKIP_BUILD:-0}" = 1 ] || cargo build --release -q -p dvmd --bins
# Private copies: a concurrent `cargo build` must not swap the binaries mid-run.
cp target/release/dvmd target/release/dvm-bench target/release/pterm "$OUT/bin/"
B=$OUT/bin
export DVM_TMPDIR=$OUT
{
    echo "git HEAD $(git rev-parse --short HEAD); $(cd "$B" && sha256sum dvmd | cut -c1-16) dvmd"
    echo "cores (nproc) $(nproc); kernel $(uname -r); cpu $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
    echo "loadavg at start: $(cut -d' ' -f1-3 /proc/loadavg); $N daemons, radix $RADIX, $REPS reps, $COUNT barriers"
} | tee "$OUT/machine.txt"

declare -A HNP
stop_all() {
    local m
    for m in "${MODES[@]}"; do
        [ -n "${HNP[$m]:-}" ] && stop_dvm "$OUT/$m.uri" "${HNP[$m]}" "$m"
        HNP[$m]=
    done
}
trap stop_all EXIT
for m in "${MODES[@]}"; do
    "$B/dvmd" --local "$N" --radix "$RADIX" --link-security "$m" --report-uri "$OUT/$m.uri" --daemonize >/dev/null
    HNP[$m]=$(hnp_of_uri "$OUT/$m.uri")
    # The arms are distinct: each DVM's daemons run with their own mode.
    grep -q -- "--link-security=$m" "/proc/$(pgrep -P "${HNP[$m]}" dvmd | head -1)/cmdline" \
        || { echo "DVM $m: its daemons do not run --link-security=$m" >&2; exit 1; }
done

echo "rep,mode,barrier_p50_us,xcast_1mib_p50_us" >"$OUT/runs.csv"
for rep in $(seq "$REPS"); do
    # Rotate the order: none,mac,aead / mac,aead,none / aead,none,mac / ...
    order=()
    for i in 0 1 2; do order+=("${MODES[$(((i + rep) % 3))]}"); done
    for m in "${order[@]}"; do
        "$B/dvm-bench" --dvm-uri "file:$OUT/$m.uri" --count "$COUNT" --modex-bytes 0 --xcast-bytes 1048576 \
            --csv "$OUT/$m-rep$rep.csv" >/dev/null
        b=$(awk -F, '$1=="barrier"{print $8}' "$OUT/$m-rep$rep.csv")
        x=$(awk -F, '$1=="xcast" && $2==1048576{print $8}' "$OUT/$m-rep$rep.csv")
        echo "$rep,$m,$b,$x" >>"$OUT/runs.csv"
    done
done
echo "loadavg at end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/machine.txt"

python3 - "$OUT/runs.csv" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
by = {}
for r in rows:
    by.setdefault(r["rep"], {})[r["mode"]] = r
print(f"{'op':<12} {'arm':<5} {'none p50 us':>12} {'arm p50 us':>11} {'ratio median':>13} {'min':>6} {'max':>6}")
for op, col in (("barrier", "barrier_p50_us"), ("xcast 1MiB", "xcast_1mib_p50_us")):
    for arm in ("mac", "aead"):
        ratios = [float(v[arm][col]) / float(v["none"][col]) for v in by.values()]
        base = statistics.median(float(v["none"][col]) for v in by.values())
        armv = statistics.median(float(v[arm][col]) for v in by.values())
        print(f"{op:<12} {arm:<5} {base:>12.1f} {armv:>11.1f} {statistics.median(ratios):>13.3f} {min(ratios):>6.3f} {max(ratios):>6.3f}")
PY
echo "raw files in $OUT"
