//! Rendering a kustomize directory through `tests/peers/render_manifests.py` (the tools venv:
//! kubectl's built-in kustomize, kubernetes-validate), and finding objects in the result.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

/// The Kubernetes versions every built-in object is validated against (strict schemas
/// bundled in kubernetes-validate 1.37.0): the oldest release the manifests claim (native
/// sidecars are GA from 1.33) and the newest the validator knows.
pub const KUBERNETES_VERSIONS: &[&str] = &["1.33.0", "1.37.0"];

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn tools_python() -> PathBuf {
    let peers = std::env::var_os("MRTR_PEERS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".peers"));
    let python = peers.join("tools/bin/python");
    assert!(
        python.is_file(),
        "the tools venv is not installed at {}: run scripts/test.sh (or tests/peers/setup.sh)",
        python.display()
    );
    python
}

/// What one kustomize directory renders to.
pub struct Rendered {
    pub objects: Vec<Value>,
    /// Schema violations, one line each (`<k8s version> <Kind>/<name>: <path>: <message>`).
    pub problems: Vec<String>,
    /// `Kind/name` of the objects no bundled schema covers (custom resources).
    pub unvalidated: Vec<String>,
    pub tools: Value,
}

impl Rendered {
    pub fn all(&self, kind: &str) -> Vec<&Value> {
        self.objects.iter().filter(|o| o["kind"] == kind).collect()
    }

    pub fn get(&self, kind: &str, name: &str) -> Option<&Value> {
        self.objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
    }
}

/// Renders `dir` (relative to the repository); with `validate`, also checks every built-in
/// object against [`KUBERNETES_VERSIONS`].
pub fn render(dir: &str, validate: bool) -> Rendered {
    let mut cmd = tokio::process::Command::new(tools_python());
    cmd.arg(repo().join("tests/peers/render_manifests.py"));
    if validate {
        for v in KUBERNETES_VERSIONS {
            cmd.args(["--validate", v]);
        }
    }
    cmd.arg(repo().join(dir)).kill_on_drop(true);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let out = runtime
        .block_on(async { tokio::time::timeout(Duration::from_secs(120), cmd.output()).await })
        .unwrap_or_else(|_| panic!("rendering {dir} took over 120 s"))
        .expect("the tools venv's python runs");
    assert!(
        out.status.success(),
        "rendering {dir} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let mut v: Value =
        serde_json::from_slice(&out.stdout).expect("render_manifests.py prints JSON");
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_owned())
            .collect()
    };
    Rendered {
        problems: strings(&v["problems"]),
        unvalidated: strings(&v["unvalidated"]),
        tools: v["tools"].take(),
        objects: match v["objects"].take() {
            Value::Array(a) => a,
            other => panic!("objects is not a list: {other}"),
        },
    }
}

/// `true` when every `matchLabels` pair is among `labels`.
pub fn selects(match_labels: &Value, labels: &Value) -> bool {
    match match_labels.as_object() {
        Some(m) if !m.is_empty() => m.iter().all(|(k, v)| labels.get(k) == Some(v)),
        _ => false,
    }
}
