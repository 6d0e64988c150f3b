#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what the tests need (Redis, Node.js 20,
# the pinned Python MCP SDKs and the pinned TypeScript reference server), checks formatting and
# lints, then runs every test.
#   scripts/test.sh            # everything
#   scripts/test.sh -E 'test(interop)'   # extra arguments go to cargo nextest
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

step "system packages (redis-server, Node.js 20)"
if ! command -v redis-server >/dev/null 2>&1; then
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
fi
redis-server --version
# The TypeScript reference server needs Node.js 20 or newer; Debian 12 ships 18, so the
# NodeSource repository for the 20.x line is added (signed; the same source as the CI image).
node_major() { node --version 2>/dev/null | sed -E 's/^v([0-9]+).*/\1/'; }
if ! command -v npm >/dev/null 2>&1 || [ "$(node_major || echo 0)" -lt 20 ]; then
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ca-certificates curl gnupg >/dev/null
  as_root install -d -m 0755 /usr/share/keyrings
  curl -fsSL https://deb.nodesource.com/gpgkey/nodesource-repo.gpg.key \
    | as_root gpg --dearmor --yes -o /usr/share/keyrings/nodesource.gpg
  echo "deb [signed-by=/usr/share/keyrings/nodesource.gpg] https://deb.nodesource.com/node_20.x nodistro main" \
    | as_root tee /etc/apt/sources.list.d/nodesource.list >/dev/null
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs >/dev/null
fi
node --version

step "peers (Python: mcp 1.x legacy server, mcp 2.x modern client; TypeScript: server-everything)"
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
