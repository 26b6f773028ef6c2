#!/usr/bin/env bash
# File staging against its alternatives on N network-namespace nodes whose links are limited
# with tbf (default 16 nodes at 1 Gbit/s each way): for each file size, in the same run,
#   dvm        pbcast on the DVM's default movement (large segments on scatter-allgather)
#   dvm-clear  the same with --link-security none (frames in clear, as the copies below are)
#   dvm-tree   pbcast on a DVM whose broadcasts all take the whole-payload tree
#   dvm-z      pbcast --compress (each segment deflated at the head, inflated on each node)
#   copy-seq   one TCP stream from the head to each node in turn (socat)
#   copy-par   one TCP stream from the head to every node at once
# against the limit: the file at the link rate, plus a few latencies. Also the largest rise of
# any daemon's RSS over its idle size during each dvm transfer. Files land on a tmpfs (every
# fake node shares this machine's disk, which a real cluster would not).
#
#   sudo scripts/bench_staging.sh                    # builds release binaries first
#   SKIP_BUILD=1 SIZES=1,64,512 REPS=3 COPY_REPS=1 RADIX=64 OUT=/tmp/st scripts/bench_staging.sh
#   ARMS=dvm PBCAST_ARGS='--segment-kib 1024 --window 8' SIZES=64 scripts/bench_staging.sh
#
# Prints a table and writes OUT/staging.csv and OUT/staging.png. Needs root (namespaces, tc,
# mount). Everything it starts is stopped on exit; the fake nodes and the tmpfs are removed.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-16} RATE=${RATE:-1gbit} RADIX=${RADIX:-64} REPS=${REPS:-3} COPY_REPS=${COPY_REPS:-1}
SIZES=${SIZES:-1,64,512} BIN=${BIN:-target/release} OUT=${OUT:-${TMPDIR:-/tmp}/dvm-staging}
ARMS=${ARMS:-dvm,dvm-clear,dvm-tree,copy-seq,copy-par} PBCAST_ARGS=${PBCAST_ARGS:-}
if [ "$(id -u)" != 0 ]; then
    echo "bench_staging.sh: needs root (network namespaces, tc, a tmpfs); run it with sudo" >&2
    exit 1
fi
scripts/prereqs.sh bench
if [ -z "${SKIP_BUILD:-}" ]; then
    cargo build --release -p dvmd --bins -p dvm-tests --example fake_cluster
fi
case $RATE in
    *gbit) rate_bps=$(( ${RATE%gbit} * 125000000 )) ;;
    *mbit) rate_bps=$(( ${RATE%mbit} * 125000 )) ;;
    *) echo "bench_staging.sh: RATE is NNgbit or NNmbit, not '$RATE'" >&2; exit 1 ;;
esac
rm -rf "$OUT" && mkdir -p "$OUT/dst" "$OUT/src"
export DVM_TMPDIR=$OUT/tmp
mkdir -p "$DVM_TMPDIR"
largest=$(tr , '\n' <<<"$SIZES" | sort -n | tail -1)
mount -t tmpfs -o "size=$(( (N + 2) * largest + 1024 ))m" dvm-staging "$OUT/dst"

source scripts/netns_cluster.sh
sampler=
cleanup() {
    [ -n "$sampler" ] && kill "$sampler" 2>/dev/null || true
    netns_cluster_down
    umount "$OUT/dst" 2>/dev/null || true
}
trap cleanup EXIT
netns_cluster_up bench_staging.sh "$N" 1 "$OUT"
netns_limit "$N" "$RATE"
sub=${fact[head]%.*}
echo "# $N nodes, links limited to $RATE each way (tbf), radix $RADIX, files on tmpfs, pbcast ${PBCAST_ARGS:-(defaults)}, $(git rev-parse --short HEAD)"

# CONTENT=random (default: nothing to compress) or text (CSV-like lines, about 2.2:1 deflated).
for s in ${SIZES//,/ }; do
    case ${CONTENT:-random} in
        random) head -c "$((s << 20))" /dev/urandom >"$OUT/src/f$s" ;;
        text) python3 -c "
import random, sys
r, n, out = random.Random($s), $((s << 20)), sys.stdout.buffer
while n > 0:
    line = ('%08d,%.6f,%s,node%03d\\n' % (r.randrange(10**8), r.random() * 1e3, r.choice(['ok', 'warn', 'fail']), r.randrange(512))).encode()
    out.write(line[:n]); n -= len(line)" >"$OUT/src/f$s" ;;
        *) echo "bench_staging.sh: CONTENT is random or text, not '$CONTENT'" >&2; exit 1 ;;
    esac
done
echo "arm,mib,rep,seconds,limit_s,ratio_to_limit,rss_rise_mib,daemon_cores,machine_busy" >"$OUT/staging.csv"

# RSS of every daemon, sampled at 20 Hz until SIGTERM; prints the largest rise over the
# first sample (MiB), over all of them. Run as its own process (so SIGTERM reaches it).
RSS_PY=$(cat <<'PY'
import signal, sys, time
pids = sys.argv[1:]
def rss(p):
    try:
        for line in open(f"/proc/{p}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
idle = {p: rss(p) for p in pids}
peak = dict(idle)
def done(*_):
    rise = max((peak[p] - idle[p]) for p in pids if idle[p] is not None and peak[p] is not None)
    print(f"{rise / 1024:.1f}", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, done)
while True:
    for p in pids:
        r = rss(p)
        if r is not None and peak[p] is not None:
            peak[p] = max(peak[p], r)
    time.sleep(0.05)
PY
)

# CPU seconds (user + system) the given pids used so far.
cpu_of() {
    local p t=0
    for p in "$@"; do
        # Fields 14 and 15 of /proc/PID/stat, after the command name in parentheses.
        [ -r "/proc/$p/stat" ] && t=$((t + $(sed 's/.*) //' "/proc/$p/stat" | awk '{print $12 + $13}')))
    done
    python3 -c "import os; print($t / os.sysconf('SC_CLK_TCK'))"
}
# Busy and total jiffies of the whole machine.
machine_ticks() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat; }

limit_of() { python3 -c "print(f'{$1 * 1048576 / $rate_bps + 0.005:.3f}')"; }

row() { # arm mib rep seconds rss [daemon_cores machine_busy]
    local lim ratio
    lim=$(limit_of "$2")
    ratio=$(python3 -c "print(f'{$4 / $lim:.2f}')")
    echo "$1,$2,$3,$4,$lim,$ratio,$5,${6:-},${7:-}" >>"$OUT/staging.csv"
    printf '%-9s %5s MiB  rep %s  %8.3f s  %5.2fx the limit  rss +%s MiB  %s\n' "$1" "$2" "$3" "$4" "$ratio" "$5" \
        "${6:+daemons used $6 cores, the machine was $7 busy}"
}

dvm_arm() { # arm movement pbcast-options [dvmd options]
    local arm=$1 movement=$2 extra=$3 s rep t0 t1 pids rss_file
    shift 3
    netns_dvm bench_staging.sh "$OUT" --radix "$RADIX" --bcast-movement "$movement" "$@"
    pids="$hnp_pid $(pgrep -f -- "$BIN/dvmd.*--rank=" | tr '\n' ' ')"
    for s in ${SIZES//,/ }; do
        for rep in $(seq "$REPS"); do
            rss_file=$OUT/rss
            python3 -c "$RSS_PY" $pids >"$rss_file" &
            sampler=$!
            sleep 0.3
            # shellcheck disable=SC2086 # a list of pids
            c0=$(cpu_of $pids)
            read -r b0 a0 < <(machine_ticks)
            t0=$(date +%s.%N)
            # shellcheck disable=SC2086 # PBCAST_ARGS is a list of options
            "$BIN/pbcast" --dvm-uri "file:$OUT/uri" --quiet $PBCAST_ARGS $extra "$OUT/src/f$s" "$OUT/dst/%n/f"
            t1=$(date +%s.%N)
            read -r b1 a1 < <(machine_ticks)
            # shellcheck disable=SC2086 # a list of pids
            c1=$(cpu_of $pids)
            kill "$sampler"
            wait "$sampler" || true
            sampler=
            if [ "$rep" = 1 ]; then
                want=$(sha256sum <"$OUT/src/f$s")
                for d in "$OUT"/dst/*/; do
                    [ "$(sha256sum <"$d/f")" = "$want" ] || { echo "bench_staging.sh: $d/f differs" >&2; exit 1; }
                done
            fi
            rm -rf "${OUT:?}"/dst/*
            row "$arm" "$s" "$rep" "$(python3 -c "print(f'{$t1 - $t0:.3f}')")" "$(cat "$rss_file")" \
                "$(python3 -c "print(f'{($c1 - $c0) / ($t1 - $t0):.2f}')")" \
                "$(python3 -c "print(f'{($b1 - $b0) / max(1, $a1 - $a0):.2f}')")"
        done
    done
    "$BIN/pterm" --dvm-uri "file:$OUT/uri" >/dev/null
    wait "$hnp_pid" || true
    hnp_pid=
    rm -f "$OUT/uri"
}

# One socat listener in node i's namespace, writing to the tmpfs; returns once it listens.
listen() {
    local i=$1
    mkdir -p "$OUT/dst/$i"
    ip netns exec "dvm${k}n$i" socat -u TCP-LISTEN:7000,reuseaddr "OPEN:$OUT/dst/$i/f,creat,trunc" &
    listeners+=($!)
    for _ in $(seq 100); do
        ip netns exec "dvm${k}n$i" ss -ltn 2>/dev/null | grep -q ':7000 ' && return 0
        sleep 0.02
    done
    echo "bench_staging.sh: socat did not listen in node $i" >&2
    exit 1
}

copy_arm() { # arm parallel?
    local arm=$1 par=$2 s rep i t0 t1
    for s in ${SIZES//,/ }; do
        for rep in $(seq "$COPY_REPS"); do
            listeners=()
            if [ "$par" = 1 ]; then
                for ((i = 0; i < N; i++)); do listen "$i"; done
                t0=$(date +%s.%N)
                senders=()
                for ((i = 0; i < N; i++)); do
                    socat -u "OPEN:$OUT/src/f$s" "TCP:$sub.$((10 + i)):7000" &
                    senders+=($!)
                done
                wait "${senders[@]}" "${listeners[@]}"
                t1=$(date +%s.%N)
            else
                t0=$(date +%s.%N)
                for ((i = 0; i < N; i++)); do
                    listen "$i"
                    socat -u "OPEN:$OUT/src/f$s" "TCP:$sub.$((10 + i)):7000"
                    wait "${listeners[-1]}"
                done
                t1=$(date +%s.%N)
            fi
            want=$(sha256sum <"$OUT/src/f$s")
            for ((i = 0; i < N; i++)); do
                [ "$(sha256sum <"$OUT/dst/$i/f")" = "$want" ] || { echo "bench_staging.sh: copy to node $i differs" >&2; exit 1; }
            done
            rm -rf "${OUT:?}"/dst/*
            row "$arm" "$s" "$rep" "$(python3 -c "print(f'{$t1 - $t0:.3f}')")" ""
        done
    done
}

for arm in ${ARMS//,/ }; do
    case $arm in
        dvm) dvm_arm dvm auto "" ;;
        dvm-clear) dvm_arm dvm-clear auto "" --link-security none ;;
        dvm-tree) dvm_arm dvm-tree tree "" ;;
        dvm-z) dvm_arm dvm-z auto --compress ;;
        copy-seq) copy_arm copy-seq 0 ;;
        copy-par) copy_arm copy-par 1 ;;
        *) echo "bench_staging.sh: unknown arm '$arm' (dvm, dvm-clear, dvm-tree, dvm-z, copy-seq, copy-par)" >&2; exit 1 ;;
    esac
done
# Debian's python3 has matplotlib (scripts/prereqs.sh); another one first in PATH may not.
/usr/bin/python3 scripts/plot_staging.py "$OUT/staging.csv" "$OUT/staging.png" "$N" "$RATE" "$RADIX"
