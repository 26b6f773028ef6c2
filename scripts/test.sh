#!/usr/bin/env bash
# The test command: every crate's unit, property, simulation and multi-process tests.
# Multi-daemon tests run real dvmd processes on loopback addresses (and, as root, in network
# namespaces); they run at radix 2 and 4 (multi-level trees) as well as the default 64.
#
# A test that cannot run here (network namespaces need root) records a skip under
# $DVM_TEST_SKIP_DIR; the summary at the end counts and names them with the reason. As root
# (CI) nothing may skip: a skip fails the test itself and fails this script.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/prereqs.sh test
cargo build --workspace --all-targets

skips="$(mktemp -d "${TMPDIR:-/tmp}/dvm-test-skips.XXXXXX")"
trap 'rm -rf "$skips"' EXIT
export DVM_TEST_SKIP_DIR="$skips"

status=0
cargo test --workspace --no-fail-fast -- --test-threads="${DVM_TEST_THREADS:-2}" || status=$?
# Real containers: a 4-node docker swarm boots the DVM and runs MPI and scaletest jobs
# (contrib/dockerswarm/smoke.sh; it records a skip where docker is not usable).
contrib/dockerswarm/smoke.sh --bins "${CARGO_TARGET_DIR:-target}/debug" || status=$?

records=("$skips"/*.skip)
[ -e "${records[0]}" ] || records=()
n=0
if [ ${#records[@]} -gt 0 ]; then
  n=$(cat "${records[@]}" | wc -l)
fi
echo
echo "skipped: $n test(s)"
if [ "$n" -gt 0 ]; then
  sort "${records[@]}" | sed 's/^/  /; s/\t/: /'
  if [ "$(id -u)" -eq 0 ]; then
    echo "error: running as root, where no test may skip" >&2
    status=1
  fi
fi
if [ "$status" -ne 0 ]; then
  echo "scripts/test.sh: FAILED" >&2
fi
exit "$status"
