#!/usr/bin/env bash
# contrib/slurm/run.sh — the DVM inside a real Slurm 22.05 cluster of containers.
#
# Owns: a controller container (slurmctl: munged, slurmctld, the submit host) and N node
# containers (node1..nodeN: munged, slurmd) on one plain bridge network, one munge key baked
# into the image, a slurm.conf made for N nodes; the tests and the benchmark below; the teardown.
# Never: sends a packet from the host to a container address (everything runs through
# `docker exec`), removes anything it did not create (every container and network carries the
# label dvm.slurm=<run id>), or leaves a container or network behind. The images stay as a
# cache (dvm-slurm-base, dvm-slurm-app-*, dvm-slurm; `--clean` removes them).
# Traps: `salloc CMD` runs CMD on the submit host (the controller here), outside the
# allocation; `sbatch` output lands on the batch host only (no shared filesystem); the nodes
# declare CPUS CPUs whatever the host has (SlurmdParameters=config_overrides).
#
#   contrib/slurm/run.sh [--nodes N] [--cpus C] [--bins DIR] [--keep]   the tests (N=4, C=4)
#   contrib/slurm/run.sh --bench [--nodes 16] [--reps 10] [--arms 'srun_true oneshot_true ...']
#                                                                      the benchmark -> CSV + medians
#   contrib/slurm/run.sh --clean                                       remove the cached images
#
# Tests (exit 0 only when all hold and nothing is left): a failed srun ends a boot with Slurm's
# message; `salloc -N N prun -n N*C --map-by node allreduce` is correct (one-shot, HNP on the
# submit host); an sbatch script runs two jobs on one `dvmd --daemonize` DVM and `pterm`s it;
# `scancel` during a job (persistent DVM, then one-shot) leaves no dvmd, srun or rank anywhere.
set -euo pipefail
DS_TOOL=slurm/run.sh
SL_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../dockerswarm/lib.sh
source "$SL_DIR/../dockerswarm/lib.sh"
DS_PACKAGES="$DS_PACKAGES,munge,slurmctld,slurmd,slurm-client,slurm-wlm-basic-plugins,libpmix-dev"
DS_BASE_REPO=dvm-slurm-base
DS_APP_PREFIX=dvm-slurm-app
SL_ID="$(date +%s)-$$"
SL_LABEL="dvm.slurm=$SL_ID"
SL_NET="dvmslurm-$SL_ID"
SL_CTL="dvmslurm-$SL_ID-ctl"
SL_UP=0
NODES=""
CPUS=4
REPS=10
MODE=test
KEEP=0
ARMS="srun_true oneshot_true dvm_true srun_mpi dvm_mpi"

while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) NODES=${2:?--nodes needs a number}; shift 2 ;;
    --cpus) CPUS=${2:?--cpus needs a number}; shift 2 ;;
    --reps) REPS=${2:?--reps needs a number}; shift 2 ;;
    --bins) DS_BINS=$(cd "${2:?--bins needs a directory}" && pwd); shift 2 ;;
    --bench) MODE=bench; shift ;;
    --arms) ARMS=${2:?--arms needs a list}; shift 2 ;;
    --clean) MODE=clean; shift ;;
    --keep) KEEP=1; shift ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) ds_die "unknown option '$1' (see --help)." ;;
  esac
done
if [ -z "$NODES" ]; then NODES=4; [ "$MODE" = bench ] && NODES=16; fi
[[ "$NODES" =~ ^[1-9][0-9]*$ && "$CPUS" =~ ^[1-9][0-9]*$ && "$REPS" =~ ^[1-9][0-9]*$ ]] \
  || ds_die "--nodes, --cpus and --reps take positive integers."

sl_node() { echo "dvmslurm-$SL_ID-node$1"; }
sl_containers() { echo "$SL_CTL"; for i in $(seq 1 "$NODES"); do sl_node "$i"; done; }

# Runs a bash command line in the controller (stdin passed through); in the background plus
# `wait`, so a TERM or INT reaches the traps at once.
sl_ctl() {
  docker exec -i "$SL_CTL" bash -c "$1" <&0 &
  wait $!
}
sl_on() {
  docker exec -i "$1" bash -c "$2" <&0 &
  wait $!
}

# The Slurm image: the contrib/dockerswarm application image on a base with Slurm and munge,
# plus the munge key (cached by content hash; a new one replaces older ones).
sl_build_image() {
  ds_build_images
  local tag
  tag=$( (echo "$DS_IMAGE"; cat "$SL_DIR/Dockerfile") | ds_hash)
  SL_IMAGE="dvm-slurm:$tag"
  if docker image inspect "$SL_IMAGE" >/dev/null 2>&1; then
    ds_say "image $SL_IMAGE is up to date (cached)"
    return
  fi
  ds_say "building image $SL_IMAGE"
  docker build -q --build-arg APP="$DS_IMAGE" --label dvm.slurm.image=1 -t "$SL_IMAGE" -f "$SL_DIR/Dockerfile" \
    "$SL_DIR" >/tmp/dvmslurm-build-$$.log 2>&1 || { tail -20 /tmp/dvmslurm-build-$$.log >&2; ds_die "docker build of $SL_IMAGE failed."; }
  rm -f /tmp/dvmslurm-build-$$.log
  local old
  for old in $(docker images dvm-slurm --format '{{.Repository}}:{{.Tag}}'); do
    [ "$old" = "$SL_IMAGE" ] || docker rmi "$old" >/dev/null 2>&1 || true
  done
}

sl_clean_images() {
  local ids
  ids=$(docker images -q --filter label=dvm.slurm.image | sort -u)
  # shellcheck disable=SC2086
  [ -z "$ids" ] || docker rmi -f $ids >/dev/null
  for r in dvm-slurm-base dvm-slurm-app-release dvm-slurm-app-debug; do
    ids=$(docker images -q "$r" | sort -u)
    # shellcheck disable=SC2086
    [ -z "$ids" ] || docker rmi -f $ids >/dev/null
  done
  ds_say "removed the images of contrib/slurm"
}

# Starts the controller and N nodes, Slurm on them, and waits until every node is idle.
sl_up() {
  SL_UP=1
  docker network create --label "$SL_LABEL" "$SL_NET" >/dev/null || ds_die "cannot create the network $SL_NET."
  local conf
  conf=$(mktemp /tmp/dvmslurm-conf.XXXXXX)
  sed -e "s/@NODES@/$NODES/g" -e "s/@CPUS@/$CPUS/g" "$SL_DIR/slurm.conf.in" >"$conf"
  local c host i
  for i in $(seq 0 "$NODES"); do
    if [ "$i" -eq 0 ]; then c=$SL_CTL; host=slurmctl; else c=$(sl_node "$i"); host=node$i; fi
    docker run -d --init --name "$c" --hostname "$host" --network "$SL_NET" --network-alias "$host" \
      --label "$SL_LABEL" --tmpfs /tmp:exec --shm-size 256m "$SL_IMAGE" >/dev/null \
      || { rm -f "$conf"; ds_die "cannot start container $c."; }
    docker cp "$conf" "$c:/etc/slurm/slurm.conf" >/dev/null
  done
  rm -f "$conf"
  sl_on "$SL_CTL" "runuser -u munge -- munged && slurmctld" || ds_die "munged or slurmctld did not start on the controller."
  for i in $(seq 1 "$NODES"); do
    sl_on "$(sl_node "$i")" "runuser -u munge -- munged && slurmd" || ds_die "munged or slurmd did not start on node$i."
  done
  local t0=$SECONDS idle=0
  while :; do
    idle=$(sl_ctl "sinfo -h -N -o '%N %T' 2>/dev/null | grep -c ' idle$'" || true)
    [ "$idle" -ge "$NODES" ] && break
    [ $((SECONDS - t0)) -lt 120 ] || { sl_ctl "sinfo -N; tail -5 /var/log/slurm/slurmctld.log" >&2 || true; ds_die "only $idle of $NODES nodes idle after 120 s."; }
    sleep 0.5
  done
  ds_say "Slurm cluster up: controller + $NODES nodes ($CPUS CPUs each) idle after $((SECONDS - t0)) s"
}

sl_down() {
  [ "$SL_UP" -eq 1 ] || return 0
  set +e
  trap '' INT TERM
  if [ "$KEEP" -eq 1 ]; then
    ds_say "--keep: left running: $(sl_containers | tr '\n' ' ')and network $SL_NET (docker rm -f them; docker network rm $SL_NET)"
    SL_UP=0
    return 0
  fi
  local c
  for c in $(docker ps -aq --filter "label=$SL_LABEL"); do docker rm -f "$c" >/dev/null 2>&1; done
  docker network rm "$SL_NET" >/dev/null 2>&1
  SL_UP=0
  set -e
}

sl_verify_clean() {
  [ "$KEEP" -eq 1 ] && return 0
  local left=""
  [ -z "$(docker ps -aq --filter "label=$SL_LABEL")" ] || left+=" containers"
  [ -z "$(docker network ls -q --filter "label=$SL_LABEL")" ] || left+=" networks"
  [ -z "$left" ] || ds_die "left behind after teardown:$left (label $SL_LABEL)."
  ds_say "nothing left behind: no container or network labelled $SL_LABEL (the images stay as a cache)"
}

# Every dvmd (and PMIx worker), srun and test program still running in any container, one line each.
sl_leftovers() {
  local c
  for c in $(sl_containers); do
    docker exec "$c" ps -eo pid,comm,args --no-headers 2>/dev/null \
      | awk -v c="${c##*-}" '$2=="dvmd" || $2=="pmix-worker" || $2=="srun" || $3 ~ /^\/opt\/dvm\/mpi\// { print c ": " $0 }'
  done
}

# Waits (up to $1 s) until nothing of the DVM runs anywhere and Slurm has no job; names what is left.
sl_wait_clean() {
  local limit=$1 what=$2 t0=$SECONDS left jobs
  while :; do
    left=$(sl_leftovers)
    jobs=$(sl_ctl "squeue -h -o '%i %T'" || true)
    [ -z "$left" ] && [ -z "$jobs" ] && { ds_say "$what: no dvmd, PMIx worker, srun or rank left in any container, no job in squeue ($((SECONDS - t0)) s)"; return 0; }
    if [ $((SECONDS - t0)) -ge "$limit" ]; then
      ds_die "$what: after $limit s still running: ${left:-nothing}${jobs:+; squeue: $jobs}"
    fi
    sleep 0.5
  done
}

# The batch host of job $1 (its output file lives there).
sl_batch_host() { sl_ctl "scontrol show job $1" | tr ' ' '\n' | sed -n 's/^BatchHost=//p'; }

sl_job_state() { sl_ctl "scontrol show job $1" | tr ' ' '\n' | sed -n 's/^JobState=//p'; }

sl_submit() { # sl_submit NAME SCRIPT-TEXT [sbatch options...]: writes the script on the controller, prints the job id
  local name=$1 text=$2
  shift 2
  printf '%s\n' "$text" | sl_ctl "cat > /tmp/$name.sh"
  sl_ctl "sbatch --parsable $* /tmp/$name.sh"
}

sl_output() { # sl_output JOBID NAME: the job's output file from its batch host
  local host
  host=$(sl_batch_host "$1")
  sl_on "dvmslurm-$SL_ID-$host" "cat /tmp/$2-$1.out" 2>/dev/null || true
}

test_failed_srun() {
  local out rc=0
  out=$(sl_ctl "SLURM_JOB_ID=999999 SLURM_JOB_NODELIST=node[1-2] SLURM_JOB_CPUS_PER_NODE='4(x2)' dvmd --startup-timeout 20 2>&1") || rc=$?
  [ "$rc" -eq 1 ] && grep -q 'srun (the step starting daemons 1-2 on 2 node(s)) exited with status 1 before the DVM was ready; it printed: .*999999' <<<"$out" \
    || ds_die "dvmd in a job that does not exist: want exit 1 and srun's message, got status $rc: $out"
  ds_say "a failed srun ends the boot with Slurm's message: $(grep -o 'it printed: .*' <<<"$out" | cut -c1-140)"
  sl_wait_clean 30 "after the failed boot"
}

test_salloc() {
  local np=$((NODES * CPUS)) out ok want
  want=$((np * (np - 1) / 2))
  out=$(sl_ctl "salloc -N $NODES prun --timeout 120 -n $np --map-by node /opt/dvm/mpi/allreduce 2>&1") \
    || ds_die "salloc -N $NODES prun -n $np --map-by node allreduce failed: $(tail -5 <<<"$out")"
  ok=$(grep -cE "^allreduce rank [0-9]+ ok $want\$" <<<"$out" || true)
  [ "$(grep -oE '^allreduce rank [0-9]+' <<<"$out" | sort -u | wc -l)" -eq "$np" ] && [ "$ok" -eq "$np" ] \
    || ds_die "salloc -N $NODES prun -n $np allreduce: $ok of $np ranks printed 'ok $want': $(head -5 <<<"$out")"
  local hosts
  hosts=$(sl_ctl "salloc -N $NODES prun --timeout 60 -n $np --map-by node hostname 2>/dev/null" | sort | uniq -c | awk '{print $2 "x" $1}' | tr '\n' ' ')
  local expect=""
  for i in $(seq 1 "$NODES"); do expect+="node${i}x$CPUS "; done
  [ "$(tr ' ' '\n' <<<"$hosts" | sort | tr '\n' ' ')" = "$(tr ' ' '\n' <<<"$expect" | sort | tr '\n' ' ')" ] \
    || ds_die "salloc -N $NODES prun -n $np --map-by node hostname placed: $hosts (want $expect)"
  ds_say "salloc -N $NODES prun -n $np --map-by node allreduce: $ok/$np ranks ok $want; hostname: $hosts"
  sl_wait_clean 30 "after salloc"
}

test_sbatch_two_jobs() {
  local np=$((NODES * CPUS)) want jid out
  want=$((np * (np - 1) / 2))
  jid=$(sl_submit two "#!/bin/bash
#SBATCH -N $NODES -o /tmp/two-%j.out
set -e
dvmd --daemonize --report-uri /tmp/dvm-\$SLURM_JOB_ID.uri
prun --timeout 60 -n $np --map-by node /opt/dvm/mpi/allreduce | sort -V
prun --timeout 60 -n $NODES --map-by node sh -c 'echo \"job \$DVM_JOBID on \$(hostname)\"' | sort
pterm
echo 'batch script done'" --wait) || true
  out=$(sl_output "$jid" two)
  [ "$(sl_job_state "$jid")" = COMPLETED ] || ds_die "sbatch job $jid (two jobs on one DVM) ended $(sl_job_state "$jid"): $(tail -8 <<<"$out")"
  local ok jobs
  ok=$(grep -cE "^allreduce rank [0-9]+ ok $want\$" <<<"$out" || true)
  jobs=$(grep -E '^job [0-9]+ on node[0-9]+$' <<<"$out" | sort -u)
  [ "$ok" -eq "$np" ] || ds_die "sbatch job $jid: $ok of $np allreduce ranks ok: $(head -5 <<<"$out")"
  [ "$(awk '{print $2}' <<<"$jobs" | sort -u)" = 2 ] && [ "$(wc -l <<<"$jobs")" -eq "$NODES" ] \
    || ds_die "sbatch job $jid: the second prun was not job 2 of the same DVM on $NODES nodes: $jobs"
  grep -q '^batch script done$' <<<"$out" || ds_die "sbatch job $jid: the script did not finish: $(tail -5 <<<"$out")"
  ds_say "sbatch job $jid: dvmd --daemonize, allreduce $ok/$np ok, then job 2 of the same DVM on $(awk '{print $4}' <<<"$jobs" | tr '\n' ' ')pterm"
  sl_wait_clean 30 "after the sbatch script"
}

# scancel while ranks run: $1 = persistent (dvmd --daemonize) or one-shot.
test_scancel() {
  local kind=$1 np=$((NODES * CPUS)) boot="" jid t0 n
  [ "$kind" = persistent ] && boot="dvmd --daemonize --report-uri /tmp/dvm-\$SLURM_JOB_ID.uri"
  jid=$(sl_submit "cancel-$kind" "#!/bin/bash
#SBATCH -N $NODES -o /tmp/cancel-$kind-%j.out
$boot
prun -n $np --map-by node /opt/dvm/mpi/linger 600")
  t0=$SECONDS
  while :; do
    n=$(sl_leftovers | grep -c '/opt/dvm/mpi/linger' || true)
    [ "$n" -ge "$np" ] && break
    [ $((SECONDS - t0)) -lt 120 ] || ds_die "scancel test ($kind): only $n of $np ranks running after 120 s: $(sl_output "$jid" "cancel-$kind" | tail -5)"
    sleep 0.5
  done
  ds_say "scancel test ($kind): $n ranks of job $jid running on $NODES nodes; scancel $jid"
  sl_ctl "scancel $jid"
  sl_wait_clean 90 "after scancel ($kind DVM)"
}

run_tests() {
  local t0=$SECONDS
  test_failed_srun
  test_salloc
  test_sbatch_two_jobs
  test_scancel persistent
  test_scancel one-shot
  ds_say "all tests passed on $NODES nodes in $((SECONDS - t0)) s"
}

# Interleaved arms, order flipped each repetition, inside one sbatch allocation of N nodes:
# an srun step vs one-shot prun (/bin/true, one per node), vs prun on a running DVM, and
# MPI_Init+Finalize x N*CPUS under srun --mpi=pmix vs prun on the running DVM.
run_bench() {
  local np=$((NODES * CPUS)) jid out
  jid=$(sl_submit bench "#!/bin/bash
#SBATCH -N $NODES -o /tmp/bench-%j.out
ms() { local t=\$(date +%s%N) rc=0; timeout 300 \"\$@\" >/dev/null 2>/tmp/bench-err || rc=\$?; [ \$rc -eq 0 ] || { echo \"FAILED(\$rc): \$* \$(tail -2 /tmp/bench-err | tr '\\n' ' ')\" >&2; echo FAILED; return; }; echo \$(( (\$(date +%s%N) - t) / 1000000 )); }
# 2 shared cores under 64 busy ranks and other builds: a daemon may be silent for seconds.
export PRUN_DVMD_ARGS='--heartbeat-misses 30'
DVM_TMPDIR=/tmp/pdvm; mkdir -p \$DVM_TMPDIR; export DVM_TMPDIR
dvmd --daemonize --heartbeat-misses 30 --report-uri /tmp/pdvm.uri >/dev/null
unset DVM_TMPDIR
U=file:/tmp/pdvm.uri
arm() { case \$1 in
  srun_true) ms srun -N $NODES -n $NODES /bin/true ;;
  oneshot_true) ms prun --map-by node -n $NODES /bin/true ;;
  dvm_true) ms prun --dvm-uri \$U --map-by node -n $NODES /bin/true ;;
  srun_mpi) ms srun --mpi=pmix -N $NODES -n $np /opt/dvm/mpi/mpinoop ;;
  dvm_mpi) ms prun --dvm-uri \$U -n $np /opt/dvm/mpi/mpinoop ;;
esac; }
A='$ARMS'
R=\$(echo \$A | tr ' ' '\n' | tac | tr '\n' ' ')
for arm in \$A; do arm \$arm >/dev/null; done   # warm-up, not recorded
echo rep,arm,ms
for rep in \$(seq 1 $REPS); do
  order=\$A; [ \$((rep % 2)) -eq 0 ] && order=\$R
  for a in \$order; do echo \"\$rep,\$a,\$(arm \$a)\"; done
done
pterm --dvm-uri \$U || echo 'pterm failed (the DVM had ended)'" --wait) || true
  out=$(sl_output "$jid" bench)
  [ "$(sl_job_state "$jid")" = COMPLETED ] || ds_die "benchmark job $jid ended $(sl_job_state "$jid"): $(tail -5 <<<"$out")"
  mkdir -p "$DS_REPO/docs/slurm"
  local csv="$DS_REPO/docs/slurm/bench-${NODES}n-$(tr ' ' '\n' <<<"$ARMS" | sed 's/_.*//' | sort -u | tr '\n' '-' | sed 's/-$//').csv"
  grep -E '^(rep,arm,ms|[0-9]+,[a-z_]+,[0-9]+)$' <<<"$out" >"$csv"
  ds_say "wrote $csv ($(($(wc -l <"$csv") - 1)) rows; $(grep -c '^FAILED(' <<<"$out" || true) failed runs)"
  grep '^FAILED(' <<<"$out" | head -5 >&2 || true
  python3 - "$csv" "$NODES" "$np" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
by = {}
for r in rows:
    by.setdefault(r["arm"], {})[int(r["rep"])] = int(r["ms"])
def med(a): return statistics.median(by[a].values())
def ratio(a, b):
    rs = [by[a][k] / by[b][k] for k in by[a] if k in by[b]]
    return statistics.median(rs), min(rs), max(rs), len(rs)
n, np_ = sys.argv[2], sys.argv[3]
print(f"| arm | median ms |\n|---|---:|")
for a in by: print(f"| {a} | {med(a):.0f} |")
print(f"\n| ratio (paired, per repetition) | median | min | max | reps | bound |\n|---|---:|---:|---:|---:|---:|")
for a, b, bound in [("oneshot_true", "srun_true", 1.5), ("dvm_true", "srun_true", 0.25), ("dvm_mpi", "srun_mpi", 0.6)]:
    if a not in by or b not in by:
        continue
    m, lo, hi, k = ratio(a, b)
    print(f"| {a} / {b} | {m:.2f} | {lo:.2f} | {hi:.2f} | {k} | {'≤' if m <= bound else '>'} {bound} |")
EOF
}

if [ "$MODE" = clean ]; then
  sl_clean_images
  exit 0
fi
ds_preflight
ds_lock
trap 'sl_down' EXIT
trap 'ds_say "interrupted; tearing down"; exit 130' INT
trap 'ds_say "terminated; tearing down"; exit 143' TERM
sl_build_image
sl_up
if [ "$MODE" = bench ]; then run_bench; else run_tests; fi
sl_down
sl_verify_clean
