#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what the tests need (Redis, the pinned
# Python MCP SDKs), checks formatting and lints, then runs every test.
#   scripts/test.sh            # everything
#   scripts/test.sh -E 'test(interop)'   # extra arguments go to cargo nextest
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

step "system packages (redis-server)"
if ! command -v redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  else
    sudo apt-get update -qq
    sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  fi
fi
redis-server --version

step "Python peers (mcp 1.x legacy server, mcp 2.x modern client)"
tests/peers/setup.sh

step "format and lints"
cargo fmt --all -- --check
cargo clippy --all-targets --locked -- -D warnings

step "tests"
export MRTR_PEERS_DIR="$PWD/.peers"
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --locked --no-fail-fast "$@"
else
  cargo test --locked --no-fail-fast
fi
