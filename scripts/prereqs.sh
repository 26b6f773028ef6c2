#!/usr/bin/env bash
# The Debian packages dvm needs, installed when missing: shared by scripts/demo.sh (build),
# scripts/test.sh and .ci/run (test). Silent when everything is there; as root it says what
# it installs and installs it; otherwise it names what is missing in one sentence and fails.
#
#   scripts/prereqs.sh build    # compile dvm and the MPI test programs, run the demo
#   scripts/prereqs.sh test     # also what the tests use (network namespaces, docker images)
#   scripts/prereqs.sh bench    # also what the benchmarks compare with (socat)
set -euo pipefail
# gcc and libc6-dev: cargo links with cc, and build scripts compile C; ca-certificates: cargo
# fetches crates over TLS. A machine with only rustup's cargo may lack all three.
build=(gcc libc6-dev ca-certificates pkg-config make libpmix-dev libclang-dev openmpi-bin libopenmpi-dev)
case "${1:-}" in
  build) want=("${build[@]}") ;;
  # gdb: stack traces of a job's ranks (pps --stacks, prun --get-stack-traces);
  # python3-matplotlib: the benchmarks' and the swarm sweep's plots.
  test) want=("${build[@]}" iproute2 python3 python3-mpi4py python3-matplotlib mmdebstrap gdb) ;;
  # socat: the plain one-stream-per-node copy that staging is compared with.
  bench) want=("${build[@]}" iproute2 python3 python3-matplotlib socat) ;;
  *)
    echo "usage: scripts/prereqs.sh build|test|bench" >&2
    exit 2
    ;;
esac
if ! command -v dpkg >/dev/null 2>&1; then
  echo "dvm is built on Debian 12; this machine has no dpkg, so install the equivalents of: ${want[*]}" >&2
  exit 1
fi
need=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "missing Debian packages: ${need[*]}; install them as root (sudo apt-get install -y ${need[*]}) and run this again" >&2
  exit 1
fi
echo "installing Debian packages: ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${need[@]}" >/dev/null
