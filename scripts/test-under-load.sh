#!/usr/bin/env bash
# Run the whole test suite (scripts/test-all.sh) while background CPU burners keep every core
# busy, to find tests that only pass when the machine is idle (a test that waits "long enough"
# instead of for an event).
#
#   scripts/test-under-load.sh [BURNERS] [-- extra args for cargo test]
#
# BURNERS defaults to twice the number of cores. The burners run at normal priority and are
# killed when the script exits, whatever the outcome.
set -euo pipefail
cd "$(dirname "$0")/.."

burners=$(( $(nproc) * 2 ))
if [ $# -gt 0 ] && [ "$1" != "--" ]; then
  burners=$1
  shift
fi
[ "${1:-}" = "--" ] && shift

pids=()
stop_burners() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap stop_burners EXIT

printf '\n== %s CPU burners on %s cores\n' "$burners" "$(nproc)" >&2
for _ in $(seq "$burners"); do
  ( while :; do :; done ) &
  pids+=("$!")
done

scripts/test-all.sh "$@"
