#!/usr/bin/env bash
# What an idle legacy session costs the Python SDK's FastMCP 1.x server (the test suite's
# legacy peer): the server's resident memory per session left idle, as the gateway's idle
# pool leaves them (docs/operations.md, pooled sessions).
#   scripts/legacy-session-memory.sh          # N = 1024
#   scripts/legacy-session-memory.sh 256
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-1024}"
eval "$(tests/peers/setup.sh | grep '^LEGACY_PYTHON=')"
exec "$LEGACY_PYTHON" scripts/legacy_session_memory.py "$n"
