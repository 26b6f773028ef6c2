#!/usr/bin/env bash
# Oversubscribed MPI job: do ranks told to yield (dvmd's default when a machine holds more of a
# job's procs than cores) beat busy-polling ranks? Writes the table of docs/yield-bench.md.
#
#   scripts/bench_yield.sh                          # build (release), measure, print tables
#   NP=6 ROUNDS=500 REPS=6 scripts/bench_yield.sh
#   SKIP_BUILD=1 BIN=target/debug scripts/bench_yield.sh   # binaries already built
#
# One persistent 1-daemon DVM (`dvmd --local 1`); NP ranks of tests/mpi/collectives (ROUNDS
# rounds of MPI_Allreduce + MPI_Barrier) per run. Four arms, the same program and MCA settings
# (OMPI_MCA_pml=ob1 in the environment of dvmd and mpirun, so of every rank):
#   yield    prun as built (NP > cores: the ranks get OMPI_MCA_mpi_yield_when_idle=1 and a
#            2 ms timer slack)
#   noslack  prun -x DVM_TIMER_SLACK_US=0 (yield, the kernel's default timer slack)
#   poll     prun -x OMPI_MCA_mpi_yield_when_idle=0 (the behaviour before: ranks busy-poll)
#   mpirun   mpirun --oversubscribe (Open MPI's own launcher, which sets yield itself)
# Interleaved ABBA: odd repetitions run the arms in that order, even ones in reverse.
# Wall time of each command (launch to exit) in ms; medians and per-repetition paired ratios.
# Not part of CI: it measures, and the poll arm alone takes ~20 s per run on 2 cores.
# The DVM is stopped with pterm; its pid is then checked (and killed, failing, if left).
set -euo pipefail
cd "$(dirname "$0")/.."
NP=${NP:-4}
ROUNDS=${ROUNDS:-500}
REPS=${REPS:-6}
# shellcheck source=bench_common.sh
source scripts/bench_common.sh
bench_prepare yield
PROG=$OUT/mpi/collectives

unset OMPI_MCA_mpi_yield_when_idle
CORES=$(nproc)
bench_header "NP=$NP ROUNDS=$ROUNDS REPS=$REPS"

URI_FILE=$OUT/dvm.uri
HNP=
$B/dvmd --local 1 --slots "$NP" --report-uri "$URI_FILE" --daemonize >/dev/null
HNP=$(hnp_of_uri "$URI_FILE")

stop() {
    [ -n "$HNP" ] || return 0
    local pid=$HNP
    HNP=
    stop_dvm "$URI_FILE" "$pid" dvm || exit 1
}
trap stop EXIT

PRUN=("$B/prun" --dvm-uri "file:$URI_FILE")
# What the ranks see, once per prun arm.
for arm in yield poll; do
    x=()
    [ $arm = poll ] && x=(-x OMPI_MCA_mpi_yield_when_idle=0)
    seen=$("${PRUN[@]}" "${x[@]}" -n "$NP" sh -c 'echo "${OMPI_MCA_mpi_yield_when_idle:-unset}"' | sort | uniq -c | xargs)
    echo "arm $arm: the $NP ranks see OMPI_MCA_mpi_yield_when_idle = $seen" | tee -a "$OUT/machine.txt"
done

run() { # run ARM: one timed run, appends "rep,arm,ms" to the CSV
    local cmd
    case $1 in
    yield) cmd=("${PRUN[@]}" -n "$NP" "$PROG" "$ROUNDS") ;;
    noslack) cmd=("${PRUN[@]}" -x DVM_TIMER_SLACK_US=0 -n "$NP" "$PROG" "$ROUNDS") ;;
    poll) cmd=("${PRUN[@]}" -x OMPI_MCA_mpi_yield_when_idle=0 -n "$NP" "$PROG" "$ROUNDS") ;;
    mpirun) cmd=(mpirun --oversubscribe -n "$NP" "$PROG" "$ROUNDS") ;;
    esac
    local t0 t1
    t0=$(date +%s%N)
    "${cmd[@]}" >"$OUT/last.out" 2>&1 || {
        echo "arm $1 rep $rep failed:" >&2
        cat "$OUT/last.out" >&2
        exit 1
    }
    t1=$(date +%s%N)
    grep -q "collectives $ROUNDS rounds on $NP ranks ok" "$OUT/last.out" || { echo "arm $1 rep $rep: no ok line" >&2; exit 1; }
    echo "$rep,$1,$(((t1 - t0) / 1000000))" >>"$OUT/yield-bench.csv"
}

echo "rep,arm,ms" >"$OUT/yield-bench.csv"
for rep in $(seq "$REPS"); do
    if [ $((rep % 2)) = 1 ]; then order="yield noslack poll mpirun"; else order="mpirun poll noslack yield"; fi
    for arm in $order; do run $arm; done
    echo "rep $rep: $(grep "^$rep," "$OUT/yield-bench.csv" | cut -d, -f2,3 | xargs) (loadavg $(cut -d' ' -f1 /proc/loadavg))"
done
stop

python3 - "$OUT/yield-bench.csv" "$NP" "$ROUNDS" "$CORES" <<'EOF'
import csv, statistics, sys
path, np_, rounds, cores = sys.argv[1:]
rows = list(csv.DictReader(open(path)))
by = {}
for r in rows:
    by.setdefault(r["arm"], {})[int(r["rep"])] = int(r["ms"])
reps = sorted(by["yield"])
med = lambda xs: statistics.median(xs)
print(f"\n{np_} ranks x {rounds} rounds (MPI_Allreduce + MPI_Barrier) on one daemon, {cores} cores, {len(reps)} repetitions\n")
print("| arm | median ms | min ms | max ms |")
print("|---|---:|---:|---:|")
for arm, label in [("yield", "prun (as built: yield, 2 ms timer slack)"), ("noslack", "prun -x DVM_TIMER_SLACK_US=0 (yield only)"), ("poll", "prun -x ...yield_when_idle=0 (busy-poll)"), ("mpirun", "mpirun --oversubscribe")]:
    v = [by[arm][i] for i in reps]
    print(f"| {label} | {med(v):.0f} | {min(v)} | {max(v)} |")
print("\n| paired ratio (per repetition) | median | min | max |")
print("|---|---:|---:|---:|")
for a, b in [("yield", "mpirun"), ("noslack", "mpirun"), ("poll", "mpirun"), ("yield", "noslack"), ("poll", "yield")]:
    q = [by[a][i] / by[b][i] for i in reps]
    print(f"| {a} / {b} | {med(q):.2f} | {min(q):.2f} | {max(q):.2f} |")
EOF
echo "raw: $OUT/yield-bench.csv"
