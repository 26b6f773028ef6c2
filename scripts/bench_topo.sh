#!/usr/bin/env bash
# MPI_Init+Finalize with the daemon's hardware topology handed to the ranks (dvmd's default)
# against every rank discovering it itself (DVM_NO_TOPO=1, the behaviour before). Writes the
# tables of docs/topo-bench.md.
#
#   scripts/bench_topo.sh                                  # build (release), measure, print tables
#   SIZES="16 32 64" REPS=10 scripts/bench_topo.sh
#   SKIP_BUILD=1 BIN=target/debug scripts/bench_topo.sh    # binaries already built
#
# Two persistent DVMs of `dvmd --local 4` run side by side for the whole measurement, one per
# arm (DVM_NO_TOPO is read by dvmd when its PMIx server starts, so an arm is a DVM):
#   topo     dvmd as built: each daemon's PMIx server shares the topology it discovered
#   notopo   dvmd with DVM_NO_TOPO=1: every rank discovers the topology itself
# Each run is tests/mpi/mpinoop on NP ranks (mapped by slot over the 4 daemons), timed from
# prun's launch to its exit; rank 0's own MPI_Init time is recorded too. OMPI_MCA_pml=ob1 in
# both DVMs' environment, so of every rank. Interleaved ABBA: odd repetitions run topo then
# notopo, even ones notopo then topo. Medians and per-repetition paired ratios.
# Not part of CI: it measures. Both DVMs are stopped with pterm; their pids are then checked
# (and killed, failing, if left).
set -euo pipefail
cd "$(dirname "$0")/.."
SIZES=${SIZES:-16 32}
REPS=${REPS:-6}
# shellcheck source=bench_common.sh
source scripts/bench_common.sh
bench_prepare topo
PROG=$OUT/mpi/mpinoop

unset DVM_NO_TOPO OMPI_MCA_hwloc_base_verbose
MAXNP=$(printf '%s\n' $SIZES | sort -n | tail -1)
SLOTS=$(((MAXNP + 3) / 4))
bench_header "SIZES=$SIZES REPS=$REPS; dvmd --local 4 --slots $SLOTS per arm"

declare -A HNP
start() { # start ARM
    local uri=$OUT/$1.uri
    if [ "$1" = notopo ]; then
        DVM_NO_TOPO=1 "$B/dvmd" --local 4 --slots "$SLOTS" --report-uri "$uri" --daemonize >/dev/null
    else
        "$B/dvmd" --local 4 --slots "$SLOTS" --report-uri "$uri" --daemonize >/dev/null
    fi
    HNP[$1]=$(hnp_of_uri "$uri")
}
stop() {
    local arm failed=0
    for arm in "${!HNP[@]}"; do
        stop_dvm "$OUT/$arm.uri" "${HNP[$arm]}" "$arm" || failed=1
        unset "HNP[$arm]"
    done
    [ $failed = 0 ] || exit 1
}
trap stop EXIT
start topo
start notopo

# Where the ranks' topology comes from, once per arm (Open MPI's hwloc base says it).
for arm in topo notopo; do
    src=$("$B/prun" --dvm-uri "file:$OUT/$arm.uri" -n 4 -x OMPI_MCA_hwloc_base_verbose=2 "$PROG" 2>&1 |
        grep -oE 'base: topology in shared memory|loading topology from XML|discovering topology' | sort | uniq -c | xargs)
    echo "arm $arm: 4 ranks: $src" | tee -a "$OUT/machine.txt"
done

run() { # run ARM NP: one timed run, appends "rep,np,arm,ms,init_us" to the CSV
    local t0 t1
    t0=$(date +%s%N)
    "$B/prun" --dvm-uri "file:$OUT/$1.uri" -n "$2" "$PROG" >"$OUT/last.out" 2>&1 || {
        echo "arm $1 np $2 rep $rep failed:" >&2
        cat "$OUT/last.out" >&2
        exit 1
    }
    t1=$(date +%s%N)
    local init
    init=$(sed -n 's/^mpinoop MPI_Init_us //p' "$OUT/last.out")
    [ -n "$init" ] || { echo "arm $1 np $2 rep $rep: no MPI_Init line" >&2; exit 1; }
    echo "$rep,$2,$1,$(((t1 - t0) / 1000000)),$init" >>"$OUT/topo-bench.csv"
}

echo "rep,np,arm,ms,init_us" >"$OUT/topo-bench.csv"
for rep in $(seq "$REPS"); do
    if [ $((rep % 2)) = 1 ]; then order="topo notopo"; else order="notopo topo"; fi
    for np in $SIZES; do
        for arm in $order; do run $arm "$np"; done
    done
    echo "rep $rep: $(grep "^$rep," "$OUT/topo-bench.csv" | cut -d, -f2-4 | xargs) (loadavg $(cut -d' ' -f1 /proc/loadavg))"
done
stop

python3 - "$OUT/topo-bench.csv" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
by = {}
for r in rows:
    by.setdefault((int(r["np"]), r["arm"]), {})[int(r["rep"])] = (int(r["ms"]), float(r["init_us"]) / 1000)
med = statistics.median
print("\nMPI_Init+Finalize (tests/mpi/mpinoop), dvmd --local 4, OMPI_MCA_pml=ob1; ms\n")
print("| ranks | reps | topo: job median | notopo: job median | paired ratio topo/notopo: median (min-max) | rank 0 MPI_Init topo / notopo (medians) |")
print("|---:|---:|---:|---:|---|---|")
for np_ in sorted({k[0] for k in by}):
    t, n = by[(np_, "topo")], by[(np_, "notopo")]
    reps = sorted(t)
    q = [t[i][0] / n[i][0] for i in reps]
    print(f"| {np_} | {len(reps)} | {med([t[i][0] for i in reps]):.0f} | {med([n[i][0] for i in reps]):.0f} "
          f"| {med(q):.2f} ({min(q):.2f}-{max(q):.2f}) "
          f"| {med([t[i][1] for i in reps]):.0f} / {med([n[i][1] for i in reps]):.0f} |")
EOF
echo "raw: $OUT/topo-bench.csv"
