//! Clients are told what failed in their terms, plus a request id; never the legacy server's
//! internals (a stdio child's stderr, its command line, an upstream error body, the upstream's
//! address or URL userinfo). The detail is in a WARN log line carrying the same request id.
//! URL userinfo is also kept out of what `check-config` and the "listening" line print.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::logs::assert_detail_logged_not_told;
use crate::support::peers::PyLegacyServer;
use crate::support::*;
use mrtr_testkit::client::{Exchange, ModernClient};
use serde_json::{Value, json};

async fn tools_list(url: &str) -> Exchange {
    ModernClient::new(url)
        .request("tools/list", json!({}))
        .await
        .unwrap()
}

/// The whole response body as the client got it.
fn body_of(ex: &Exchange) -> String {
    String::from_utf8_lossy(&ex.raw_body).into_owned()
}

#[tokio::test]
async fn a_stdio_child_s_stderr_and_command_line_stay_in_the_log() {
    // A server that fails at start, saying why on stderr with a DSN that holds a password,
    // started with an API key on its command line.
    let script = "import sys; sys.stderr.write('cannot connect to postgres://app:dsn-s3cret@db.internal/app\\n'); sys.stderr.flush(); sys.exit(3)";
    let command = toml_strings(&["python3", "-c", script, "--api-key=API-KEY-123"]);
    let cfg = config_with_upstream(
        &format!(
            "transport = \"stdio\"\ncommand = {command}\nresponse_timeout = \"10s\"\nstdio_spawn_backoff = \"30s\"\n"
        ),
        "",
        "",
    );
    let (gw, running, url) = start_gateway(cfg).await;

    let first = tools_list(&url).await;
    assert_eq!(first.status.as_u16(), 502, "{}", body_of(&first));
    let shown = body_of(&first);
    for secret in ["dsn-s3cret", "db.internal", "API-KEY-123", "python3"] {
        assert!(
            !shown.contains(secret),
            "{secret} reached the client: {shown}"
        );
    }
    let error = first.error().unwrap();
    assert_detail_logged_not_told(error, "dsn-s3cret");

    // Until the back-off ends, calls are refused at once; the refusal names the command in the
    // log only.
    let held = tools_list(&url).await;
    assert_eq!(held.status.as_u16(), 503, "{}", body_of(&held));
    assert!(
        !body_of(&held).contains("API-KEY-123"),
        "{}",
        body_of(&held)
    );
    assert_detail_logged_not_told(held.error().unwrap(), "API-KEY-123");

    // /readyz names the failing check, not the command line or the stderr line.
    let admin = crate::support::admin::start(gw.clone()).await;
    let (status, body) = crate::support::admin::get(&format!("{admin}/readyz")).await;
    assert_eq!(status, 503);
    let readyz = body.to_string();
    assert_eq!(body["checks"]["upstream"]["ok"], false, "{readyz}");
    for secret in ["dsn-s3cret", "API-KEY-123", "python3"] {
        assert!(!readyz.contains(secret), "{secret} in /readyz: {readyz}");
    }
    running.stop().await;
}

#[tokio::test]
async fn an_upstream_error_body_and_its_url_stay_in_the_log() {
    let legacy = PyLegacyServer::start(&[]).await;
    // A wrong path (the server answers 404 with its own body), and a password in the URL.
    let upstream = format!(
        "http://svc:url-s3cret@127.0.0.1:{}/not-the-endpoint",
        legacy.port
    );
    let (_gw, running, url) = start_gateway(config(&upstream, "", "", "")).await;
    let ex = tools_list(&url).await;
    assert_eq!(ex.status.as_u16(), 502, "{}", body_of(&ex));
    let shown = body_of(&ex);
    for secret in ["Not Found", "url-s3cret", &legacy.port.to_string()] {
        assert!(
            !shown.contains(secret),
            "{secret} reached the client: {shown}"
        );
    }
    let error: &Value = ex.error().unwrap();
    assert!(
        error["message"].as_str().unwrap().contains("HTTP 404"),
        "{error}"
    );
    // The upstream's body is in the log line with the client's request id.
    assert_detail_logged_not_told(error, "Not Found");
    running.stop().await;

    // An HTTP+SSE upstream that is not one: the error would name the URL; it reaches the log
    // without its password, and the client not at all.
    let upstream = format!("http://svc:url-s3cret@127.0.0.1:{}/mcp", legacy.port);
    let cfg = config_with_upstream(
        &format!("transport = \"sse\"\nurl = \"{upstream}\"\nresponse_timeout = \"5s\"\n"),
        "",
        "",
    );
    let (_gw, running, url) = start_gateway(cfg).await;
    let ex = tools_list(&url).await;
    assert_eq!(ex.status.as_u16(), 502, "{}", body_of(&ex));
    assert!(!body_of(&ex).contains("url-s3cret"), "{}", body_of(&ex));
    let id = crate::support::logs::request_id_of(ex.error().unwrap());
    let warned = crate::support::logs::warn_lines(&id);
    assert!(!warned.is_empty(), "no WARN line for request {id}");
    assert!(
        warned.iter().all(|l| !l.contains("url-s3cret")),
        "{warned:#?}"
    );
    running.stop().await;
    legacy.kill().await;
}

/// `check-config`, `check-config --print` and the "listening" log line print the upstream URL
/// without its userinfo; `check-config` warns when a stdio command is not on PATH.
#[tokio::test]
async fn printed_and_logged_config_hides_url_userinfo() {
    let dir = crate::support::peers::tempdir::TempDir::new("mrtr-redaction");
    let path = dir.path().join("g.toml");
    let (port, upstream_port) = (free_port(), free_port());
    std::fs::write(
        &path,
        format!(
            "[listen]\naddr = \"127.0.0.1:{port}\"\n[admin]\naddr = \"\"\n[upstream]\nurl = \"http://svc:url-s3cret@127.0.0.1:{upstream_port}/mcp\"\n[log]\nformat = \"text\"\n[[state.keys]]\nid = \"k1\"\nsecret = \"{TEST_KEY}\"\n"
        ),
    )
    .unwrap();
    let bin = env!("CARGO_BIN_EXE_mrtr-gateway");
    for args in [&["check-config"][..], &["check-config", "--print"][..]] {
        let out = std::process::Command::new(bin)
            .args(args)
            .arg("--config")
            .arg(&path)
            .output()
            .unwrap();
        let printed = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{args:?}: {printed}");
        assert!(!printed.contains("url-s3cret"), "{args:?}: {printed}");
        assert!(printed.contains("redacted"), "{args:?}: {printed}");
    }

    // The "listening" line of `serve`.
    let mut child = std::process::Command::new(bin)
        .args(["serve", "--config"])
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut seen = Vec::new();
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let done = line.contains("mrtr-gateway listening");
            seen.push(line);
            if done || Instant::now() > deadline {
                break;
            }
        }
        seen
    });
    let seen = reader.join().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let listening = seen
        .iter()
        .find(|l| l.contains("mrtr-gateway listening"))
        .unwrap_or_else(|| panic!("no listening line: {seen:#?}"));
    assert!(!listening.contains("url-s3cret"), "{listening}");
    assert!(listening.contains("redacted"), "{listening}");

    // A stdio command that is not on PATH: valid, but check-config warns, naming the key.
    std::fs::write(
        &path,
        format!(
            "[upstream]\ntransport = \"stdio\"\ncommand = [\"no-such-mcp-server-xyz\", \"--flag\"]\n[[state.keys]]\nid = \"k1\"\nsecret = \"{TEST_KEY}\"\n"
        ),
    )
    .unwrap();
    let out = std::process::Command::new(bin)
        .args(["check-config", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning")
            && stderr.contains("upstream.command[0]")
            && stderr.contains("MRTR_GATEWAY__UPSTREAM__COMMAND")
            && stderr.contains("not found on PATH"),
        "{stderr}"
    );
}
