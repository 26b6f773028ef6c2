#!/usr/bin/env bash
# The main job on the embedded default: boot a 4-daemon DVM on this machine (radix 2, so the
# tree has relays), run a real 8-process job on it with tagged output, time the DVM's
# collectives, and stop it. Exits non-zero if any step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bins
bin=$PWD/target/release
uri=$(mktemp)
trap '"$bin/pterm" --dvm-uri "file:$uri" >/dev/null 2>&1 || true; rm -f "$uri"' EXIT
"$bin/dvmd" --local 4 --slots 2 --radix 2 --report-uri "$uri" --daemonize
"$bin/prun" --dvm-uri "file:$uri" -n 8 --output tag sh -c 'echo "rank $DVM_RANK of $DVM_SIZE on daemon $DVM_DAEMON ($DVM_NODE)"'
"$bin/dvm-bench" --dvm-uri "file:$uri" --count 100 --modex-bytes 0,64,8192 --xcast-bytes 64,1048576
"$bin/pterm" --dvm-uri "file:$uri"
echo "DVM terminated cleanly"
