#!/usr/bin/env bash
# The main job on the embedded default: boot an 8-daemon DVM on this machine (radix 2, so the
# tree has relays), show its tree, run the collective benchmark on it, and stop it.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bins
bin=target/release
uri=$(mktemp)
trap '"$bin/pterm" --dvm-uri "file:$uri" >/dev/null 2>&1 || true; rm -f "$uri"' EXIT
"$bin/dvmd" --local "${DVM_DEMO_DAEMONS:-8}" --radix 2 --report-uri "$uri" --daemonize
"$bin/dvm-bench" --dvm-uri "file:$uri" --count 100 --modex-bytes 0,64,8192 --xcast-bytes 64,1048576
"$bin/dvm-bench" --dvm-uri "file:$uri" --check-fences 1000
"$bin/pterm" --dvm-uri "file:$uri"
echo "DVM terminated cleanly"
