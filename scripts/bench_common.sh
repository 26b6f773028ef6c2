# Shared by the MPI benchmark scripts (sourced, not run): their set-up, the machine header and
# stopping a DVM by its HNP pid.

# bench_prepare NAME: OUT (a fresh /tmp/dvm-bench-NAME.* unless set), private copies of dvmd,
# prun and pterm in $B (a concurrent `cargo build` must not swap them mid-run), the MPI test
# programs in $OUT/mpi; OMPI_MCA_pml=ob1 and DVM_TMPDIR=$OUT exported for every arm.
bench_prepare() {
    BIN=${BIN:-target/release}
    OUT=${OUT:-$(mktemp -d "/tmp/dvm-bench-$1.XXXXXX")}
    mkdir -p "$OUT/bin" "$OUT/mpi"
    [ "${SKIP_BUILD:-0}" = 1 ] || cargo build --release --bins
    cp "$BIN/dvmd" "$BIN/prun" "$BIN/pterm" "$OUT/bin/"
    B=$OUT/bin
    make -s -C tests/mpi OUT="$OUT/mpi"
    export OMPI_MCA_pml=ob1
    export DVM_TMPDIR=$OUT
    if [ "$(id -u)" = 0 ]; then
        export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    fi
}

# bench_header LINE: what was measured on what, to stdout and $OUT/machine.txt.
bench_header() {
    {
        echo "git HEAD $(git rev-parse --short HEAD); binaries from $BIN"
        echo "cores (nproc) $(nproc); kernel $(uname -r); cpu $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
        echo "$(mpirun --version 2>&1 | head -1); loadavg at start: $(cut -d' ' -f1-3 /proc/loadavg)"
        echo "$1"
    } | tee "$OUT/machine.txt"
}

# hnp_of_uri FILE: the HNP pid, from its session dir name in the URI
# (dvm://ip:port/<tmp>/dvm-<uid>/dvm-<pid>-<tag>).
hnp_of_uri() {
    sed -E 's#.*/dvm-([0-9]+)-[0-9a-f]+$#\1#' "$1"
}

# stop_dvm URI_FILE PID LABEL: pterm, then wait up to 5 s for the HNP to be gone; kill it by
# pid and return 1 if it is not.
stop_dvm() {
    local i
    "$B/pterm" --dvm-uri "file:$1" >/dev/null || echo "pterm ($3) failed" >&2
    for i in $(seq 50); do
        if ! [ -r "/proc/$2/stat" ] || [ "$(awk '{print $3}' "/proc/$2/stat")" = Z ]; then
            return 0
        fi
        sleep 0.1
    done
    echo "stop: dvmd pid $2 ($3) still alive 5 s after pterm; killing it" >&2
    kill -9 "$2" 2>/dev/null || true
    return 1
}
