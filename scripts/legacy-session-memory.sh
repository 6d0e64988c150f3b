#!/usr/bin/env bash
# What an idle legacy session costs the Python SDK's FastMCP 1.x server (the test suite's
# legacy peer): the server's resident memory per session left idle, as the gateway's idle
# pool leaves them (docs/operations.md, pooled sessions).
#   scripts/legacy-session-memory.sh          # N = 1024, each with its GET stream, as pooled
#   scripts/legacy-session-memory.sh 256
#   scripts/legacy-session-memory.sh 1024 --no-get-stream
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(tests/peers/setup.sh | grep '^LEGACY_PYTHON=')"
exec "$LEGACY_PYTHON" scripts/legacy_session_memory.py "$@"
