# Shared by the scripts that run a DVM on rate-limited network-namespace nodes (sourced, not
# run): bench_movements.sh and soak_liveness.sh. Needs root; the caller's EXIT trap must call
# netns_cluster_down.

# netns_cluster_up TOOL N SLOTS OUT: N fake nodes of SLOTS slots (tests/examples/fake_cluster,
# $FC_BIN or $BIN/examples/fake_cluster), hostfile OUT/hosts; sets `fact` (its key=value
# lines), `k` (the cluster's index), `fc_pid` and the coprocess FCP that holds it.
netns_cluster_up() {
    local tool=$1 n=$2 slots=$3 out=$4 line
    coproc FCP { "${FC_BIN:-$BIN/examples/fake_cluster}" "$n" "$slots" "$out/hosts"; }
    fc_pid=$FCP_PID
    declare -gA fact=()
    while read -r line <&"${FCP[0]}"; do
        [ "$line" = ready ] && break
        case $line in node=*) ;; *=*) fact[${line%%=*}]=${line#*=} ;; esac
    done
    k=${fact[k]:-}
    [ -n "$k" ] || { echo "$tool: the fake cluster of $n nodes did not start" >&2; exit 1; }
}

# netns_limit N RATE: every link of every node at RATE, both ways (the node's eth0 and its
# switch port), and the head's link the same (tbf).
netns_limit() {
    local n=$1 rate=$2 i
    limit() { tc "$@" root tbf rate "$rate" burst 256kb latency 50ms; }
    for ((i = 0; i < n; i++)); do
        limit -n "dvm${k}n$i" qdisc add dev eth0
        limit -n "dvm${k}sw" qdisc add dev "v$i"
    done
    limit qdisc add dev "dvm${k}hd"
    limit -n "dvm${k}sw" qdisc add dev hd
}

# netns_dvm TOOL OUT DVMD-ARGS...: the HNP on the head with the cluster's hostfile, logs in
# OUT/dvmd.out and OUT/dvmd.log; sets `hnp_pid` and returns once OUT/uri is written (fails
# naming why after 60 s or when dvmd exits).
netns_dvm() {
    local tool=$1 out=$2
    shift 2
    "$BIN/dvmd" --hostfile "$out/hosts" --launch-agent "${fact[agent]}" --bind-address "${fact[head]}" \
        --report-uri "$out/uri" "$@" >"$out/dvmd.out" 2>"$out/dvmd.log" &
    hnp_pid=$!
    for _ in $(seq 600); do
        [ -s "$out/uri" ] && return 0
        kill -0 "$hnp_pid" 2>/dev/null || { echo "$tool: dvmd exited:" >&2; cat "$out/dvmd.log" >&2; exit 1; }
        sleep 0.1
    done
    echo "$tool: no DVM after 60 s (log: $out/dvmd.log)" >&2
    exit 1
}

# netns_cluster_down: stop the HNP if it runs, then close the cluster's stdin, which tears it
# down (killing anything left inside the nodes and removing every namespace).
netns_cluster_down() {
    [ -n "${hnp_pid:-}" ] && kill "$hnp_pid" 2>/dev/null && wait "$hnp_pid" 2>/dev/null || true
    exec {FCP[1]}>&- 2>/dev/null || true
    [ -n "${fc_pid:-}" ] && wait "$fc_pid" 2>/dev/null || true
}
