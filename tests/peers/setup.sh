#!/usr/bin/env bash
# Create the Python virtualenvs the tests run their peers and tools in:
#   <repo>/.peers/legacy  <- requirements-legacy.txt (mcp 1.30.0)
#   <repo>/.peers/modern  <- requirements-modern.txt (mcp 2.3.0)
#   <repo>/.peers/tools   <- requirements-tools.txt (kubernetes-validate, kubectl for kustomize)
# and the npm project the TypeScript peer runs from:
#   <repo>/.peers/ts      <- ts/package.json + ts/package-lock.json
#                            (@modelcontextprotocol/server-everything, installed with `npm ci`)
# Idempotent: a venv (or the npm project) is rebuilt only when its requirements (package
# files) or the base Python (Node) changed; a stamp file inside records what was installed.
# Progress goes to stderr; stdout gets exactly four lines at the end:
#   LEGACY_PYTHON=/abs/path/.peers/legacy/bin/python
#   MODERN_PYTHON=/abs/path/.peers/modern/bin/python
#   TOOLS_PYTHON=/abs/path/.peers/tools/bin/python
#   TS_EVERYTHING=/abs/path/.peers/ts/node_modules/@modelcontextprotocol/server-everything/dist/index.js
# Environment: PYTHON (base interpreter, default python3), PEERS_DIR (default <repo>/.peers).
# Node.js 20 or newer and npm must be on PATH (scripts/test.sh installs them).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
peers="${PEERS_DIR:-$repo/.peers}"
python="${PYTHON:-python3}"

say() { echo "peers/setup: $*" >&2; }

command -v "$python" >/dev/null || { say "no '$python' on PATH"; exit 1; }
mkdir -p "$peers"

# Serialize concurrent runs (tests may start several at once).
if command -v flock >/dev/null; then
    exec 9>"$peers/.setup.lock"
    flock 9
fi

fingerprint() { # requirements file -> hash of its content plus the base Python's version
    { cat "$1"; "$python" -c 'import sys; print(sys.version)'; } | sha256sum | cut -d' ' -f1
}

ensure_venv() { # name requirements-file check-command (run with the venv's bin/ on PATH)
    local dir="$peers/$1" req="$here/$2" check="$3"
    local stamp="$dir/.installed-requirements" want
    want="$(fingerprint "$req")"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] && PATH="$dir/bin:$PATH" bash -c "$check" >/dev/null 2>&1; then
        say "$1: up to date"
        return 0
    fi
    say "$1: creating venv and installing $2"
    rm -rf "$dir"
    "$python" -m venv "$dir"
    "$dir/bin/python" -m pip install --disable-pip-version-check --quiet --requirement "$req" >&2
    PATH="$dir/bin:$PATH" bash -c "$check" >&2
    echo "$want" >"$stamp"
}

ensure_npm() { # name directory-under-tests/peers (with package.json and package-lock.json)
    local dir="$peers/$1" src="$here/$2" want
    local stamp="$dir/.installed-packages"
    command -v node >/dev/null && command -v npm >/dev/null \
        || { say "$1: node and npm are needed (Node.js 20 or newer)"; exit 1; }
    want="$({ cat "$src/package.json" "$src/package-lock.json"; node --version; } | sha256sum | cut -d' ' -f1)"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -d "$dir/node_modules" ]]; then
        say "$1: up to date"
        return 0
    fi
    say "$1: installing $2/package-lock.json with npm ci"
    rm -rf "$dir"
    mkdir -p "$dir"
    cp "$src/package.json" "$src/package-lock.json" "$dir/"
    (cd "$dir" && npm ci --ignore-scripts --no-audit --no-fund >&2)
    echo "$want" >"$stamp"
}

ensure_venv legacy requirements-legacy.txt "python -c 'import mcp'"
ensure_venv modern requirements-modern.txt "python -c 'import mcp'"
ensure_venv tools requirements-tools.txt \
    "python -c 'import kubernetes_validate, yaml' && kubectl version --client"
ensure_npm ts ts

echo "LEGACY_PYTHON=$peers/legacy/bin/python"
echo "MODERN_PYTHON=$peers/modern/bin/python"
echo "TOOLS_PYTHON=$peers/tools/bin/python"
echo "TS_EVERYTHING=$peers/ts/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
