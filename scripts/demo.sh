#!/usr/bin/env bash
# The main job on the embedded default: boot a 4-daemon DVM on this machine (radix 2, so the
# tree has relays), run an unmodified Open MPI program (16 ranks: hello, then an allreduce
# check) on it through the daemons' PMIx servers, time the DVM's collectives, and stop it.
# Exits non-zero if any step fails. Installs the Debian packages it needs when missing
# (scripts/prereqs.sh: as root; otherwise it names them and stops).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/prereqs.sh build
cargo build --release --bins
bin=$PWD/target/release
mpi=$(mktemp -d)
uri=$(mktemp)
trap '"$bin/pterm" --dvm-uri "file:$uri" >/dev/null 2>&1 || true; rm -rf "$uri" "$mpi"' EXIT
make -s -C tests/mpi OUT="$mpi"
OMPI_MCA_pml=ob1 "$bin/dvmd" --local 4 --slots 4 --radix 2 --report-uri "$uri" --daemonize
"$bin/prun" --dvm-uri "file:$uri" -n 16 --output tag "$mpi/hello"
"$bin/prun" --dvm-uri "file:$uri" -n 16 "$mpi/allreduce" | sort -k3 -n | tail -1
"$bin/dvm-bench" --dvm-uri "file:$uri" --count 100 --modex-bytes 0,64,8192 --xcast-bytes 64,1048576
"$bin/pterm" --dvm-uri "file:$uri"
echo "DVM terminated cleanly"
