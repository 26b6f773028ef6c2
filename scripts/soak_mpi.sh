#!/usr/bin/env bash
# Memory soak (not in CI): does a persistent DVM stay flat while it serves MPI jobs?
#
#   scripts/soak_mpi.sh              # 1000 jobs of 8 ranks on a 4-daemon DVM
#   scripts/soak_mpi.sh 200          # N jobs
#   EVERY=10 PROG=hello scripts/soak_mpi.sh
#
# Boots `dvmd --local 4 --slots 2 --daemonize` (private DVM_TMPDIR), runs N jobs
# `prun -n 8 <tests/mpi/$PROG>` one after the other, and after every EVERY-th job (and after
# job 10 and the last job) reads VmRSS of every daemon and of its PMIx worker (the child process
# that hosts libpmix's server) from /proc/<pid>/status. A daemon's cost is the sum of the two.
# Prints a table, writes the samples to $OUT/soak.csv (job,rank,pid,vmrss_kib,vmhwm_kib,
# worker_pid,worker_rss_kib,total_kib; rank 0 = HNP). Fails (non-zero) if a job fails, or if any
# daemon's total at ANY sample after job 10 exceeds its total after job 10 by more than LIMIT_KIB
# (default 1024 = 1 MiB), or its own RSS does. Stops the DVM with pterm and fails if any of its
# dvmd pids (daemons and workers) is still alive 5 s later (those pids, and only those, are
# then killed).
#
# Environment: N (or $1, default 1000), NP (8), EVERY (10), PROG (mpinoop), LIMIT_KIB (1024),
# RADIX (64), OUT (a fresh /tmp/dvm-soak.* dir), SKIP_BUILD=1 to use target/release as is,
# DVMD_ARGS (extra dvmd options), PRUN_ARGS (extra prun options, e.g. the libpmix default store
# for an A/B: PRUN_ARGS="-x PMIX_GDS_MODULE=ds21,ds12,hash"). Ranks get OMPI_MCA_pml=ob1 as in
# every test of this repo.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-${N:-1000}}
NP=${NP:-8}
EVERY=${EVERY:-10}
PROG=${PROG:-mpinoop}
LIMIT_KIB=${LIMIT_KIB:-1024}
RADIX=${RADIX:-64}
OUT=${OUT:-$(mktemp -d /tmp/dvm-soak.XXXXXX)}
BASE_JOB=10
[ "$N" -ge "$BASE_JOB" ] || { echo "N must be at least $BASE_JOB" >&2; exit 2; }
mkdir -p "$OUT/bin" "$OUT/tmp"

[ "${SKIP_BUILD:-0}" = 1 ] || cargo build --release --bins
# Private copies: a concurrent `cargo build` must not swap the binaries mid-run.
cp target/release/dvmd target/release/prun target/release/pterm "$OUT/bin/"
B=$OUT/bin
make -s -C tests/mpi OUT="$OUT/mpi"
export DVM_TMPDIR=$OUT/tmp
export OMPI_MCA_pml=ob1
{
    echo "git HEAD $(git rev-parse --short HEAD) (binaries from the last cargo build)"
    (cd "$B" && sha256sum dvmd prun pterm)
    echo "libpmix $(dpkg-query -W -f='${Version}' libpmix2 2>/dev/null || echo '?'); open mpi $(dpkg-query -W -f='${Version}' openmpi-bin 2>/dev/null || echo '?')"
    echo "nproc $(nproc); kernel $(uname -r); loadavg at start: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "jobs $N x prun -n $NP ${PRUN_ARGS:-} $PROG; 4 daemons, radix $RADIX; sample every $EVERY jobs; limit $LIMIT_KIB KiB"
} | tee "$OUT/machine.txt"

URI_FILE=$OUT/dvm.uri
PIDS=()
stop() {
    [ -n "$URI_FILE" ] || return 0
    local left=() all=("${PIDS[@]}") p i
    # The PMIx workers running now must end with their daemons too.
    for p in "${PIDS[@]}"; do
        mapfile -t -O "${#all[@]}" all < <(pgrep -P "$p" -x pmix-worker || true)
    done
    "$B/pterm" --dvm-uri "file:$URI_FILE" >/dev/null || echo "pterm failed" >&2
    URI_FILE=
    for i in $(seq 50); do
        left=()
        for p in "${all[@]}"; do
            # A zombie (state Z) has exited; count only live processes.
            if [ -r "/proc/$p/stat" ] && [ "$(awk '{print $3}' "/proc/$p/stat")" != Z ]; then left+=("$p"); fi
        done
        [ ${#left[@]} -eq 0 ] && break
        sleep 0.1
    done
    if [ ${#left[@]} -ne 0 ]; then
        echo "FAIL: dvmd pids still alive 5 s after pterm: ${left[*]}; killing them" >&2
        kill -9 "${left[@]}" 2>/dev/null || true
        return 1
    fi
    echo "pterm: all ${#all[@]} dvmd pids (daemons and PMIx workers) gone (${all[*]})"
}
trap 'stop || true' EXIT

# shellcheck disable=SC2086
"$B/dvmd" --local 4 --slots $(((NP + 3) / 4)) --radix "$RADIX" --report-uri "$URI_FILE" --daemonize ${DVMD_ARGS:-} >/dev/null
# The HNP pid is in its session dir name: dvm://ip:port/<tmp>/dvm-<uid>/dvm-<pid>-<tag>; the
# other daemons are its children.
hnp=$(sed -E 's#.*/dvm-([0-9]+)-[0-9a-f]+$#\1#' "$URI_FILE")
mapfile -t PIDS < <(echo "$hnp"; pgrep -P "$hnp" -f -- '--daemon ' )
if [ "${#PIDS[@]}" -ne 4 ]; then
    echo "boot: expected 4 dvmd processes, found ${#PIDS[@]}: ${PIDS[*]}" >&2
    exit 1
fi
echo "DVM up: dvmd pids ${PIDS[*]} (rank 0 = HNP)"

declare -A BASE LAST BASE_OWN LAST_OWN PEAK PEAK_OWN
WORKERS=()
echo "job,rank,pid,vmrss_kib,vmhwm_kib,worker_pid,worker_rss_kib,total_kib" >"$OUT/soak.csv"
sample() { # sample JOB: append to the CSV, print one table row, remember the values
    local rank=0 p r h w wr t row
    row=$(printf '%6s' "$1")
    for p in "${PIDS[@]}"; do
        read -r r h < <(awk '/^VmRSS/{r=$2} /^VmHWM/{h=$2} END{print r, h}' "/proc/$p/status")
        # The daemon's PMIx worker, if one runs now (it is replaced while idle).
        w=$(pgrep -P "$p" -x pmix-worker | head -1 || true)
        wr=0
        if [ -n "$w" ]; then
            wr=$(awk '/^VmRSS/{print $2}' "/proc/$w/status" 2>/dev/null || echo 0)
            WORKERS+=("$w")
        fi
        t=$((r + ${wr:-0}))
        echo "$1,$rank,$p,$r,$h,${w:-},${wr:-0},$t" >>"$OUT/soak.csv"
        if [ "$1" = "$BASE_JOB" ]; then BASE[$rank]=$t; BASE_OWN[$rank]=$r; PEAK[$rank]=$t; PEAK_OWN[$rank]=$r; fi
        if [ "$1" -gt "$BASE_JOB" ]; then
            [ "$t" -gt "${PEAK[$rank]}" ] && PEAK[$rank]=$t
            [ "$r" -gt "${PEAK_OWN[$rank]}" ] && PEAK_OWN[$rank]=$r
        fi
        LAST[$rank]=$t
        LAST_OWN[$rank]=$r
        row+=$(printf ' %7s+%-6s' "$r" "${wr:-0}")
        rank=$((rank + 1))
    done
    echo "$row    $(cut -d' ' -f1 /proc/loadavg)"
}

printf '%6s' job; for r in 0 1 2 3; do printf ' %14s' "d$r+worker KiB"; done; echo "    load"
sample 0
t0=$(date +%s)
for j in $(seq "$N"); do
    # shellcheck disable=SC2086
    if ! "$B/prun" --dvm-uri "file:$URI_FILE" -n "$NP" ${PRUN_ARGS:-} "$OUT/mpi/$PROG" >"$OUT/last-job.out" 2>&1; then
        echo "FAIL: job $j failed:" >&2
        cat "$OUT/last-job.out" >&2
        exit 1
    fi
    if [ "$j" = "$BASE_JOB" ] || [ "$j" = "$N" ] || [ $((j % EVERY)) = 0 ]; then sample "$j"; fi
done
t1=$(date +%s)

echo
echo "$N jobs in $((t1 - t0)) s; daemon + PMIx worker RSS after job $BASE_JOB vs after job $N, and the"
echo "highest sample after job $BASE_JOB (KiB; the daemon's own RSS in brackets):"
fail=0
for rank in 0 1 2 3; do
    d=$((LAST[$rank] - BASE[$rank]))
    peak=$((PEAK[$rank] - BASE[$rank]))
    peak_own=$((PEAK_OWN[$rank] - BASE_OWN[$rank]))
    verdict=ok
    if [ "$peak" -gt "$LIMIT_KIB" ] || [ "$peak_own" -gt "$LIMIT_KIB" ]; then verdict="FAIL (> $LIMIT_KIB KiB)"; fail=1; fi
    printf 'daemon %d (pid %s): %8d -> %8d  (%+d KiB, %+.1f B/job; peak %+d KiB) [own %d -> %d, peak %+d]  %s\n' \
        "$rank" "${PIDS[$rank]}" "${BASE[$rank]}" "${LAST[$rank]}" "$d" \
        "$(awk -v d="$d" -v n="$((N - BASE_JOB))" 'BEGIN{print d * 1024 / n}')" "$peak" \
        "${BASE_OWN[$rank]}" "${LAST_OWN[$rank]}" "$peak_own" "$verdict"
done | tee "$OUT/summary.txt"
echo "PMIx workers seen: $(printf '%s\n' "${WORKERS[@]}" | sort -u | wc -l) (a new one each time a daemon replaced its worker)" | tee -a "$OUT/summary.txt"
grep -q FAIL "$OUT/summary.txt" && fail=1
trap - EXIT
stop || fail=1
echo "CSV: $OUT/soak.csv"
if [ "$fail" != 0 ]; then
    echo "SOAK FAILED"
    exit 1
fi
echo "SOAK PASSED"
