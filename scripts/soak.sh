#!/usr/bin/env bash
# Soak: a bounded mixed run (plain calls, three-round flows, tampered states, client
# disconnects, abandoned flows) against the gateway, which runs as a child process so its
# resident memory (VmRSS, sampled every few seconds) is its own. Prints start, peak and end
# RSS, operation counts and unexpected outcomes, and what the gateway still holds afterwards.
#   scripts/soak.sh                          # 5 minutes, 8 clients
#   scripts/soak.sh --duration 2m --clients 16 --sample-every 2s [--json]
# Builds the release profile on first use (minutes on a small machine).
set -euo pipefail
cd "$(dirname "$0")/.."
# Each in-flight call holds a few sockets on each side.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
exec cargo bench --locked --bench load -- --soak "$@"
