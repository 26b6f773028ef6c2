#!/usr/bin/env bash
# The DVM on a docker swarm of real containers: build the images from this tree (cached),
# start N node containers and a head, boot `dvmd --host node1..nodeN` from the head (default
# ssh agent), run a command there, copy the results out, tear everything down.
#
#   contrib/dockerswarm/swarm.sh --nodes 8 -- 'prun --map-by node -n 8 hostname'
#   contrib/dockerswarm/swarm.sh --nodes 4 --slots 4 -- 'prun -n 16 /opt/dvm/mpi/allreduce'
#   contrib/dockerswarm/swarm.sh --clean          # remove the images it built
#
# The command runs with bash -c in the head container, in /results (copied to --out at the
# end); the DVM's URI is in /results/dvm.uri and prun/pterm/dvm-bench find it by themselves.
set -euo pipefail
DS_TOOL=swarm.sh
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

usage() {
  cat <<EOF
usage: swarm.sh [--nodes N] [--slots S] [--radix R] [--dvmd-args 'OPTS'] [--out DIR]
                [--bins DIR] [--no-boot] [--keep] [-- COMMAND]
       swarm.sh --build | --clean
  --nodes N      node containers (default 4); the HNP runs in one more (the head)
  --slots S      slots per node (default 4)
  --radix R      dvmd --radix (default 64)
  --dvmd-args    more dvmd options, e.g. '--heartbeat-ms 500'
  --out DIR      where /results of the head lands (default ./swarm-out)
  --bins DIR     use these dvmd/prun/pterm/dvm-bench (default: cargo build --release --bins)
  --no-boot      start the containers only; COMMAND boots what it wants
  --keep         leave the DVM, containers, service, network (and a swarm this run initialized) up
  --build        build (or find cached) images and stop
  --clean        remove every image this tool built
  COMMAND        bash command line run in the head (default: a hostname job on every node)
EOF
}

nodes=4 slots=4 radix=64 dvmd_args="" out="$PWD/swarm-out" boot=1 cmd="" mode=run
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) nodes=${2:?--nodes needs a count}; shift 2 ;;
    --slots) slots=${2:?--slots needs a count}; shift 2 ;;
    --radix) radix=${2:?--radix needs a number}; shift 2 ;;
    --dvmd-args) dvmd_args=${2?--dvmd-args needs options}; shift 2 ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --bins) DS_BINS=${2:?--bins needs a directory}; shift 2 ;;
    --no-boot) boot=0; shift ;;
    --keep) DS_KEEP=1; shift ;;
    --build) mode=build; shift ;;
    --clean) mode=clean; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; cmd="$*"; break ;;
    *) ds_die "unknown option '$1' (see --help)." ;;
  esac
done
[[ "$nodes" =~ ^[1-9][0-9]*$ ]] || ds_die "--nodes $nodes is not a positive count."
[[ "$slots" =~ ^[1-9][0-9]*$ ]] || ds_die "--slots $slots is not a positive count."
[[ "$radix" =~ ^[0-9]+$ ]] && [ "$radix" -ge 2 ] || ds_die "--radix $radix is not a number of at least 2."
[ -n "$cmd" ] || cmd="prun --map-by node -n $nodes --output tag hostname"

ds_preflight
ds_lock
if [ "$mode" = clean ]; then
  ds_clean_images
  exit 0
fi
ds_build_images
[ "$mode" = run ] || { echo "$DS_IMAGE"; exit 0; }

ds_traps
mkdir -p "$out"
ds_up "$nodes"
status=0
if [ "$boot" -eq 1 ]; then
  ms=$(ds_boot "$slots" --radix "$radix" $dvmd_args)
  ds_say "DVM ready on $nodes nodes (+ head) at radix $radix in $ms ms"
fi
ds_head "cd /results && $cmd" || status=$?
# With --keep the DVM stays up too, for a look inside (docker exec -it HEAD bash; pterm there).
[ "$boot" -eq 0 ] || [ "$DS_KEEP" -eq 1 ] || ds_pterm
ds_collect "$out"
ds_down
[ "$DS_KEEP" -eq 1 ] || ds_verify_clean
[ "$status" -eq 0 ] || ds_die "the command exited with status $status (results and logs in $out)."
ds_say "results and logs in $out"
