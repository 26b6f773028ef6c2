#!/usr/bin/env bash
# The swarm smoke test that scripts/test.sh runs: a 4-node swarm, the DVM booted from the head,
# an MPI allreduce (16 ranks), one scaletest iteration (16 ranks, collecting fence and gets
# verified), pterm, teardown, and a check that nothing it created is left.
#
#   contrib/dockerswarm/smoke.sh [--bins DIR]     (scripts/test.sh passes --bins target/debug)
#
# Where it cannot run (not root, no usable docker, mmdebstrap missing) it records a skip under
# $DVM_TEST_SKIP_DIR with the reason, like the Rust tests do, and exits 0: scripts/test.sh turns
# a skip as root into a failure. The images are cached, so a second run takes ~30 s.
set -euo pipefail
DS_TOOL=smoke.sh
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
TEST=contrib/dockerswarm/smoke.sh

while [ $# -gt 0 ]; do
  case "$1" in
    --bins) DS_BINS=$(cd "${2:?--bins needs a directory}" && pwd); shift 2 ;;
    *) ds_die "unknown option '$1' (usage: smoke.sh [--bins DIR])." ;;
  esac
done

skip() {
  echo "SKIP $TEST: $1" >&2
  if [ -n "${DVM_TEST_SKIP_DIR:-}" ]; then
    printf '%s\t%s\n' "$TEST" "$1" >"$DVM_TEST_SKIP_DIR/dockerswarm-smoke-$$.skip"
  fi
  exit 0
}
# The reasons ds_preflight would refuse for, as skips.
[ "$(id -u)" -eq 0 ] || skip "needs root (docker, swarm, mmdebstrap)"
command -v docker >/dev/null || skip "no docker command"
docker info >/dev/null 2>&1 || skip "docker is not usable ('docker info' failed)"
command -v mmdebstrap >/dev/null || skip "mmdebstrap is missing (apt-get install -y mmdebstrap)"
ds_preflight
ds_lock

t0=$SECONDS
ds_build_images
ds_traps
ds_up 4
ms=$(ds_boot 4 --radix 2)
ds_say "DVM ready on 4 nodes (+ head, radix 2) in $ms ms"
hosts=$(ds_head "prun --timeout 60 --map-by node -n 4 hostname" | sort | tr '\n' ' ')
[ "$hosts" = "node1 node2 node3 node4 " ] || ds_die "prun --map-by node -n 4 hostname printed '$hosts', want node1..node4 once each."
ok=$(ds_head "prun --timeout 120 -n 16 /opt/dvm/mpi/allreduce" | grep -c ' ok 120$' || true)
[ "$ok" -eq 16 ] || ds_die "MPI allreduce on 16 ranks: $ok of 16 ranks printed 'ok 120'."
row=$(ds_head "prun --timeout 120 -N 4 -n 16 scaletest --size 1024 --iters 1 --radix 2")
[[ "$row" =~ ^4,4,16,2,tree,all,1024,1,1,[0-9]+,[0-9]+,[0-9]+$ ]] || ds_die "scaletest printed '$row', not one CSV row for 4 nodes x 4 ppn."
ds_say "allreduce 16/16 ok; scaletest row: $row"
ds_pterm
ds_down
ds_verify_clean
ds_say "passed in $((SECONDS - t0)) s"
