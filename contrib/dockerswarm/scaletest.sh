#!/usr/bin/env bash
# Sweeps the PMIx scaletest client (and MPI jobs) over DVM sizes on a docker swarm:
#
#   contrib/dockerswarm/scaletest.sh --nodes 8,16,32 --ppn 1,4 --radix 2,64 --sizes 64,1024,8192,65536
#   contrib/dockerswarm/scaletest.sh --nodes 8 --quick
#
# For each node count one swarm service of N node containers runs; for each radix a DVM is
# booted from the head; for each ppn the MPI programs (mpinoop, allreduce, ring) and, for each
# size and mode, one scaletest job of N x ppn ranks run. Results: OUT/NAME.csv (scaletest, one
# row per iteration), OUT/NAME-mpi.csv, OUT/NAME-boot.csv, OUT/NAME-*.png and
# OUT/NAME-tables.md. The last line printed is the scaletest CSV's path. Everything the run
# created is removed at the end and that is checked.
set -euo pipefail
DS_TOOL=scaletest.sh
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

usage() {
  cat <<EOF
usage: scaletest.sh [--nodes LIST] [--ppn LIST] [--radix LIST] [--sizes LIST] [--nkeys K]
                    [--iters I] [--modes all,neighbors] [--movement tree] [--mpi-reps R]
                    [--name NAME] [--out DIR] [--bins DIR] [--quick] [--keep]
  --nodes     node containers per DVM (default 8,16,32; --quick: 8)
  --ppn       ranks per node (default 1,4; --quick: 1)
  --radix     dvmd --radix values (default 2,64; --quick: 64)
  --sizes     bytes per key (default 64,1024,8192,65536; --quick: 64,8192)
  --nkeys     keys per rank per iteration (default 1)
  --iters     iterations per scaletest job (default 10; --quick: 4); iteration 1 is reported apart.
              libpmix re-sends every committed key, so iteration k carries k x size per rank
  --jobs      scaletest jobs per configuration (default 1); '--iters 1 --jobs R --warmup 2'
              gives R fences of exactly ranks x size bytes (job 1 is reported apart)
  --warmup    untimed fence rounds with no data before iteration 1 (default 0)
  --modes     'all' (collecting fence, get every peer) and/or 'neighbors' (non-collecting
              fence, get the two ring neighbours: direct modex) (default all,neighbors; --quick: all)
  --movement  the DVM's data movement; only 'tree' exists in the daemon today
  --mpi-reps  repetitions of each MPI program per configuration (default 3; --quick: 1)
  --mpi-max-ranks  run the MPI programs only on jobs of at most this many ranks (default 32:
              more polling ranks than that on a 2-core host made dockerd reschedule every task)
  --name      file name stem (default sweep; --quick: quick)
  --out       output directory (default \${TMPDIR:-/tmp}/dvm-scaletest, outside the tree; give
              --out docs/scaletest to record a run there)
  --dvmd-args more dvmd options for every DVM, e.g. '--heartbeat-ms 3000 --heartbeat-misses 10'
EOF
}

quick=0 DVMD_ARGS=""
declare -A opt=()
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes|--ppn|--radix|--sizes|--nkeys|--iters|--jobs|--warmup|--modes|--movement|--mpi-reps|--mpi-max-ranks|--name|--out)
      [ $# -ge 2 ] || ds_die "$1 needs a value."
      opt[${1#--}]=$2; shift 2 ;;
    --bins) DS_BINS=${2:?--bins needs a directory}; shift 2 ;;
    --dvmd-args) DVMD_ARGS=${2?--dvmd-args needs options}; shift 2 ;;
    --quick) quick=1; shift ;;
    --keep) DS_KEEP=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) ds_die "unknown option '$1' (see --help)." ;;
  esac
done
if [ "$quick" -eq 1 ]; then
  def_nodes=8 def_ppn=1 def_radix=64 def_sizes=64,8192 def_iters=4 def_modes=all def_reps=1 def_name=quick
else
  def_nodes=8,16,32 def_ppn=1,4 def_radix=2,64 def_sizes=64,1024,8192,65536 def_iters=10 def_modes=all,neighbors def_reps=3 def_name=sweep
fi
IFS=, read -r -a NODES <<<"${opt[nodes]:-$def_nodes}"
IFS=, read -r -a PPNS <<<"${opt[ppn]:-$def_ppn}"
IFS=, read -r -a RADIXES <<<"${opt[radix]:-$def_radix}"
IFS=, read -r -a SIZES <<<"${opt[sizes]:-$def_sizes}"
IFS=, read -r -a MODES <<<"${opt[modes]:-$def_modes}"
IFS=, read -r -a MOVEMENTS <<<"${opt[movement]:-tree}"
NKEYS=${opt[nkeys]:-1}
BENCH_COUNT=$([ "$quick" -eq 1 ] && echo 50 || echo 200)
ITERS=${opt[iters]:-$def_iters}
REPS=${opt[mpi-reps]:-$def_reps}
JOBS=${opt[jobs]:-1}
WARMUP=${opt[warmup]:-0}
MPI_MAX=${opt[mpi-max-ranks]:-32}
NAME=${opt[name]:-$def_name}
OUT=${opt[out]:-${TMPDIR:-/tmp}/dvm-scaletest}

posint() { [[ "$2" =~ ^[1-9][0-9]*$ ]] || ds_die "$1 value '$2' is not a positive integer."; }
for v in "${NODES[@]}"; do posint --nodes "$v"; done
for v in "${PPNS[@]}"; do posint --ppn "$v"; done
for v in "${SIZES[@]}"; do posint --sizes "$v"; done
for v in "${RADIXES[@]}"; do posint --radix "$v"; [ "$v" -ge 2 ] || ds_die "--radix $v is below 2."; done
posint --nkeys "$NKEYS"; posint --iters "$ITERS"; posint --mpi-reps "$REPS"; posint --mpi-max-ranks "$MPI_MAX"; posint --jobs "$JOBS"
[[ "$WARMUP" =~ ^[0-9]+$ ]] || ds_die "--warmup value '$WARMUP' is not a count."
for m in "${MOVEMENTS[@]}"; do
  [ "$m" = tree ] || ds_die "--movement $m does not exist in the daemon yet; only 'tree' is valid."
done
for m in "${MODES[@]}"; do
  case "$m" in all|neighbors) ;; *) ds_die "--modes $m is neither 'all' nor 'neighbors'." ;; esac
done
[[ "$NAME" =~ ^[A-Za-z0-9._-]+$ ]] || ds_die "--name $NAME may only use letters, digits, '.', '_' and '-'."
maxppn=0
for p in "${PPNS[@]}"; do [ "$p" -le "$maxppn" ] || maxppn=$p; done

ds_preflight
PY=$(ds_python) || ds_die "no python3 with matplotlib for the plots (apt-get install -y python3-matplotlib); nothing was started."
ds_lock
mkdir -p "$OUT"
CSV="$OUT/$NAME.csv" MPICSV="$OUT/$NAME-mpi.csv" BOOTCSV="$OUT/$NAME-boot.csv" LOG="$OUT/$NAME.log"
BENCHCSV="$OUT/$NAME-bench.csv"
echo "nodes,ppn,ranks,radix,movement,mode,size,nkeys,iteration,collect_us,barrier_us,get_us,job" >"$CSV"
echo "nodes,ppn,ranks,radix,program,rep,wall_ms,init_us" >"$MPICSV"
echo "nodes,daemons,radix,boot_ms" >"$BOOTCSV"
echo "nodes,op,bytes,daemons,radix,depth,alpha_us,beta_ns_per_byte,p50_us,p99_us,model_us,ratio" >"$BENCHCSV"
: >"$LOG"
: >"$OUT/$NAME-tasks.txt"
failures=()

ds_build_images
ds_traps
t_start=$SECONDS

# Runs one prun in the head, stdout to $1, stderr appended to the log; prints wall ms.
timed_prun() {
  local outfile=$1 args=$2 t0 rc=0
  t0=$(date +%s%N)
  ds_head "prun --timeout 600 $args" >"$outfile" 2>>"$LOG" || rc=$?
  local ms=$((($(date +%s%N) - t0) / 1000000))
  echo "$ms"
  return $rc
}

tmp=$(mktemp -d /tmp/dvmswarm-scaletest.XXXXXX)
trap 'rm -rf "$tmp"; ds_down' EXIT
first=1
for n in "${NODES[@]}"; do
  if [ "$first" -eq 1 ]; then ds_up "$n"; first=0; else ds_tasks >>"$OUT/$NAME-tasks.txt"; ds_resize "$n"; fi
  for r in "${RADIXES[@]}"; do
    # shellcheck disable=SC2086
    ms=$(ds_boot "$maxppn" --radix "$r" $DVMD_ARGS)
    echo "$n,$((n + 1)),$r,$ms" >>"$BOOTCSV"
    ds_say "N=$n radix=$r: DVM ready in $ms ms"
    # The daemons' own collectives (no PMIx, no ranks) on the same DVM, for comparison.
    if ds_head "dvm-bench --count $BENCH_COUNT --modex-bytes 0,64,8192 --xcast-bytes 64 --csv /tmp/bench.csv >/dev/null && tail -n +2 /tmp/bench.csv" \
        >"$tmp/bench.out" 2>>"$LOG"; then
      sed "s/^/$n,/" "$tmp/bench.out" >>"$BENCHCSV"
    else
      failures+=("N=$n radix=$r: dvm-bench failed (see $LOG)")
      ds_say "${failures[-1]}"
    fi
    for p in "${PPNS[@]}"; do
      np=$((n * p))
      # Open MPI ranks poll while they wait (yielding, but always runnable): on a small host
      # too many of them starve dockerd, which then reschedules every task of the service.
      progs="mpinoop allreduce ring"
      if [ "$np" -gt "$MPI_MAX" ]; then
        progs=""
        echo "N=$n radix=$r ppn=$p: MPI programs skipped ($np ranks > --mpi-max-ranks $MPI_MAX)" >>"$LOG"
      fi
      for prog in $progs; do
        for rep in $(seq 1 "$REPS"); do
          if ms=$(timed_prun "$tmp/mpi.out" "-N $p -n $np /opt/dvm/mpi/$prog"); then
            init=$(sed -n 's/^mpinoop MPI_Init_us //p' "$tmp/mpi.out" | head -1)
            echo "$n,$p,$np,$r,$prog,$rep,$ms,${init}" >>"$MPICSV"
          else
            failures+=("N=$n radix=$r ppn=$p $prog rep $rep: prun failed (see $LOG)")
            ds_say "${failures[-1]}"
          fi
        done
      done
      for mv in "${MOVEMENTS[@]}"; do
        for mode in "${MODES[@]}"; do
          flag=""; [ "$mode" = all ] || flag=--neighbors
          for s in "${SIZES[@]}"; do
            for j in $(seq 1 "$JOBS"); do
              if ms=$(timed_prun "$tmp/st.out" "-N $p -n $np scaletest --size $s --nkeys $NKEYS --iters $ITERS --warmup $WARMUP --radix $r --movement $mv $flag"); then
                grep -E '^[0-9]+,' "$tmp/st.out" | sed "s/\$/,$j/" >>"$CSV" || true
                ds_say "N=$n radix=$r ppn=$p $mode size=$s job $j: $ITERS iterations in $ms ms"
              else
                failures+=("N=$n radix=$r ppn=$p mode=$mode size=$s job $j: scaletest failed (see $LOG)")
                ds_say "${failures[-1]}"
              fi
            done
          done
        done
      done
    done
    ds_pterm
  done
done
ds_tasks >>"$OUT/$NAME-tasks.txt"
ds_collect "$tmp/results"
cp "$tmp/results/hnp.log" "$OUT/$NAME-hnp.log" 2>/dev/null || true
ds_down
[ "$DS_KEEP" -eq 1 ] || ds_verify_clean
ds_say "sweep took $((SECONDS - t_start)) s"

"$PY" "$DS_DIR/plot.py" --name "$NAME" "$OUT" >&2 || ds_die "contrib/dockerswarm/plot.py failed on $CSV (its error is above)."
rows=$(($(wc -l <"$CSV") - 1))
[ "$rows" -gt 0 ] || ds_die "no scaletest row was measured (see $LOG)."
if [ ${#failures[@]} -gt 0 ]; then
  printf '  %s\n' "${failures[@]}" >&2
  ds_die "${#failures[@]} job(s) of the sweep failed (listed above); $rows rows are in $CSV."
fi
echo "$CSV"
