#!/bin/bash
# Issue 29: hold HOLD (300) idle connections on every RML port of an 8-daemon DVM at radix 2,
# kill -9 daemon 1, report who was declared lost. usage: scripts/liveness_slots.sh BIN_DIR TAG
BIN=$1; TAG=$2; shift 2
root=/tmp/dvm-slots-$TAG-$$; mkdir -p $root; export DVM_TMPDIR=$root
$BIN/dvmd --local 8 --radix 2 --report-uri $root/uri --daemonize "$@" >$root/out 2>$root/err
sleep 0.5
pids=()
for p in /proc/[0-9]*; do pid=${p#/proc/}
  if tr '\0' '\n' 2>/dev/null < $p/environ | grep -qx "DVM_TMPDIR=$root" 2>/dev/null && [ "$(cat $p/comm 2>/dev/null)" = dvmd ]; then pids+=($pid); fi
done
ctl=$(sed 's#dvm://\([^/]*\)/.*#\1#' $root/uri)
ports=$(ss -ltnpH | grep -E "pid=($(IFS='|'; echo "${pids[*]}"))," | awk '{print $4}' | grep -v "^$ctl$")
victim=""; for pid in "${pids[@]}"; do tr '\0' '\n' < /proc/$pid/cmdline | grep -qx -- "--rank=1" && victim=$pid; done
python3 $(dirname $0)/liveness_hold.py ${HOLD:-300} $ports > $root/hold 2>&1 & hp=$!
sleep 3
kill -9 $victim
sleep 12
log=$(ls $root/dvm-*/*/dvmd.log | head -1)
lost=$(grep "^dvmd: daemon .* was lost" $log | sed 's/^dvmd: daemon \([0-9]*\) .*/\1/' | sort -n | tr '\n' ' ')
alive=0; for pid in "${pids[@]}"; do [ -d /proc/$pid ] && alive=$((alive+1)); done
timeout 60 $BIN/prun --dvm-uri file:$root/uri -n 7 --map-by node hostname > $root/job 2>&1; rc=$?
cp $log ${TMPDIR:-/tmp}/last-slots-log-$TAG
kill $hp; wait $hp 2>/dev/null
timeout 30 $BIN/pterm --dvm-uri file:$root/uri >/dev/null 2>&1; sleep 2
left=0; for pid in "${pids[@]}"; do [ -d /proc/$pid ] && left=$((left+1)) && kill -9 $pid; done
echo "$TAG ports=$(echo $ports | wc -w) lost_ranks=[${lost% }] alive_after_kill=$alive job_n7_rc=$rc left_after_pterm=$left $(grep -m1 -o 'gave up on.*' ${TMPDIR:-/tmp}/last-slots-log-$TAG)"
cp $root/job ${TMPDIR:-/tmp}/last-slots-job-$TAG; rm -rf $root
