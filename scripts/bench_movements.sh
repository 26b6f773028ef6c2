#!/usr/bin/env bash
# A/B of the tree against the lateral movements (fence allgather, broadcast scatter-allgather)
# on N network-namespace nodes whose links are rate-limited with tbf, so that β is a cluster's
# link rather than memory bandwidth. One DVM; `dvm-bench --compare-movements` runs each size as
# tree, lateral, lateral, tree, REPS times, and prints paired ratios (lateral / tree).
#
#   sudo scripts/bench_movements.sh                  # builds release binaries first
#   SKIP_BUILD=1 N=16 RATE=1gbit RADIX=64 REPS=5 OUT=/tmp/mv scripts/bench_movements.sh
#   CHECK_FENCES=10000 MOVEMENT=auto RADIX=2 scripts/bench_movements.sh   # a checked fence storm
#                                     # instead of the A/B (no timing; MOVEMENT auto|tree|allgather)
#
# Needs root (namespaces, tc). Everything it starts is stopped on exit, and the fake nodes
# are removed.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-16} RATE=${RATE:-1gbit} RADIX=${RADIX:-64} REPS=${REPS:-5} COUNT=${COUNT:-50}
BIN=${BIN:-target/release} OUT=${OUT:-/tmp/dvm-movements}
MODEX=${MODEX:-64,65536} XCAST=${XCAST:-65536,1048576}
if [ "$(id -u)" != 0 ]; then
    echo "bench_movements.sh: needs root (network namespaces and tc); run it with sudo" >&2
    exit 1
fi
if [ -z "${SKIP_BUILD:-}" ]; then
    scripts/prereqs.sh build
    cargo build --release -p dvmd --bins -p dvm-tests --example fake_cluster
fi
FC=${FC_BIN:-$BIN/examples/fake_cluster}
rm -rf "$OUT" && mkdir -p "$OUT"
export DVM_TMPDIR=$OUT/tmp
mkdir -p "$DVM_TMPDIR"

coproc FCP { "$FC" "$N" 1 "$OUT/hosts"; }
fc_pid=$FCP_PID
hnp_pid=
cleanup() {
    [ -n "$hnp_pid" ] && kill "$hnp_pid" 2>/dev/null && wait "$hnp_pid" 2>/dev/null || true
    # Closing the cluster's stdin tears it down (and kills anything left inside the nodes).
    exec {FCP[1]}>&- 2>/dev/null || true
    wait "$fc_pid" 2>/dev/null || true
}
trap cleanup EXIT
declare -A fact
while read -r line <&"${FCP[0]}"; do
    [ "$line" = ready ] && break
    case $line in node=*) ;; *=*) fact[${line%%=*}]=${line#*=} ;; esac
done
k=${fact[k]}
[ -n "$k" ] || { echo "bench_movements.sh: the fake cluster did not start" >&2; exit 1; }

# Every link of every node at RATE, both ways: the node's eth0 (egress) and its switch port
# (the node's ingress), and the head's link the same.
limit() { tc "$@" root tbf rate "$RATE" burst 256kb latency 50ms; }
for ((i = 0; i < N; i++)); do
    limit -n "dvm${k}n$i" qdisc add dev eth0
    limit -n "dvm${k}sw" qdisc add dev "v$i"
done
limit qdisc add dev "dvm${k}hd"
limit -n "dvm${k}sw" qdisc add dev hd
echo "# $N nodes, links limited to $RATE each way (tbf), radix $RADIX, $(git rev-parse --short HEAD)"

"$BIN/dvmd" --hostfile "$OUT/hosts" --launch-agent "${fact[agent]}" --bind-address "${fact[head]}" \
    --radix "$RADIX" --report-uri "$OUT/uri" >"$OUT/dvmd.out" 2>"$OUT/dvmd.log" &
hnp_pid=$!
for _ in $(seq 600); do
    [ -s "$OUT/uri" ] && break
    kill -0 "$hnp_pid" 2>/dev/null || { echo "bench_movements.sh: dvmd exited:" >&2; cat "$OUT/dvmd.log" >&2; exit 1; }
    sleep 0.1
done
[ -s "$OUT/uri" ] || { echo "bench_movements.sh: no DVM after 60 s" >&2; exit 1; }
if [ -n "${CHECK_FENCES:-}" ]; then
    "$BIN/dvm-bench" --dvm-uri "file:$OUT/uri" --modex-bytes "${MODEX%%,*}" --check-fences "$CHECK_FENCES" \
        --movement "${MOVEMENT:-auto}"
else
    "$BIN/dvm-bench" --dvm-uri "file:$OUT/uri" --count "$COUNT" --modex-bytes "$MODEX" --xcast-bytes "$XCAST" \
        --compare-movements "$REPS" --csv "$OUT/movements.csv"
fi
"$BIN/pterm" --dvm-uri "file:$OUT/uri"
wait "$hnp_pid" || true
hnp_pid=
