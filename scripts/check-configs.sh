#!/usr/bin/env bash
# `mrtr-gateway check-config` off-cluster on the given TOML files, or on every configuration this
# repository ships (under config/ and deploy/) when none is given. A Kubernetes configuration reads its keys from a mounted Secret
# (state.keys_dir) and, with the Redis store, its Redis URLs from the environment; here each
# gets what its pod would: a directory holding one fresh key (made with `keygen --dir`), and a
# stand-in URL of the documented shape. Nothing is contacted.
#   cargo build --release && scripts/check-configs.sh
#   scripts/check-configs.sh my-app-gateway/gateway.toml
#   MRTR_GATEWAY_BIN=path/to/mrtr-gateway scripts/check-configs.sh
# Prints each file's name, then check-config's own output. Exit status 0 when every file
# passes, otherwise 64 (after checking them all).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
bin="${MRTR_GATEWAY_BIN:-$repo/target/release/mrtr-gateway}"
[ -x "$bin" ] || { echo "check-configs: no $bin (cargo build --release, or set MRTR_GATEWAY_BIN)" >&2; exit 2; }

keys="$(mktemp -d)"
trap 'rm -rf "$keys"' EXIT
"$bin" keygen --dir "$keys" >/dev/null
redis_stand_in='["rediss://gateway:stand-in-password@redis.example.internal:6380/0"]'

status=0
while IFS= read -r file; do
    vars=()
    # The same rule as the pod: the Secret's directory for a file that names one, the Redis
    # URLs for a Redis store whose file leaves them to the environment.
    if grep -Eq '^[[:space:]]*keys_dir[[:space:]]*=' "$file"; then
        vars+=("MRTR_GATEWAY__STATE__KEYS_DIR=$keys")
    fi
    if grep -Eq '^[[:space:]]*store[[:space:]]*=[[:space:]]*"redis"' "$file" \
        && ! grep -Eq '^[[:space:]]*urls[[:space:]]*=' "$file"; then
        vars+=("MRTR_GATEWAY__SINGLE_USE__REDIS__URLS=$redis_stand_in")
    fi
    echo "== ${file#"$repo"/}"
    if ! env "${vars[@]}" "$bin" check-config --config "$file"; then
        status=64
    fi
done < <(if [ "$#" -gt 0 ]; then printf '%s\n' "$@"; else
    find "$repo/config" "$repo/deploy" -name '*.toml' -type f | sort; fi)
exit "$status"
