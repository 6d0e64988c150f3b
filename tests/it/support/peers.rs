//! The official Python SDKs as test peers: `mcp==1.30.0` FastMCP as the legacy server and
//! `mcp==2.3.0` `Client` as the modern client. `scripts/test.sh` installs them into `.peers/`
//! (see `tests/peers/README.md`); a test that needs them fails loudly when they are missing.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn peers_dir() -> PathBuf {
    let dir = std::env::var_os("MRTR_PEERS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".peers"));
    assert!(
        dir.join("legacy/bin/python").exists() && dir.join("modern/bin/python").exists(),
        "the Python peers are not installed in {}: run scripts/test.sh (or tests/peers/setup.sh)",
        dir.display()
    );
    dir
}

pub fn legacy_python() -> PathBuf {
    peers_dir().join("legacy/bin/python")
}

/// `upstream.command` (a TOML array) running the Python FastMCP legacy server over stdio, with
/// `extra` arguments (`--count-file PATH`, ...).
pub fn python_stdio_command(extra: &[&str]) -> String {
    let python = legacy_python();
    let server = repo().join("tests/peers/legacy_server.py");
    let mut args = vec![
        python.to_string_lossy().into_owned(),
        server.to_string_lossy().into_owned(),
        "--transport".to_string(),
        "stdio".to_string(),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    crate::support::toml_strings(&args)
}

pub fn modern_python() -> PathBuf {
    peers_dir().join("modern/bin/python")
}

/// A FastMCP legacy server process; killed when dropped.
pub struct PyLegacyServer {
    pub child: Child,
    pub port: u16,
    pub count_file: PathBuf,
    _dir: tempdir::TempDir,
}

pub mod tempdir {
    use std::path::{Path, PathBuf};

    /// A directory removed on drop (tests only; avoids a dependency for one use).
    pub struct TempDir(PathBuf);

    impl TempDir {
        pub fn new(prefix: &str) -> TempDir {
            let mut b = [0u8; 8];
            getrandom::fill(&mut b).unwrap();
            let name: String = b.iter().map(|x| format!("{x:02x}")).collect();
            let p = std::env::temp_dir().join(format!("{prefix}-{name}"));
            std::fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Spawns a peer server that reports where it listens on stdout: no stdin, stdout piped back
/// to the test, stderr to `stderr`, killed when dropped. Panics with `what` if it cannot start.
fn spawn_reporting(cmd: &mut Command, stderr: Stdio, what: &str) -> Child {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .expect(what)
}

impl PyLegacyServer {
    /// Starts `legacy_server.py` on a free loopback port (`extra` are more CLI flags).
    pub async fn start(extra: &[&str]) -> PyLegacyServer {
        Self::start_on(0, extra).await
    }

    pub async fn start_on(port: u16, extra: &[&str]) -> PyLegacyServer {
        let dir = tempdir::TempDir::new("mrtr-peer");
        let count_file = dir.path().join("counts");
        let mut child = spawn_reporting(
            Command::new(legacy_python())
                .arg(repo().join("tests/peers/legacy_server.py"))
                .args(["--host", "127.0.0.1", "--port", &port.to_string()])
                .arg("--count-file")
                .arg(&count_file)
                .args(extra),
            Stdio::inherit(),
            "the legacy Python server starts",
        );
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("the legacy server reports its port within 60 s")
            .unwrap()
            .expect("a LISTENING line");
        let port = line
            .strip_prefix("LISTENING ")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
        PyLegacyServer {
            child,
            port,
            count_file,
            _dir: dir,
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// The HTTP+SSE endpoint (when started with `--transport sse`).
    pub fn sse_url(&self) -> String {
        format!("http://127.0.0.1:{}/sse", self.port)
    }

    /// How many times each tool / prompt / resource body started.
    pub fn starts(&self, name: &str) -> usize {
        starts_in(&self.count_file, name)
    }

    pub async fn kill(mut self) {
        let _ = self.child.kill().await;
    }
}

/// How many times each body started, from a `--count-file`.
pub fn starts_in(count_file: &std::path::Path, name: &str) -> usize {
    std::fs::read_to_string(count_file)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.trim() == name)
        .count()
}

/// The text of a tool, prompt or resource result in a scenario report.
pub fn result_text(report: &Value) -> String {
    let r = &report["result"];
    r.pointer("/content/0/text")
        .or_else(|| r.pointer("/messages/0/content/text"))
        .or_else(|| r.pointer("/contents/0/text"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// The `progress` values of the notifications a scenario report collected, in order.
pub fn progress_values(report: &Value) -> Vec<f64> {
    report["progress"]
        .as_array()
        .expect("the report lists progress notifications")
        .iter()
        .map(|p| p["progress"].as_f64().unwrap())
        .collect()
}

/// The scenario ran without error and (in raw mode) without protocol violations.
pub fn assert_ok(report: &Value) {
    assert_eq!(report["ok"], true, "{report:#}");
    assert!(
        report["violations"].as_array().is_none_or(Vec::is_empty),
        "{report:#}"
    );
}

/// Raw-mode rounds that asked for input, with their request methods (sorted).
pub fn input_rounds(report: &Value) -> Vec<Vec<String>> {
    report["rounds"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["resultType"] == "input_required")
        .map(|r| {
            let mut m: Vec<String> = r["inputRequests"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(_, v)| v["method"].as_str().unwrap_or_default().to_string())
                .collect();
            m.sort();
            m
        })
        .collect()
}

/// Runs one `modern_client.py` scenario against `url`; returns its JSON report.
pub async fn modern_scenario(url: &str, scenario: &str, extra: &[&str]) -> Value {
    let args = ["--url", url, "--scenario", scenario];
    client_report(modern_python(), "modern_client.py", &args, extra).await
}

/// Runs `legacy_client.py` (mcp 1.30.0 `ClientSession`) against `url`; returns its JSON report.
pub async fn legacy_client(url: &str, extra: &[&str]) -> Value {
    client_report(legacy_python(), "legacy_client.py", &["--url", url], extra).await
}

/// Runs the client script `script` (in `tests/peers`) with `args` then `extra`, allowing it
/// 90 s; asserts it succeeded and returns the JSON report it printed.
async fn client_report(python: PathBuf, script: &str, args: &[&str], extra: &[&str]) -> Value {
    let out = tokio::time::timeout(
        Duration::from_secs(90),
        Command::new(python)
            .arg(repo().join("tests/peers").join(script))
            .args(args)
            .args(extra)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{script} finishes within 90 s"))
    .unwrap_or_else(|e| panic!("{script} runs: {e}"));
    let stdout = successful_stdout(&out, &format!("{script} {args:?} {extra:?}"));
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("bad report ({e}): {stdout}"))
}

/// The stdout of a finished process, once it is asserted to have exited successfully (the
/// failure names `what` and shows the status, stdout and stderr).
pub fn successful_stdout(out: &std::process::Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} exited {}: {stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The TypeScript reference server `@modelcontextprotocol/server-everything` (legacy SDK 1.x,
/// protocol 2025-11-25) over Streamable HTTP, pinned in `tests/peers/ts/package-lock.json` and
/// installed into `.peers/ts` by `tests/peers/setup.sh`. It listens on a free loopback port
/// (`tests/peers/ts/loopback.mjs` sees to that) and is killed when dropped.
///
/// What the tests rely on: it registers `get-roots-list`, `trigger-elicitation-request` and
/// `trigger-sampling-request` only on sessions whose `initialize` declared roots, elicitation
/// and sampling; it caches the client's roots per session and asks again when the client
/// sends `notifications/roots/list_changed`.
pub struct EverythingServer {
    pub child: Child,
    pub port: u16,
    _drain: tokio::task::JoinHandle<()>,
}

pub fn everything_entry() -> PathBuf {
    let entry =
        peers_dir().join("ts/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        entry.exists(),
        "the TypeScript peer is not installed at {}: run scripts/test.sh (or tests/peers/setup.sh)",
        entry.display()
    );
    entry
}

impl EverythingServer {
    pub async fn start() -> EverythingServer {
        let mut child = spawn_reporting(
            Command::new("node")
                .arg("--import")
                .arg(repo().join("tests/peers/ts/loopback.mjs"))
                .arg(everything_entry())
                .arg("streamableHttp")
                .env("PORT", "0"),
            Stdio::null(),
            "node runs the everything server",
        );
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let port = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = lines.next_line().await.expect("server stdout") {
                if let Some(p) = line.strip_prefix("LISTENING ") {
                    return p.trim().parse::<u16>().expect("a port number");
                }
            }
            panic!("the everything server exited before it listened");
        })
        .await
        .expect("the everything server listens within 60 s");
        // It logs every request on stdout, which is a pipe: keep reading so it never blocks.
        let drain = tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        EverythingServer {
            child,
            port,
            _drain: drain,
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    pub async fn kill(mut self) {
        let _ = self.child.kill().await;
    }
}
