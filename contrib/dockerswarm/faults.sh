#!/usr/bin/env bash
# Container-level faults under a running scaletest job, on one DVM of N node containers:
#   1. docker kill of node N's container     (connections close: fast detection)
#   2. docker pause of node N-1's container  (silent: detected by heartbeat)
#   3. kill -9 of the dvmd inside node N-2   (the container lives on)
# After each: the job must have failed naming the node, within the heartbeat bound; a job on
# the survivors must run with each survivor exactly once (`prun --map-by node hostname`); a
# job asking for one node more must be refused, so the replacement container swarm starts
# for a killed task (same hostname) is never admitted. Then the paused container is resumed
# and its daemon must exit by itself ("declared dead").
#
#   contrib/dockerswarm/faults.sh [--nodes 8] [--heartbeat-ms 1000] [--heartbeat-misses 5] [--out DIR]
#
# Writes OUT/faults.csv and OUT/faults.log (default ${TMPDIR:-/tmp}/dvm-scaletest, outside the
# tree; --out docs/scaletest to record a run). Exits 1 if any check failed.
set -euo pipefail
DS_TOOL=faults.sh
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

nodes=8 hb_ms=1000 hb_misses=5 out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) nodes=${2:?--nodes needs a count}; shift 2 ;;
    --heartbeat-ms) hb_ms=${2:?--heartbeat-ms needs a number}; shift 2 ;;
    --heartbeat-misses) hb_misses=${2:?--heartbeat-misses needs a number}; shift 2 ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --bins) DS_BINS=${2:?--bins needs a directory}; shift 2 ;;
    --keep) DS_KEEP=1; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) ds_die "unknown option '$1' (see --help)." ;;
  esac
done
[[ "$nodes" =~ ^[0-9]+$ ]] && [ "$nodes" -ge 4 ] || ds_die "--nodes $nodes: the three faults need at least 4 nodes."
out=${out:-${TMPDIR:-/tmp}/dvm-scaletest}
bound_ms=$((hb_ms * hb_misses + 2000)) # heartbeat bound plus 2 s for reporting and teardown

ds_preflight
ds_lock
mkdir -p "$out"
CSV="$out/faults.csv" LOG="$out/faults.log"
echo "fault,node,detect_ms,bound_ms,prun_status,named,survivor_job,extra_refused,note" >"$CSV"
: >"$LOG"
failed=0
ds_build_images
ds_traps
ds_up "$nodes"
ms=$(ds_boot 1 --heartbeat-ms "$hb_ms" --heartbeat-misses "$hb_misses")
ds_say "DVM ready on $nodes nodes in $ms ms (heartbeat ${hb_ms} ms x $hb_misses)"

# The running container of task slot K (hostname nodeK).
container_of() { docker ps -q --filter "label=com.docker.swarm.service.name=$DS_SVC" --filter "name=^$DS_SVC\.$1\." | head -1; }

alive=$nodes killed_ctr=""
# fault NAME SLOT ACTION: runs a long scaletest on the alive nodes, applies ACTION to node SLOT.
fault() {
  local name=$1 slot=$2 action=$3 node="node$2" ctr
  ctr=$(container_of "$slot")
  [ -n "$ctr" ] || ds_die "no running container for $node."
  ds_say "fault '$name' on $node (container ${ctr:0:12}) under a scaletest of $alive ranks"
  docker exec "$DS_HEAD" prun --timeout 120 --map-by node -n "$alive" scaletest --size 1024 --iters 100000 \
    >"$tmp/job.out" 2>"$tmp/job.err" &
  local job=$!
  sleep 3
  if ! kill -0 "$job" 2>/dev/null; then
    cat "$tmp/job.err" >&2
    ds_die "the scaletest job ended before the fault '$name' was applied."
  fi
  local t0 t1 st=0
  t0=$(date +%s%N)
  case "$action" in
    kill) docker kill "$ctr" >/dev/null; killed_ctr=$ctr ;;
    pause) docker pause "$ctr" >/dev/null ;;
    kill-dvmd)
      local pid
      pid=$(docker exec "$ctr" pgrep -x dvmd) || ds_die "no dvmd runs in $node's container."
      docker exec "$ctr" kill -9 "$pid" ;;
  esac
  wait "$job" || st=$?
  t1=$(date +%s%N)
  local detect=$(((t1 - t0) / 1000000))
  { echo "== $name on $node: prun exit $st after $detect ms"; cat "$tmp/job.err"; } >>"$LOG"
  local named=no
  grep -q "\b$node\b" "$tmp/job.err" && named=yes
  alive=$((alive - 1))
  # The survivors serve a job, each exactly once.
  local survivor=ok
  if docker exec "$DS_HEAD" prun --timeout 60 --map-by node -n "$alive" hostname >"$tmp/host.out" 2>>"$LOG"; then
    local want got
    want=$(seq 1 "$alive" | sed 's/^/node/' | sort)
    got=$(sort "$tmp/host.out")
    [ "$got" = "$want" ] || survivor="wrong-hosts($(echo "$got" | tr '\n' ' '))"
  else
    survivor=failed
  fi
  # One node more than the survivors: refused, whatever container swarm restarted meanwhile.
  local extra=refused
  if docker exec "$DS_HEAD" prun --timeout 60 --map-by node -n "$((alive + 1))" hostname >>"$LOG" 2>&1; then
    extra=ADMITTED
  fi
  local ok=1 note=""
  [ "$st" -ne 0 ] || { ok=0; note+="job did not fail; "; }
  [ "$named" = yes ] || { ok=0; note+="no sentence names $node; "; }
  [ "$detect" -le "$bound_ms" ] || { ok=0; note+="slower than the bound; "; }
  [ "$survivor" = ok ] || { ok=0; note+="survivor job $survivor; "; }
  [ "$extra" = refused ] || { ok=0; note+="a job larger than the survivors was admitted; "; }
  local sentence
  sentence=$(grep -m1 "$node" "$tmp/job.err" | tr -d ',' | cut -c1-200 || true)
  echo "$name,$node,$detect,$bound_ms,$st,$named,$survivor,$extra,${note:-pass} | ${sentence}" >>"$CSV"
  if [ "$ok" -eq 1 ]; then
    ds_say "  pass: prun exit $st after $detect ms (bound $bound_ms), '$sentence'"
  else
    ds_say "  FAIL: $note"
    failed=$((failed + 1))
  fi
}

tmp=$(mktemp -d /tmp/dvmswarm-faults.XXXXXX)
trap 'rm -rf "$tmp"; ds_down' EXIT
fault docker-kill "$nodes" kill
fault docker-pause "$((nodes - 1))" pause
fault kill-dvmd "$((nodes - 2))" kill-dvmd

# Swarm replaced the killed task by a new container with the same hostname: it must exist
# (else the refusal checks above proved nothing) and must not have joined.
repl=$(container_of "$nodes")
if [ -n "$repl" ] && [ "$repl" != "$killed_ctr" ]; then
  echo "replacement,node$nodes,,,,,,refused,pass: swarm's new container ${repl:0:12} for node$nodes ran and was never admitted" >>"$CSV"
else
  echo "replacement,node$nodes,,,,,,,FAIL: swarm started no replacement container for node$nodes" >>"$CSV"
  failed=$((failed + 1))
fi
paused=$(container_of "$((nodes - 1))")
docker unpause "$paused" >/dev/null
ds_say "resumed node$((nodes - 1)); its daemon must now exit by itself"
gone=no
for _ in $(seq 40); do
  if ! docker exec "$paused" pgrep -x dvmd >/dev/null 2>&1; then gone=yes; break; fi
  sleep 0.5
done
echo "unpause,node$((nodes - 1)),,,,,,,$([ $gone = yes ] && echo 'pass: its dvmd exited' || echo 'FAIL: its dvmd still runs 20 s after unpause')" >>"$CSV"
[ "$gone" = yes ] || failed=$((failed + 1))
if docker exec "$DS_HEAD" prun --timeout 60 --map-by node -n "$alive" hostname >/dev/null 2>>"$LOG"; then
  ds_say "after the unpause, the $alive survivors still serve jobs"
else
  ds_say "FAIL: no job runs on the survivors after the unpause"
  failed=$((failed + 1))
fi
ds_head "tail -50 /results/hnp.log" >>"$LOG" 2>&1 || true
ds_pterm
docker service ps --no-trunc "$DS_SVC" >>"$LOG" 2>&1 || true
ds_down
[ "$DS_KEEP" -eq 1 ] || ds_verify_clean
[ "$failed" -eq 0 ] || ds_die "$failed fault check(s) failed (see $CSV and $LOG)."
echo "$CSV"
