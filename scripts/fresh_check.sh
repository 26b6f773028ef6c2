#!/usr/bin/env bash
# Checks the README's two commands on a fresh Debian 12 machine that has only a Rust toolchain:
# a container from a minimal bookworm root filesystem (mmdebstrap --variant=minbase, imported
# into docker: no registry needed), this machine's rustup toolchain mounted read-only, and the
# committed source of one revision (git archive). Steps, in this order, each timed:
#
#   user-demo   scripts/demo.sh as a non-root user, packages absent: must fail (non-zero) with
#               one sentence that names the missing Debian packages, and build nothing
#   root-demo   scripts/demo.sh as root: installs the packages, builds, runs the job (exit 0)
#   test        scripts/test.sh as root: exit 0, and no test skipped (the skips are listed)
#
#   scripts/fresh_check.sh [--rev REV] [--steps user-demo,root-demo,test] [--keep]
#
# Nothing else of this machine enters the container: its CA certificates
# (/usr/local/share/ca-certificates, which Debian's ca-certificates package adds to the
# bundle it builds, for networks that intercept TLS) and, for the test step's docker swarm
# smoke, the docker socket, the docker CLI and /run/lock (the smoke's lock). The build and
# /tmp are on docker volumes of their own: disk, as on a machine (the container's own root can
# be fuse-overlayfs, slow enough under load to stall the DVM's tests). Everything it starts
# (container, volumes, temporary files) is removed on exit and on Ctrl-C, by ID; --keep leaves
# the container and volumes for debugging and prints how to remove them.
# docs/fresh-machine.md has the measured durations.
#
# shellcheck disable=SC2317  # cleanup and the step_* functions are called indirectly
set -euo pipefail
cd "$(dirname "$0")/.."

ALL_STEPS=(user-demo root-demo test)
BASE_REPO=dvm-fresh-base
LABEL_KEY=dvm.fresh
RUN_ID="$(date +%s)-$$"
CONTAINER="dvm-fresh-$RUN_ID"
VOLUME="dvm-fresh-$RUN_ID"        # /build: root's checkout, target/, the cargo home
TMP_VOLUME="dvm-fresh-$RUN_ID-tmp" # /tmp
SWARM_ID="fresh-$RUN_ID" # the swarm smoke's DS_ID: its objects carry dvm.dockerswarm=$SWARM_ID
PATH_IN=/opt/rust/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
SRC_ROOT=/build/dvm  # root's checkout (on the volume)
SRC_USER=/home/user/dvm

say() { echo "fresh_check: $*" >&2; }
die() {
  echo "fresh_check: $*" >&2
  exit 1
}
# A usage error: exit 2, like the tools' own option errors.
bad_usage() {
  echo "fresh_check: $* (see --help)" >&2
  exit 2
}
usage() {
  cat <<'EOS'
usage: scripts/fresh_check.sh [--rev REV] [--steps STEP[,STEP...]] [--keep]

Runs the README's two commands in a fresh Debian 12 container that has only this machine's
Rust toolchain. Steps (always run in this order): user-demo, root-demo, test (default: all).
  --rev REV      the committed revision to check (default HEAD; uncommitted changes are not seen)
  --steps LIST   comma-separated subset of user-demo,root-demo,test
  --keep         keep the container and its volumes afterwards (for debugging)
EOS
}

rev=HEAD
keep=0
steps_arg=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rev)
      [ -n "${2:-}" ] || bad_usage "--rev needs a revision"
      rev=$2
      shift 2
      ;;
    --rev=*) rev=${1#--rev=}; shift ;;
    --steps)
      [ -n "${2:-}" ] || bad_usage "--steps needs a list such as user-demo,root-demo"
      steps_arg=$2
      shift 2
      ;;
    --steps=*) steps_arg=${1#--steps=}; shift ;;
    --keep) keep=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) bad_usage "unknown argument '$1'" ;;
  esac
done

declare -A want=()
if [ -z "$steps_arg" ]; then
  for s in "${ALL_STEPS[@]}"; do want[$s]=1; done
else
  IFS=, read -r -a asked <<<"$steps_arg"
  for s in "${asked[@]}"; do
    case "$s" in
      user-demo | root-demo | test) want[$s]=1 ;;
      *) bad_usage "unknown step '$s' in --steps (the steps are user-demo, root-demo, test)" ;;
    esac
  done
fi
steps=()
for s in "${ALL_STEPS[@]}"; do [ -n "${want[$s]:-}" ] && steps+=("$s"); done

# --- preflight: refuse in one sentence, before anything is started ---
command -v docker >/dev/null || die "docker is not installed (no 'docker' command); nothing was started."
docker info >/dev/null 2>&1 || die "docker is not usable: 'docker info' failed; nothing was started."
commit=$(git rev-parse --verify --quiet "$rev^{commit}") || die "'$rev' is not a commit of this repository."
rustup_home=${RUSTUP_HOME:-$HOME/.rustup}
cargo_path=$(command -v cargo) || die "no 'cargo' on PATH: this check mounts this machine's rustup toolchain."
cargo_bin=$(dirname "$cargo_path")
if [ ! -x "$cargo_bin/rustup" ] || [ ! -d "$rustup_home/toolchains" ]; then
  die "cargo ($cargo_path) is not a rustup toolchain (no rustup next to it, or no $rustup_home/toolchains); set RUSTUP_HOME or put rustup's cargo first on PATH."
fi
if [ -n "${want[test]:-}" ]; then
  docker_cli=$(readlink -f "$(command -v docker)")
  docker_sock=/var/run/docker.sock
  [ -S "$docker_sock" ] || die "the test step's swarm smoke needs the docker socket $docker_sock; nothing was started."
  [ -d /run/lock ] || die "the test step's swarm smoke needs /run/lock (its lock file); nothing was started."
fi

# --- everything below is removed on exit, by ID ---
TMP=$(mktemp -d "${TMPDIR:-/tmp}/dvm-fresh.XXXXXX")
container_id=""
volumes_made=()
bg_pids=()
cleanup() {
  local rc=$?
  set +e
  trap '' INT TERM
  if [ -n "$container_id" ] && [ -s "$TMP/step.running" ]; then
    # A step still runs (Ctrl-C): end its process group inside the container so its own traps
    # run (the swarm smoke removes its swarm objects), then remove the rest.
    say "stopping step $(cat "$TMP/step.running") inside the container"
    docker exec "$container_id" sh -c 'p=$(cat /run/fresh-step.pid 2>/dev/null) || exit 0
      kill -TERM -- "-$p" 2>/dev/null || exit 0
      for i in $(seq 180); do kill -0 -- "-$p" 2>/dev/null || exit 0; sleep 0.5; done
      kill -KILL -- "-$p" 2>/dev/null' >/dev/null 2>&1
  fi
  local p
  for p in "${bg_pids[@]}"; do kill "$p" 2>/dev/null; done
  if [ "$keep" -eq 1 ] && [ -n "$container_id" ]; then
    say "--keep: left running: container $CONTAINER (docker exec -it $CONTAINER bash; the source is $SRC_ROOT), volumes ${volumes_made[*]}"
    say "remove them with: docker rm -f $CONTAINER; docker volume rm ${volumes_made[*]}"
  else
    [ -n "$container_id" ] && docker rm -f "$container_id" >/dev/null 2>&1
    local v
    for v in "${volumes_made[@]}"; do docker volume rm "$v" >/dev/null 2>&1; done
  fi
  if [ -n "${want[test]:-}" ] && [ "$keep" -eq 0 ]; then
    # The swarm smoke inside removes what it created; this is the backstop for a kill.
    local c
    for c in $(docker ps -aq --filter "label=dvm.dockerswarm=$SWARM_ID"); do docker rm -f "$c" >/dev/null 2>&1; done
    for c in $(docker service ls -q --filter "label=dvm.dockerswarm=$SWARM_ID" 2>/dev/null); do docker service rm "$c" >/dev/null 2>&1; done
    for c in $(docker network ls -q --filter "label=dvm.dockerswarm=$SWARM_ID"); do docker network rm "$c" >/dev/null 2>&1; done
  fi
  rm -rf "$TMP"
  exit "$rc"
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT
trap 'say "terminated"; exit 143' TERM

fmt() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

# --- the base image: a minbase bookworm, cached under the hash of what builds it ---
MIRROR=http://deb.debian.org/debian
SECURITY=http://deb.debian.org/debian-security
MMDEBSTRAP_ARGS=(--variant=minbase bookworm "deb $MIRROR bookworm main" "deb $MIRROR bookworm-updates main"
  "deb $SECURITY bookworm-security main")
IMPORT_CHANGES=(--change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
  --change "LABEL $LABEL_KEY.image=base")
base_tag=$(printf '%s\n' v1 "${MMDEBSTRAP_ARGS[@]}" "${IMPORT_CHANGES[@]}" | sha256sum | cut -c1-16)
BASE="$BASE_REPO:$base_tag"
t0=$SECONDS
if docker image inspect "$BASE" >/dev/null 2>&1; then
  base_note="cached"
  say "base image $BASE (cached)"
else
  command -v mmdebstrap >/dev/null || die "building the base image $BASE needs mmdebstrap (apt-get install -y mmdebstrap)."
  say "building base image $BASE (mmdebstrap --variant=minbase bookworm; once per machine)"
  if ! mmdebstrap --quiet "${MMDEBSTRAP_ARGS[@]:0:2}" "$TMP/rootfs.tar" "${MMDEBSTRAP_ARGS[@]:2}" >"$TMP/mmdebstrap.log" 2>&1; then
    tail -20 "$TMP/mmdebstrap.log" >&2
    die "mmdebstrap could not build the bookworm root filesystem (its log is above)."
  fi
  docker import "${IMPORT_CHANGES[@]}" "$TMP/rootfs.tar" "$BASE" >/dev/null || die "docker import of the root filesystem failed."
  rm -f "$TMP/rootfs.tar"
  base_note="built in $(fmt $((SECONDS - t0)))"
fi

# --- the container ---
mounts=(-v "$rustup_home:/opt/rust/rustup:ro" -v "$cargo_bin:/opt/rust/bin:ro" -v "$VOLUME:/build"
  -v "$TMP_VOLUME:/tmp")
[ -d /usr/local/share/ca-certificates ] && mounts+=(-v /usr/local/share/ca-certificates:/usr/local/share/ca-certificates:ro)
if [ -n "${want[test]:-}" ]; then
  mounts+=(-v "$docker_sock:/var/run/docker.sock" -v "$docker_cli:/usr/local/bin/docker:ro" -v /run/lock:/run/lock)
fi
for v in "$VOLUME" "$TMP_VOLUME"; do
  docker volume create --label "$LABEL_KEY=$RUN_ID" "$v" >/dev/null || die "cannot create the docker volume $v."
  volumes_made+=("$v")
done
# Network namespaces need SYS_ADMIN and NET_ADMIN and a writable /proc/sys (docker refuses
# --privileged here); --init reaps orphans like a machine's init; /dev/shm as big as a
# machine's (Open MPI's shared memory).
container_id=$(docker run -d --init --name "$CONTAINER" --hostname fresh --label "$LABEL_KEY=$RUN_ID" \
  --cap-add SYS_ADMIN --cap-add NET_ADMIN --security-opt systempaths=unconfined \
  --security-opt seccomp=unconfined --security-opt apparmor=unconfined --shm-size 4g \
  -e RUSTUP_HOME=/opt/rust/rustup -e RUSTUP_AUTO_INSTALL=0 -e PATH="$PATH_IN" -e LANG=C.UTF-8 \
  "${mounts[@]}" "$BASE" sleep infinity) || die "cannot start the container $CONTAINER from $BASE."
say "container $CONTAINER from $BASE; source: $rev = $commit (git archive)"

# A non-root user, and the committed source for root (on the volume) and for the user.
docker exec "$container_id" sh -c 'set -e
  echo "user:x:1000:1000::/home/user:/bin/bash" >>/etc/passwd
  echo "user:x:1000:" >>/etc/group
  chmod 1777 /tmp
  mkdir -p /home/user '"$SRC_USER $SRC_ROOT"' /build/cargo
  chown -R 1000:1000 /home/user
  install -m 666 /dev/null /run/fresh-step.pid' || die "cannot prepare the container (user, directories)."
git archive --format=tar "$commit" | docker exec -i "$container_id" tar -x -C "$SRC_ROOT" \
  || die "cannot unpack 'git archive $commit' in the container."
git archive --format=tar "$commit" | docker exec -i -u user "$container_id" tar -x -C "$SRC_USER" \
  || die "cannot unpack 'git archive $commit' in the container (as user)."

# Runs a step's command in the container, in its own process group (so Ctrl-C can end it),
# its output shown and kept in $TMP/NAME.log. run_step NAME DOCKER-EXEC-OPTIONS... -- CMD...
run_step() {
  local name=$1
  shift
  local opts=()
  while [ "$1" != -- ]; do opts+=("$1"); shift; done
  shift
  echo "$name" >"$TMP/step.running"
  docker exec "${opts[@]}" "$container_id" setsid -w bash -c 'echo $$ >/run/fresh-step.pid; exec "$@"' bash "$@" \
    >"$TMP/$name.log" 2>&1 &
  local pid=$!
  bg_pids+=("$pid")
  tail -n +1 -f --pid="$pid" "$TMP/$name.log" &
  local tpid=$!
  bg_pids+=("$tpid")
  local rc=0
  wait "$pid" || rc=$?
  wait "$tpid" 2>/dev/null || true
  : >"$TMP/step.running"
  return "$rc"
}

declare -A result=() took=() why=()
as_user=(-u user -e HOME=/home/user -e USER=user -w "$SRC_USER")
as_root=(-u root -e HOME=/root -e USER=root -e CARGO_HOME=/build/cargo -w "$SRC_ROOT")

step_user_demo() {
  local rc=0
  run_step user-demo "${as_user[@]}" -- scripts/demo.sh || rc=$?
  local log=$TMP/user-demo.log lines
  lines=$(grep -c . "$log" || true)
  if [ "$rc" -eq 0 ]; then
    why[user-demo]="scripts/demo.sh exited 0 as a user without the packages"
    return 1
  fi
  if [ "$lines" -ne 1 ] || ! grep -q '^missing Debian packages: ' "$log"; then
    why[user-demo]="exit $rc, but not one sentence 'missing Debian packages: ...' ($lines line(s) of output)"
    return 1
  fi
  # Every package it names is indeed absent, and it built nothing.
  local named p present=""
  named=$(sed -n 's/^missing Debian packages: \([^;]*\);.*/\1/p' "$log")
  [ -n "$named" ] || { why[user-demo]="its sentence names no package"; return 1; }
  for p in $named; do
    if docker exec "$container_id" dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      present+=" $p"
    fi
  done
  [ -z "$present" ] || { why[user-demo]="it names packages that are installed:$present"; return 1; }
  if docker exec "$container_id" test -e "$SRC_USER/target"; then
    why[user-demo]="it started building (target/ exists)"
    return 1
  fi
  why[user-demo]="exit $rc; named: $named"
}

step_root_demo() {
  local rc=0
  run_step root-demo "${as_root[@]}" -- scripts/demo.sh || rc=$?
  if [ "$rc" -ne 0 ]; then
    why[root-demo]="scripts/demo.sh exited $rc"
    return 1
  fi
  if ! grep -q '^DVM terminated cleanly' "$TMP/root-demo.log"; then
    why[root-demo]="exit 0 but no 'DVM terminated cleanly'"
    return 1
  fi
  why[root-demo]="built, ran the job, DVM terminated cleanly"
}

step_test() {
  local rc=0
  run_step test "${as_root[@]}" -e DS_ID="$SWARM_ID" -- scripts/test.sh || rc=$?
  local log=$TMP/test.log n
  n=$(sed -n 's/^skipped: \([0-9]*\) test(s)$/\1/p' "$log" | tail -1)
  if [ -z "$n" ]; then
    why[test]="scripts/test.sh exited $rc without its skip summary"
    return 1
  fi
  if [ "$n" -ne 0 ]; then
    # The lines after the summary name each skip and its reason.
    why[test]="exit $rc; $n skipped: $(sed -n '/^skipped: [0-9]* test(s)$/,$p' "$log" | sed -n 's/^  //p' | paste -sd ';' -)"
    return 1
  fi
  if [ "$rc" -ne 0 ]; then
    # The failing tests by name (cargo's "test NAME ... FAILED" lines), and the swarm smoke's
    # verdict when it failed.
    local failed smoke
    failed=$(sed -n 's/^test \(.*\) \.\.\. FAILED$/\1/p' "$log" | sort -u | paste -sd ' ' -)
    smoke=$(grep '^smoke.sh: ' "$log" | tail -1)
    case "$smoke" in *"passed in"*) smoke="" ;; esac
    why[test]="scripts/test.sh exited $rc, nothing skipped; failed: ${failed:-no Rust test}${smoke:+; $smoke}"
    return 1
  fi
  why[test]="nothing skipped"
}

status=0
for s in "${steps[@]}"; do
  say "=== step $s ==="
  t0=$SECONDS
  if "step_${s//-/_}"; then result[$s]=PASS; else result[$s]=FAIL; status=1; fi
  took[$s]=$((SECONDS - t0))
  say "=== step $s: ${result[$s]} in $(fmt "${took[$s]}") (${why[$s]:-}) ==="
done

echo
echo "fresh_check: $rev = $commit, base image $BASE ($base_note)"
for s in "${steps[@]}"; do
  printf '  %-10s %s  %8s  %s\n' "$s" "${result[$s]}" "$(fmt "${took[$s]}")" "${why[$s]:-}"
done
[ "$status" -eq 0 ] && echo "fresh_check: PASSED" || echo "fresh_check: FAILED"
exit "$status"
