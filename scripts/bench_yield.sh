#!/usr/bin/env bash
# Oversubscribed MPI job: do ranks told to yield (dvmd's default when a machine holds more of a
# job's procs than cores) beat busy-polling ranks? Writes the table of docs/yield-bench.md.
#
#   scripts/bench_yield.sh                          # build (release), measure, print tables
#   NP=6 ROUNDS=500 REPS=6 scripts/bench_yield.sh
#   SKIP_BUILD=1 BIN=target/debug scripts/bench_yield.sh   # binaries already built
#
# One persistent 1-daemon DVM (`dvmd --local 1`); NP ranks of tests/mpi/collectives (ROUNDS
# rounds of MPI_Allreduce + MPI_Barrier) per run. Three arms, the same program and MCA settings
# (OMPI_MCA_pml=ob1 in the environment of dvmd and mpirun, so of every rank):
#   yield    prun as built (NP > cores: the ranks get OMPI_MCA_mpi_yield_when_idle=1)
#   poll     prun -x OMPI_MCA_mpi_yield_when_idle=0 (the behaviour before: ranks busy-poll)
#   mpirun   mpirun --oversubscribe (Open MPI's own launcher, which sets yield itself)
# Interleaved ABBA: odd repetitions run yield, poll, mpirun; even ones mpirun, poll, yield.
# Wall time of each command (launch to exit) in ms; medians and per-repetition paired ratios.
# Not part of CI: it measures, and the poll arm alone takes ~20 s per run on 2 cores.
# The DVM is stopped with pterm; its pid is then checked (and killed, failing, if left).
set -euo pipefail
cd "$(dirname "$0")/.."
NP=${NP:-4}
ROUNDS=${ROUNDS:-500}
REPS=${REPS:-6}
BIN=${BIN:-target/release}
OUT=${OUT:-$(mktemp -d /tmp/dvm-bench-yield.XXXXXX)}
mkdir -p "$OUT/bin" "$OUT/mpi"

[ "${SKIP_BUILD:-0}" = 1 ] || cargo build --release --bins
# Private copies: a concurrent `cargo build` must not swap the binaries mid-run.
cp "$BIN/dvmd" "$BIN/prun" "$BIN/pterm" "$OUT/bin/"
B=$OUT/bin
make -s -C tests/mpi OUT="$OUT/mpi"
PROG=$OUT/mpi/collectives

unset OMPI_MCA_mpi_yield_when_idle
export OMPI_MCA_pml=ob1
export DVM_TMPDIR=$OUT
if [ "$(id -u)" = 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
CORES=$(nproc)
{
    echo "git HEAD $(git rev-parse --short HEAD); binaries from $BIN"
    echo "cores (nproc) $CORES; kernel $(uname -r); cpu $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
    echo "$(mpirun --version 2>&1 | head -1); loadavg at start: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "NP=$NP ROUNDS=$ROUNDS REPS=$REPS"
} | tee "$OUT/machine.txt"

URI_FILE=$OUT/dvm.uri
HNP=
$B/dvmd --local 1 --slots "$NP" --report-uri "$URI_FILE" --daemonize >/dev/null
# The HNP pid is in its session dir name: dvm://ip:port/<tmp>/dvm-<uid>/dvm-<pid>-<tag>.
HNP=$(sed -E 's#.*/dvm-([0-9]+)-[0-9a-f]+$#\1#' "$URI_FILE")

stop() {
    [ -n "$HNP" ] || return 0
    $B/pterm --dvm-uri "file:$URI_FILE" >/dev/null || echo "pterm failed" >&2
    local i
    for i in $(seq 50); do
        if ! [ -r /proc/$HNP/stat ] || [ "$(awk '{print $3}' /proc/$HNP/stat)" = Z ]; then
            HNP=
            return 0
        fi
        sleep 0.1
    done
    echo "stop: dvmd pid $HNP still alive 5 s after pterm; killing it" >&2
    kill -9 "$HNP" 2>/dev/null || true
    HNP=
    exit 1
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
    if [ $((rep % 2)) = 1 ]; then order="yield poll mpirun"; else order="mpirun poll yield"; fi
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
for arm, label in [("yield", "prun (as built: yield)"), ("poll", "prun -x ...yield_when_idle=0 (busy-poll)"), ("mpirun", "mpirun --oversubscribe")]:
    v = [by[arm][i] for i in reps]
    print(f"| {label} | {med(v):.0f} | {min(v)} | {max(v)} |")
print("\n| paired ratio (per repetition) | median | min | max |")
print("|---|---:|---:|---:|")
for a, b in [("yield", "mpirun"), ("poll", "mpirun"), ("poll", "yield")]:
    q = [by[a][i] / by[b][i] for i in reps]
    print(f"| {a} / {b} | {med(q):.2f} | {min(q):.2f} | {max(q):.2f} |")
EOF
echo "raw: $OUT/yield-bench.csv"
