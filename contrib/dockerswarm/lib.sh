# contrib/dockerswarm/lib.sh — sourced by swarm.sh, scaletest.sh, faults.sh and smoke.sh.
#
# Owns: the images (built from this tree, cached by content hash), one swarm of node
# containers plus a head container per run, the DVM booted from the head, and the teardown.
# Never: sends a packet from the host to a container address (the host has no route into the
# overlay; everything that talks to the DVM runs inside the head container), leaves a
# container, service, network or swarm state it created, or removes anything it did not
# create (every object carries the label dvm.dockerswarm=<run id>).
# Traps: remove the overlay network only after the service's tasks are gone; Open MPI needs
# btl_tcp_if_include=eth0 (eth1 is docker_gwbridge, where containers cannot reach each other).
#
# The caller sets DS_TOOL (its name, for messages) and calls, in order:
#   ds_preflight; ds_lock; ds_build_images; ds_up N; ds_boot ...; ds_head CMD...; ds_down

DS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DS_REPO="$(cd "$DS_DIR/../.." && pwd)"
DS_TOOL="${DS_TOOL:-swarm.sh}"
DS_ID="${DS_ID:-$(date +%s)-$$}"
DS_LABEL="dvm.dockerswarm=$DS_ID"
DS_NET="dvmswarm-$DS_ID"
DS_SVC="dvmswarm-$DS_ID-node"
DS_HEAD="dvmswarm-$DS_ID-head"
DS_BASE_REPO="dvm-swarm-base"
DS_KEEP="${DS_KEEP:-0}"
DS_BINS="${DS_BINS:-}"          # directory with dvmd, prun, pterm, dvm-bench (default: build release)
DS_SWARM_INITED=0
DS_SWARM_BEFORE=""
DS_GWBRIDGE_BEFORE=1
DS_UP=0
DS_NODES=0
DS_IMAGE=""
# Debian packages of the base image: what the binaries, Open MPI and the ssh agent need
# (checked with ldd against target/release/dvmd and the test programs).
DS_PACKAGES="openmpi-bin,libopenmpi3,libpmix2,libhwloc15,libevent-2.1-7,libevent-pthreads-2.1-7,openssh-server,openssh-client,iproute2,procps,iputils-ping,ca-certificates,psmisc"

ds_say() { echo "$DS_TOOL: $*" >&2; }
ds_die() { echo "$DS_TOOL: $*" >&2; exit 1; }

# Refuses in one sentence when this cannot work here.
ds_preflight() {
  [ "$(id -u)" -eq 0 ] || ds_die "must run as root (docker, swarm and mmdebstrap need it); nothing was started."
  command -v docker >/dev/null || ds_die "docker is not installed (no 'docker' command); nothing was started."
  docker info >/dev/null 2>&1 || ds_die "docker is not usable: 'docker info' failed (is dockerd running?); nothing was started."
  local t
  for t in mmdebstrap gcc pkg-config mpicc make flock sha256sum; do
    command -v "$t" >/dev/null || ds_die "'$t' is missing (apt-get install -y mmdebstrap gcc pkg-config libpmix-dev libopenmpi-dev make); nothing was started."
  done
  pkg-config --exists pmix || ds_die "pkg-config finds no 'pmix' (apt-get install -y libpmix-dev); nothing was started."
}

# One run at a time on a machine: two runs would fight over the swarm's state.
ds_lock() {
  exec 9>/run/lock/dvm-dockerswarm.lock
  if ! flock -n 9; then
    ds_say "waiting for another contrib/dockerswarm run to finish (lock /run/lock/dvm-dockerswarm.lock)"
    flock -w "${DS_LOCK_WAIT:-1200}" 9 || ds_die "another contrib/dockerswarm run held /run/lock/dvm-dockerswarm.lock for ${DS_LOCK_WAIT:-1200} s."
  fi
}

# A python3 that has matplotlib (a pyenv python3 first on PATH may lack Debian's).
ds_python() {
  local py
  for py in python3 /usr/bin/python3; do
    if command -v "$py" >/dev/null && "$py" -c 'import matplotlib' 2>/dev/null; then
      echo "$py"
      return 0
    fi
  done
  return 1
}

ds_hash() { sha256sum | cut -c1-16; }

# The base image: a bookworm root filesystem from mmdebstrap, imported (no registry needed).
# Its tag hashes the package list and the recipe, so it is built once per machine.
ds_build_base() {
  local tag
  tag=$(printf 'v1 %s\n' "$DS_PACKAGES" | ds_hash)
  DS_BASE="$DS_BASE_REPO:$tag"
  if docker image inspect "$DS_BASE" >/dev/null 2>&1; then
    return
  fi
  ds_say "building base image $DS_BASE with mmdebstrap (once per machine, ~30 s)"
  local tmp
  tmp=$(mktemp -d /tmp/dvmswarm-base.XXXXXX)
  local mirror=http://deb.debian.org/debian
  if ! mmdebstrap --quiet --variant=apt --include="$DS_PACKAGES" bookworm "$tmp/rootfs.tar" \
      "deb $mirror bookworm main" "deb $mirror bookworm-updates main" \
      "deb http://deb.debian.org/debian-security bookworm-security main" >"$tmp/log" 2>&1; then
    tail -20 "$tmp/log" >&2
    rm -rf "$tmp"
    ds_die "mmdebstrap could not build the bookworm root filesystem (log above)."
  fi
  docker import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'LABEL dvm.dockerswarm.image=base' "$tmp/rootfs.tar" "$DS_BASE" >/dev/null \
    || { rm -rf "$tmp"; ds_die "docker import of the base root filesystem failed."; }
  rm -rf "$tmp"
}

# The application image: base + this tree's binaries + test programs + a throw-away ssh key
# (generated inside the image at build time, so the build context hashes the same every run).
ds_build_images() {
  ds_build_base
  local bins="$DS_BINS"
  if [ -z "$bins" ]; then
    ds_say "building release binaries (cargo build --release --bins)"
    (cd "$DS_REPO" && nice -n 10 cargo build --release --bins --quiet) || ds_die "cargo build --release --bins failed."
    bins="${CARGO_TARGET_DIR:-$DS_REPO/target}/release"
  fi
  local b
  for b in dvmd prun pterm dvm-bench; do
    [ -x "$bins/$b" ] || ds_die "$bins/$b is missing: build the binaries first (cargo build --release --bins)."
  done
  local ctx
  ctx=$(mktemp -d /tmp/dvmswarm-ctx.XXXXXX)
  mkdir -p "$ctx/bin" "$ctx/mpi"
  for b in dvmd prun pterm dvm-bench; do strip --strip-debug -o "$ctx/bin/$b" "$bins/$b"; done
  gcc -O2 -Wall -o "$ctx/bin/scaletest" "$DS_DIR/scaletest.c" $(pkg-config --cflags --libs pmix) \
    || { rm -rf "$ctx"; ds_die "gcc could not build contrib/dockerswarm/scaletest.c."; }
  make -s -C "$DS_REPO/tests/mpi" OUT="$ctx/mpi" >/dev/null || { rm -rf "$ctx"; ds_die "make -C tests/mpi failed."; }
  cp "$DS_DIR/Dockerfile" "$ctx/Dockerfile"
  local tag
  tag=$( (echo "$DS_BASE"; cd "$ctx" && find . -type f | LC_ALL=C sort | xargs sha256sum) | ds_hash)
  # One repository per binaries' flavour (release, debug), so a smoke run with debug binaries
  # and a sweep with release binaries do not evict each other's cached image.
  local flavour
  flavour=$(basename "$bins" | tr -c 'a-z0-9\n' '-')
  DS_APP_REPO="${DS_APP_PREFIX:-dvm-swarm}-$flavour"
  DS_IMAGE="$DS_APP_REPO:$tag"
  if docker image inspect "$DS_IMAGE" >/dev/null 2>&1; then
    ds_say "image $DS_IMAGE is up to date (cached)"
  else
    ds_say "building image $DS_IMAGE"
    # (the legacy builder's deprecation notice goes to the log, shown only on failure)
    if ! docker build -q --build-arg BASE="$DS_BASE" --label dvm.dockerswarm.image=app -t "$DS_IMAGE" "$ctx" \
        >"$ctx.log" 2>&1; then
      tail -20 "$ctx.log" >&2
      rm -rf "$ctx" "$ctx.log"
      ds_die "docker build of $DS_IMAGE failed (its output is above)."
    fi
    rm -f "$ctx.log"
    # Older application images of this tool are superseded; the base stays cached.
    local old
    for old in $(docker images "$DS_APP_REPO" --format '{{.Repository}}:{{.Tag}}'); do
      [ "$old" = "$DS_IMAGE" ] || docker rmi "$old" >/dev/null 2>&1 || true
    done
  fi
  rm -rf "$ctx"
}

# Removes every image this tool built (base and application).
ds_clean_images() {
  local ids
  ids=$(docker images -q --filter label=dvm.dockerswarm.image | sort -u)
  if [ -n "$ids" ]; then
    # shellcheck disable=SC2086
    docker rmi -f $ids >/dev/null
    ds_say "removed $(echo "$ids" | wc -l) image(s)"
  else
    ds_say "no images of contrib/dockerswarm to remove"
  fi
}

ds_swarm_state() { docker info --format '{{.Swarm.LocalNodeState}}' 2>/dev/null; }

# Starts N node containers (service tasks node1..nodeN, sshd as main process) and the head.
ds_up() {
  local n=$1
  DS_NODES=$n
  DS_SWARM_BEFORE=$(ds_swarm_state)
  # swarm init creates docker_gwbridge (and ingress); a run that initializes the swarm removes
  # it again when it did not exist before.
  DS_GWBRIDGE_BEFORE=0
  docker network inspect docker_gwbridge >/dev/null 2>&1 && DS_GWBRIDGE_BEFORE=1
  case "$DS_SWARM_BEFORE" in
    inactive)
      docker swarm init --advertise-addr 127.0.0.1 >/dev/null || ds_die "docker swarm init --advertise-addr 127.0.0.1 failed."
      DS_SWARM_INITED=1 ;;
    active) ;;
    *) ds_die "this docker engine's swarm is '$DS_SWARM_BEFORE', neither active nor inactive; fix it first (docker swarm leave --force?)." ;;
  esac
  DS_UP=1
  docker network create -d overlay --attachable --label "$DS_LABEL" "$DS_NET" >/dev/null \
    || ds_die "cannot create the overlay network $DS_NET."
  ds_start_service "$n"
  docker run -d --init --name "$DS_HEAD" --hostname head --label "$DS_LABEL" --network "$DS_NET" \
    --tmpfs /tmp:exec --shm-size 256m "$DS_IMAGE" >/dev/null || ds_die "cannot start the head container $DS_HEAD."
  ds_wait_ssh "$n"
}

ds_start_service() {
  local n=$1
  docker service create --detach --quiet --no-resolve-image --name "$DS_SVC" --label "$DS_LABEL" \
    --container-label "$DS_LABEL" --replicas "$n" --network "$DS_NET" --hostname 'node{{.Task.Slot}}' \
    --init --stop-grace-period 1s --restart-delay 1s \
    --mount type=tmpfs,dst=/tmp --mount type=tmpfs,dst=/dev/shm,tmpfs-size=536870912 \
    "$DS_IMAGE" >/dev/null || ds_die "cannot create the service $DS_SVC with $n replicas."
  local t0=$SECONDS running=0
  while :; do
    running=$(docker service ps "$DS_SVC" --filter desired-state=running --format '{{.CurrentState}}' | grep -c '^Running' || true)
    [ "$running" -ge "$n" ] && break
    [ $((SECONDS - t0)) -lt 180 ] || ds_die "only $running of $n tasks of $DS_SVC were running after 180 s."
    sleep 1
  done
  ds_say "$n node containers running after $((SECONDS - t0)) s"
}

# Waits until the head reaches sshd on every node (from inside the head, never the host).
ds_wait_ssh() {
  local n=$1
  ds_head "for i in \$(seq 1 $n); do t=0; until ssh -o ConnectTimeout=2 node\$i true 2>/dev/null; do
             t=\$((t+1)); [ \$t -lt 120 ] || { echo \"node\$i: no ssh after 60 s\" >&2; exit 1; }; sleep 0.5; done; done" \
    || ds_die "the head cannot reach sshd on every node of $DS_SVC."
}

# Runs a bash command line in the head container (stdin passed through). In the background
# plus `wait`, so a TERM or INT reaches the traps at once instead of after the command.
ds_head() {
  docker exec -i "$DS_HEAD" bash -c "$1" <&0 &
  wait $!
}

# The --host list for N nodes with S slots each.
ds_hosts() {
  local n=$1 s=$2 i out=""
  for i in $(seq 1 "$n"); do out+="${out:+,}node$i:$s"; done
  echo "$out"
}

# Boots the DVM from the head: ds_boot SLOTS [dvmd options...]. Prints the boot time (ms).
# The HNP's log is /results/hnp.log in the head; the URI is in /results/dvm.uri.
ds_boot() {
  local slots=$1
  shift
  local hosts
  hosts=$(ds_hosts "$DS_NODES" "$slots")
  ds_head "rm -f /results/dvm.uri; mkdir -p /results"
  local t0
  t0=$(date +%s%N)
  docker exec -d "$DS_HEAD" bash -c "exec dvmd --host $hosts $* --report-uri /results/dvm.uri >>/results/hnp.log 2>&1"
  if ! ds_head "for i in \$(seq 600); do [ -s /results/dvm.uri ] && exit 0; pgrep -x dvmd >/dev/null || exit 1; sleep 0.1; done; exit 1"; then
    ds_head "tail -20 /results/hnp.log" >&2 || true
    ds_die "the DVM did not boot on $DS_NODES nodes (dvmd --host ... $*; its log is above)."
  fi
  echo $((($(date +%s%N) - t0) / 1000000))
}

ds_pterm() {
  ds_head "pterm --dvm-uri file:/results/dvm.uri" >/dev/null || ds_say "pterm failed (the teardown removes the containers anyway)"
  ds_head "for i in \$(seq 100); do pgrep -x dvmd >/dev/null || exit 0; sleep 0.1; done; exit 1" \
    || ds_say "the HNP still runs 10 s after pterm"
}

# Copies the head's /results and the service's task history into DIR.
ds_collect() {
  local dir=$1
  mkdir -p "$dir"
  docker cp "$DS_HEAD:/results/." "$dir/" >/dev/null 2>&1 || ds_say "could not copy /results out of the head"
  docker service ps --no-trunc "$DS_SVC" >"$dir/tasks.txt" 2>&1 || true
}

# The service's task history (restarts show as Shutdown/Failed rows).
ds_tasks() { docker service ps --no-trunc --format '{{.Name}} {{.DesiredState}} {{.CurrentState}} {{.Error}}' "$DS_SVC" 2>&1 || true; }

# Stops the service and waits until its containers are gone.
ds_stop_service() {
  docker service rm "$DS_SVC" >/dev/null 2>&1 || true
  local t0=$SECONDS
  while [ -n "$(docker ps -aq --filter "label=$DS_LABEL" --filter "label=com.docker.swarm.service.name=$DS_SVC")" ]; do
    [ $((SECONDS - t0)) -lt 120 ] || { ds_say "containers of $DS_SVC still exist after 120 s"; break; }
    sleep 0.5
  done
}

# Removes everything this run created; safe to call twice and from a trap.
ds_down() {
  [ "$DS_UP" -eq 1 ] || return 0
  set +e
  # A second Ctrl-C or a TERM during the teardown must not abandon it half-way.
  trap '' INT TERM
  if [ "$DS_KEEP" -eq 1 ]; then
    ds_say "--keep: left running: head $DS_HEAD, service $DS_SVC, network $DS_NET$([ "$DS_SWARM_INITED" -eq 1 ] && echo ', swarm (initialized by this run)')"
    ds_say "remove them with: docker rm -f $DS_HEAD; docker service rm $DS_SVC; sleep 10; docker network rm $DS_NET$([ "$DS_SWARM_INITED" -eq 1 ] && echo '; docker swarm leave --force')"
    DS_UP=0
    return 0
  fi
  docker rm -f "$DS_HEAD" >/dev/null 2>&1
  ds_stop_service
  local c
  for c in $(docker ps -aq --filter "label=$DS_LABEL"); do docker rm -f "$c" >/dev/null 2>&1; done
  local i
  for i in $(seq 60); do
    docker network inspect "$DS_NET" >/dev/null 2>&1 || break
    docker network rm "$DS_NET" >/dev/null 2>&1 && break
    sleep 0.5
  done
  if [ "$DS_SWARM_INITED" -eq 1 ]; then
    docker swarm leave --force >/dev/null 2>&1
    DS_SWARM_INITED=0
    if [ "$DS_GWBRIDGE_BEFORE" -eq 0 ]; then
      for i in $(seq 20); do
        docker network inspect docker_gwbridge >/dev/null 2>&1 || break
        docker network rm docker_gwbridge >/dev/null 2>&1 && break
        sleep 0.5
      done
    fi
  fi
  DS_UP=0
  set -e
}

# Fails unless nothing this run created is left (containers, services, networks, swarm state).
ds_verify_clean() {
  local left=""
  [ -z "$(docker ps -aq --filter "label=$DS_LABEL")" ] || left+=" containers"
  if [ "$(ds_swarm_state)" = active ]; then
    [ -z "$(docker service ls -q --filter "label=$DS_LABEL")" ] || left+=" services"
  fi
  [ -z "$(docker network ls -q --filter "label=$DS_LABEL")" ] || left+=" networks"
  if [ "${DS_GWBRIDGE_BEFORE:-1}" -eq 0 ] && docker network inspect docker_gwbridge >/dev/null 2>&1; then
    left+=" docker_gwbridge"
  fi
  local now
  now=$(ds_swarm_state)
  [ -z "$DS_SWARM_BEFORE" ] || [ "$now" = "$DS_SWARM_BEFORE" ] || left+=" swarm-state($DS_SWARM_BEFORE→$now)"
  [ -z "$left" ] || ds_die "left behind after teardown:$left (label $DS_LABEL)."
  ds_say "nothing left behind: no container, service or network labelled $DS_LABEL; swarm is '$now' as before"
}

ds_traps() {
  trap 'ds_down' EXIT
  trap 'ds_say "interrupted; tearing down"; exit 130' INT
  trap 'ds_say "terminated; tearing down"; exit 143' TERM
}

# Replaces the node service by one with N tasks (same network, same head).
ds_resize() {
  local n=$1
  ds_stop_service
  DS_NODES=$n
  ds_start_service "$n"
  ds_wait_ssh "$n"
}
