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
rm -rf "$OUT" && mkdir -p "$OUT"
export DVM_TMPDIR=$OUT/tmp
mkdir -p "$DVM_TMPDIR"

source scripts/netns_cluster.sh
trap netns_cluster_down EXIT
netns_cluster_up bench_movements.sh "$N" 1 "$OUT"
netns_limit "$N" "$RATE"
echo "# $N nodes, links limited to $RATE each way (tbf), radix $RADIX, $(git rev-parse --short HEAD)"
netns_dvm bench_movements.sh "$OUT" --radix "$RADIX"
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
