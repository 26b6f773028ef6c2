#!/usr/bin/env bash
# Paired A/B of two sets of binaries on local DVMs: `dvm-bench` (default sizes) on 16 daemons at
# radix 2 and 64, and job throughput (sequential `prun -n 1 /bin/true`, and `-n 8` on 4 daemons
# with 2 slots). Arms interleave A B B A in every repetition; the summary gives, per row, the
# median of the paired ratios B/A with min and max.
#
#   A=/tmp/ab/old B=/tmp/ab/new REPS=5 scripts/bench_ab.sh      # dirs holding dvmd dvm-bench prun pterm
#
# Every DVM is stopped with pterm; the script then checks that none of its dvmd pids is left.
set -euo pipefail
cd "$(dirname "$0")/.."
A=${A:?directory of the A binaries}
B=${B:?directory of the B binaries}
REPS=${REPS:-5}
COUNT=${COUNT:-50}
JOBS=${JOBS:-100}
OUT=${OUT:-$(mktemp -d /tmp/dvm-bench-ab.XXXXXX)}
mkdir -p "$OUT"
{
    echo "A: $A"; (cd "$A" && sha256sum dvmd prun | sed 's/^/  /')
    echo "B: $B"; (cd "$B" && sha256sum dvmd prun | sed 's/^/  /')
    echo "nproc $(nproc); loadavg at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT/machine.txt"

run_arm() { # arm dir daemons radix slots rep
    local arm=$1 bin=$2 n=$3 radix=$4 slots=$5 rep=$6 uri="$OUT/uri-$1"
    rm -f "$uri"
    "$bin/dvmd" --local "$n" --radix "$radix" --slots "$slots" --report-uri "$uri" --daemonize >/dev/null
    local pids
    pids=$(pgrep -f -- "--report-uri $uri" || true)
    if [ "$n" = 16 ]; then
        "$bin/dvm-bench" --dvm-uri "file:$uri" --count "$COUNT" --csv "$OUT/bench-$arm-$radix-$rep.csv" >/dev/null
    else
        local t0 t1
        t0=$(date +%s.%N)
        for _ in $(seq "$JOBS"); do "$bin/prun" --dvm-uri "file:$uri" -n 1 /bin/true; done
        t1=$(date +%s.%N)
        echo "jobs_n1,$arm,$rep,$t0,$t1" >>"$OUT/jobs.csv"
        t0=$(date +%s.%N)
        for _ in $(seq "$JOBS"); do "$bin/prun" --dvm-uri "file:$uri" -n 8 /bin/true; done
        t1=$(date +%s.%N)
        echo "jobs_n8,$arm,$rep,$t0,$t1" >>"$OUT/jobs.csv"
    fi
    "$bin/pterm" --dvm-uri "file:$uri" >/dev/null
    for _ in $(seq 100); do
        local left=0
        for p in $pids; do kill -0 "$p" 2>/dev/null && left=1; done
        [ $left = 0 ] && return 0
        sleep 0.1
    done
    echo "error: dvmd processes of arm $arm left after pterm: $pids" >&2
    for p in $pids; do kill -9 "$p" 2>/dev/null || true; done
    exit 1
}

for rep in $(seq "$REPS"); do
    for radix in 2 64; do
        for arm in A B B A; do
            dir=$A; [ $arm = B ] && dir=$B
            run_arm "$arm" "$dir" 16 "$radix" 1 "$rep$arm$radix$RANDOM"
        done
    done
    for arm in A B B A; do
        dir=$A; [ $arm = B ] && dir=$B
        run_arm "$arm" "$dir" 4 2 2 "$rep"
    done
    echo "repetition $rep done (loadavg $(cut -d' ' -f1 /proc/loadavg))" >&2
done
python3 - "$OUT" "$JOBS" <<'EOF'
import csv, glob, os, statistics, sys
out = sys.argv[1]
rows = {}  # (radix, op, bytes) -> {arm: [p50...]} in run order
for f in sorted(glob.glob(os.path.join(out, "bench-*.csv")), key=os.path.getmtime):
    arm = os.path.basename(f).split("-")[1]
    for r in csv.DictReader(open(f)):
        key = (int(r["radix"]), r["op"], int(r["bytes"]))
        rows.setdefault(key, {"A": [], "B": []})[arm].append(float(r["p50_us"]))
print("dvm-bench p50 on 16 daemons: B/A, median of paired ratios (min-max); A and B medians in us")
print("| radix | op | bytes | A p50 | B p50 | B/A |")
print("|---|---|---:|---:|---:|---|")
for (radix, op, b), v in sorted(rows.items()):
    pairs = [y / x for x, y in zip(v["A"], v["B"]) if x > 0]
    if not pairs:
        continue
    print(f"| {radix} | {op} | {b} | {statistics.median(v['A']):.1f} | {statistics.median(v['B']):.1f} | "
          f"{statistics.median(pairs):.2f} ({min(pairs):.2f}-{max(pairs):.2f}) |")
jobs = {}
if os.path.exists(os.path.join(out, "jobs.csv")):
    for kind, arm, rep, t0, t1 in csv.reader(open(os.path.join(out, "jobs.csv"))):
        jobs.setdefault(kind, {"A": [], "B": []})[arm].append(int(sys.argv[2]) / (float(t1) - float(t0)))
print()
print("jobs/s, sequential prun on 4 daemons x 2 slots: B/A paired")
for kind, v in jobs.items():
    pairs = [y / x for x, y in zip(v["A"], v["B"])]
    print(f"{kind}: A {statistics.median(v['A']):.1f}/s, B {statistics.median(v['B']):.1f}/s, "
          f"B/A {statistics.median(pairs):.2f} ({min(pairs):.2f}-{max(pairs):.2f})")
EOF
