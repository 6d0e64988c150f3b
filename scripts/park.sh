#!/usr/bin/env bash
# Parked-call memory: parks N calls in the gateway (a child process), reads its VmRSS before
# and after, and reports bytes per parked call (target: 10,000 parked calls <= 256 MiB).
#   scripts/park.sh            # N = 10000
#   scripts/park.sh 2000 [--park-concurrency 64] [--json]
# Each parked call holds two upstream connections in the gateway and two in the load process
# (the legacy server), so the descriptor limit is raised first.
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-10000}"
shift || true
ulimit -n 65536 2>/dev/null || {
  ulimit -n "$(ulimit -Hn)"
  echo "park.sh: could not raise the fd limit to 65536 (now $(ulimit -n)); large N may fail" >&2
}
exec cargo bench --locked --bench load -- --park "$n" "$@"
