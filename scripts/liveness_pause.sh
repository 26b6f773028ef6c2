#!/bin/bash
# Issue 29: stop a whole 16-daemon DVM (radix 2) with SIGSTOP, resume it, count survivors.
# usage: scripts/liveness_pause.sh BIN_DIR TAG [dvmd args]   env: PAUSE (seconds), KILL_RANK
# (a daemon kill -9ed during the pause). Prints one line per run; see docs/liveness.md.
BIN=$1; TAG=$2; shift 2
root=/tmp/dvm-pause-$TAG-$$
mkdir -p $root
export DVM_TMPDIR=$root
$BIN/dvmd --local 16 --radix 2 --report-uri $root/uri --daemonize "$@" >$root/out 2>$root/err
sleep 0.5
pids=()
for p in /proc/[0-9]*; do
  pid=${p#/proc/}
  if tr '\0' '\n' 2>/dev/null < $p/environ | grep -qx "DVM_TMPDIR=$root" 2>/dev/null; then
    if [ "$(cat $p/comm 2>/dev/null)" = dvmd ]; then pids+=($pid); fi
  fi
done
n=${#pids[@]}
victim=""
if [ -n "$KILL_RANK" ]; then
  for pid in "${pids[@]}"; do tr '\0' '\n' < /proc/$pid/cmdline | grep -qx -- "--rank=$KILL_RANK" && victim=$pid; done
fi
kill -STOP "${pids[@]}"
t0=$(date +%s.%N)
[ -n "$victim" ] && kill -9 $victim
sleep $PAUSE
kill -CONT "${pids[@]}"
tr=$(date -u +%s.%N)
sleep 4
alive=0
for pid in "${pids[@]}"; do [ -d /proc/$pid ] && ! grep -q '^State:.*Z' /proc/$pid/status && alive=$((alive+1)); done
np=16; [ -n "$KILL_RANK" ] && np=15
timeout 60 $BIN/prun --dvm-uri file:$root/uri -n $np --map-by node hostname > $root/job 2>&1; rc=$?
hosts=$(grep -c . $root/job)
log=$(ls $root/dvm-*/*/dvmd.log 2>/dev/null | head -1); cp "$log" ${TMPDIR:-/tmp}/last-pause-log-$TAG 2>/dev/null
lost=$(grep -c "^dvmd: daemon .* was lost" ${TMPDIR:-/tmp}/last-pause-log-$TAG 2>/dev/null)
named=$( [ -n "$KILL_RANK" ] && grep -h "daemon $KILL_RANK on host.*was lost" ${TMPDIR:-/tmp}/last-pause-log-$TAG | head -1)
lat=$( [ -n "$KILL_RANK" ] && python3 -c "import sys,datetime;l=sys.argv[1].split()[0].rstrip('Z');t=datetime.datetime.fromisoformat(l).replace(tzinfo=datetime.timezone.utc).timestamp();print('%.3f'%(t-float(sys.argv[2])))" "$named" $tr)
echo "$TAG procs=$n alive_after_4s=$alive job_rc=$rc job_lines=$hosts lost_msgs=$lost ${KILL_RANK:+named_after_resume_s=$lat victim_line=\"${named#*WARN }\"}"
timeout 30 $BIN/pterm --dvm-uri file:$root/uri >/dev/null 2>&1
sleep 1
for pid in "${pids[@]}"; do kill -9 $pid 2>/dev/null; done
cp $root/err ${TMPDIR:-/tmp}/last-pause-err-$TAG 2>/dev/null
cp $root/job ${TMPDIR:-/tmp}/last-pause-job-$TAG; rm -rf $root
