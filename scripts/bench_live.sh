#!/usr/bin/env bash
# Reproduce docs/dvm-bench.{md,csv}: live collective benchmark and idle RSS on local DVMs.
#
#   scripts/bench_live.sh            # build, measure, write docs/dvm-bench.csv (+ .png), print tables
#   REPS=3 COUNT=50 scripts/bench_live.sh
#
# 1. 16 daemons, radix 2 vs 64, default dvm-bench sizes, REPS repetitions, arms interleaved and
#    the order flipped each repetition (2,64 / 64,2 / ...).
# 2. 8 daemons, radix 2 vs 64, barrier + modex 64 B/daemon, REPS8 repetitions, same interleaving.
# 3. Idle RSS (VmRSS from /proc) of every dvmd of a 16-daemon DVM 2 s after `DVM ready`, radix 2
#    and 64; and the RSS / high-water mark after each phase-1 benchmark, before pterm.
# Every DVM is stopped with pterm; the script then checks that none of its dvmd pids is left
# (and kills exactly those pids, failing, if one is).
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-3}
REPS8=${REPS8:-5}
COUNT=${COUNT:-50}      # ops per measurement for phase 1 (1 MiB modex is ~1 s each on 2 cores)
COUNT8=${COUNT8:-200}   # ops per measurement for phase 2
OUT=${OUT:-$(mktemp -d /tmp/dvm-bench-live.XXXXXX)}
mkdir -p "$OUT/bin"

[ "${SKIP_BUILD:-0}" = 1 ] || cargo build --release --bins
# Private copies: a concurrent `cargo build` must not swap the binaries mid-run.
cp target/release/dvmd target/release/dvm-bench target/release/pterm "$OUT/bin/"
B=$OUT/bin
{
    echo "git HEAD $(git rev-parse --short HEAD) (binaries built from the tree at the last cargo build)"
    (cd "$B" && sha256sum dvmd dvm-bench pterm)
    echo "nproc $(nproc); kernel $(uname -r); cpu $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
    echo "loadavg at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT/machine.txt"

PIDS=()   # pids of the DVM currently running (HNP first)
URI_FILE=

boot() { # boot N RADIX
    URI_FILE="$OUT/dvm.uri"
    rm -f "$URI_FILE"
    $B/dvmd --local "$1" --radix "$2" --report-uri "$URI_FILE" --daemonize >/dev/null
    # The HNP pid is in its session dir name: dvm://ip:port/<tmp>/dvm-<uid>/dvm-<pid>-<tag>.
    local hnp
    hnp=$(sed -E 's#.*/dvm-([0-9]+)-[0-9a-f]+$#\1#' "$URI_FILE")
    mapfile -t PIDS < <(echo "$hnp"; ps -o pid= --ppid "$hnp" | tr -d ' ')
    if [ "${#PIDS[@]}" -ne "$1" ]; then
        echo "boot: expected $1 dvmd processes, found ${#PIDS[@]}: ${PIDS[*]}" >&2
        exit 1
    fi
}

stop() {
    [ -n "$URI_FILE" ] || return 0
    $B/pterm --dvm-uri "file:$URI_FILE" >/dev/null || echo "pterm failed" >&2
    local left=() p i
    for i in $(seq 50); do
        left=()
        for p in "${PIDS[@]}"; do
            # A zombie (state Z) is already gone; count only live processes.
            if [ -r /proc/$p/stat ] && [ "$(awk '{print $3}' /proc/$p/stat)" != Z ]; then left+=("$p"); fi
        done
        [ ${#left[@]} -eq 0 ] && break
        sleep 0.1
    done
    URI_FILE=
    if [ ${#left[@]} -ne 0 ]; then
        echo "stop: dvmd pids still alive 5 s after pterm: ${left[*]}; killing them" >&2
        kill -9 "${left[@]}" 2>/dev/null || true
        exit 1
    fi
}
trap stop EXIT

rss() { # rss TAG: one line per daemon: tag,rank,pid,vmrss_kib,vmhwm_kib (rank 0 = HNP)
    local rank=0 p
    for p in "${PIDS[@]}"; do
        echo "$1,$rank,$p,$(awk '/^VmRSS/{r=$2} /^VmHWM/{h=$2} END{print r","h}' /proc/$p/status)"
        rank=$((rank + 1))
    done
}

echo "tag,rank,pid,vmrss_kib,vmhwm_kib" >"$OUT/rss.csv"

# Phase 3 first (fresh DVMs, nothing run on them yet).
for radix in 2 64; do
    boot 16 $radix
    sleep 2
    rss "idle-n16-r$radix" >>"$OUT/rss.csv"
    stop
done

# Phase 1: 16 daemons, default sizes.
for rep in $(seq "$REPS"); do
    if [ $((rep % 2)) = 1 ]; then order="2 64"; else order="64 2"; fi
    for radix in $order; do
        echo "== 16 daemons radix $radix rep $rep ($(cut -d' ' -f1-3 /proc/loadavg))"
        boot 16 $radix
        $B/dvm-bench --dvm-uri "file:$URI_FILE" --count "$COUNT" --csv "$OUT/n16-r$radix-rep$rep.csv"
        rss "after-bench-n16-r$radix-rep$rep" >>"$OUT/rss.csv"
        stop
    done
done

# Phase 2: 8 daemons, barrier and modex 64 B/daemon in the same run.
for rep in $(seq "$REPS8"); do
    if [ $((rep % 2)) = 1 ]; then order="2 64"; else order="64 2"; fi
    for radix in $order; do
        echo "== 8 daemons radix $radix rep $rep ($(cut -d' ' -f1-3 /proc/loadavg))"
        boot 8 $radix
        $B/dvm-bench --dvm-uri "file:$URI_FILE" --count "$COUNT8" --modex-bytes 0,64 --xcast-bytes 64 \
            --csv "$OUT/n8-r$radix-rep$rep.csv"
        stop
    done
done
echo "loadavg at end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/machine.txt"

mine=$(pgrep -x dvmd || true)
[ -z "$mine" ] || echo "note: dvmd processes not started by this script are running: $mine" >&2

/usr/bin/python3 scripts/plot_bench.py "$OUT" docs/dvm-bench.csv docs/dvm-bench.png
echo "raw files in $OUT"
