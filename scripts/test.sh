#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what the tests need (Redis, nginx,
# podman and runc, the pinned Python MCP SDKs and the pinned TypeScript reference server),
# checks formatting and lints, builds the release binary for the image test, then runs every
# test.
#   scripts/test.sh            # everything
#   scripts/test.sh -E 'test(interop)'   # extra arguments go to cargo nextest
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

step "system packages (redis-server, nginx-light, podman, runc, binutils; Node.js 20 must be present)"
# nginx is the real TLS terminator in front of the Python legacy server (tests/it/upstream_tls.rs).
# Pinned to Debian 12's nginx 1.22 series; the exact build is the archive's current one.
# podman builds and runs the container image (tests/it/image.rs, scripts/build-image.sh, which
# also needs binutils' objcopy and readelf and apt-get download); runc is the OCI runtime the
# test uses, because Debian 12's crun cannot start containers on hosts with a hybrid cgroup
# layout (see tests/it/image.rs).
NGINX_SERIES="1.22."
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
{ [ -x /usr/sbin/nginx ] && /usr/sbin/nginx -v 2>&1 | grep -q "nginx/${NGINX_SERIES}"; } || missing+=(nginx-light)
command -v podman >/dev/null 2>&1 || missing+=(podman)
command -v runc >/dev/null 2>&1 || missing+=(runc)
{ command -v objcopy && command -v readelf; } >/dev/null 2>&1 || missing+=(binutils)
if [ "${#missing[@]}" -gt 0 ]; then
  as_root apt-get update -qq
  # A policy-rc.d answering 101 installs without starting the distribution's services (nginx
  # on port 80); one the machine already has is left as it is.
  own_policy=
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | as_root tee /usr/sbin/policy-rc.d >/dev/null
    as_root chmod +x /usr/sbin/policy-rc.d
    own_policy=1
  fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  if [ -n "$own_policy" ]; then as_root rm -f /usr/sbin/policy-rc.d; fi
fi
/usr/sbin/nginx -v 2>&1 | grep "nginx/${NGINX_SERIES}" || { echo "nginx ${NGINX_SERIES}x is required" >&2; exit 1; }
redis-server --version
podman --version
runc --version | sed -n 1p
# The TypeScript reference server (tests/peers/ts) runs on Node.js 20 or newer (its HTTP layer,
# @hono/node-server, requires 20). The machines this project runs on ship Node.js 20 with npm;
# Debian 12's own nodejs is 18 and no other source is reachable from them, so a machine
# without it is told so rather than given a Node.js the peer cannot run on.
node_major() { node --version 2>/dev/null | sed -E 's/^v([0-9]+).*/\1/'; }
if ! command -v npm >/dev/null 2>&1 || [ "$(node_major || echo 0)" -lt 20 ]; then
  echo "Node.js 20 or newer with npm is required (found: $(node --version 2>/dev/null || echo none))" >&2
  exit 1
fi
node --version

step "peers (Python: mcp 1.x legacy server, mcp 2.x modern client; TypeScript: server-everything)"
tests/peers/setup.sh

step "format and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings

# The image test (tests/it/image.rs) builds the release binary through scripts/build-image.sh.
# On the whole suite it is built here first, on an otherwise idle machine: built inside the
# test run, it would compete for the cores with the timing-sensitive tests. A filtered run
# leaves it to the image test, if selected.
if [ "$#" -eq 0 ]; then
  step "release binary (for the container image test)"
  cargo build --release --locked --bin mrtr-gateway
fi

step "tests"
export MRTR_PEERS_DIR="$PWD/.peers"
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --locked --no-fail-fast "$@"
else
  cargo test --workspace --locked --no-fail-fast
fi
