#!/usr/bin/env bash
# Create the Python virtualenvs the tests run their peers and tools in:
#   <repo>/.peers/legacy  <- requirements-legacy.txt (mcp 1.30.0)
#   <repo>/.peers/modern  <- requirements-modern.txt (mcp 2.3.0)
#   <repo>/.peers/tools   <- requirements-tools.txt (kubernetes-validate, kubectl for kustomize)
# Idempotent: a venv is rebuilt only when its requirements file or the base
# Python changed (a stamp file inside the venv records what was installed).
# Progress goes to stderr; stdout gets exactly three lines at the end:
#   LEGACY_PYTHON=/abs/path/.peers/legacy/bin/python
#   MODERN_PYTHON=/abs/path/.peers/modern/bin/python
#   TOOLS_PYTHON=/abs/path/.peers/tools/bin/python
# Environment: PYTHON (base interpreter, default python3), PEERS_DIR (default <repo>/.peers).
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

ensure_venv legacy requirements-legacy.txt "python -c 'import mcp'"
ensure_venv modern requirements-modern.txt "python -c 'import mcp'"
ensure_venv tools requirements-tools.txt \
    "python -c 'import kubernetes_validate, yaml' && kubectl version --client"

echo "LEGACY_PYTHON=$peers/legacy/bin/python"
echo "MODERN_PYTHON=$peers/modern/bin/python"
echo "TOOLS_PYTHON=$peers/tools/bin/python"
