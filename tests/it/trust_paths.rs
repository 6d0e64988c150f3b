//! Issue 23, points 1 and 2: the policy stage holds on every path a legacy server's question
//! takes to a client, and a URL is judged as the client will read it.
//!
//! Real peers throughout: the Python FastMCP legacy server (`tests/peers/legacy_server.py`),
//! Python `httpx` as the program that opens the URL a client was shown, and the Python `mcp`
//! 1.x client as the 2025-era client of the dual-era front.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::peers::{PyLegacyServer, legacy_client, legacy_python, result_text};
use crate::support::*;
use mrtr_testkit::client::ModernClient;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::process::Command;

/// A loopback listener that counts the connections it is offered (and drops them).
async fn loopback_trap() -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            drop(conn);
        }
    });
    (port, hits)
}

/// Opens `url` with Python `httpx` (from the legacy peers' environment), as a client that
/// follows the link it was shown would; any failure to fetch is expected and ignored.
async fn httpx_get(url: &str) {
    let script = "import sys, httpx\n\
                  try:\n    httpx.get(sys.argv[1], timeout=2, trust_env=False)\n\
                  except Exception as e:\n    print(type(e).__name__)\n";
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        Command::new(legacy_python())
            .args(["-c", script, url])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("httpx finishes")
    .expect("python runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every string value anywhere in `v` that looks like a URL.
fn urls_in(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) if s.contains("://") || s.starts_with("https:") => out.push(s.clone()),
        Value::Array(a) => a.iter().for_each(|x| urls_in(x, out)),
        Value::Object(o) => o.values().for_each(|x| urls_in(x, out)),
        _ => {}
    }
}

/// `https://auth.example.com\@127.0.0.1:PORT/steal` passes a WHATWG reading of
/// `allow_hosts = ["auth.example.com"]`, but `httpx` opens 127.0.0.1:PORT. Whatever the
/// gateway shows the client, opened by `httpx`, must never reach the loopback listener.
#[tokio::test]
async fn url_shown_to_the_client_is_the_url_the_guard_judged() {
    let (port, hits) = loopback_trap().await;
    let trick = format!("https://auth.example.com\\@127.0.0.1:{port}/steal");

    // The check is live: httpx on the raw text does connect to the trap.
    httpx_get(&trick).await;
    assert!(
        hits.load(Ordering::SeqCst) >= 1,
        "httpx did not read {trick} as loopback; the test proves nothing"
    );
    hits.store(0, Ordering::SeqCst);

    let legacy = PyLegacyServer::start(&[]).await;
    let (gw, running, url) = start_gateway(config(
        &legacy.url(),
        "",
        "",
        "[mrtr]\ngather_window = \"400ms\"\n[policy.url]\nallow_hosts = [\"auth.example.com\"]\n",
    ))
    .await;
    let client = ModernClient::new(&url).with_capabilities(
        json!({"elicitation": {"form": {}, "url": {}}, "sampling": {}, "roots": {}}),
    );
    for tool in ["open_url", "url_required"] {
        let ex = client
            .request(
                "tools/call",
                json!({"name": tool, "arguments": {"url": trick}}),
            )
            .await
            .expect("the gateway answers");
        let mut shown = Vec::new();
        if let Some(m) = &ex.message {
            urls_in(m, &mut shown);
        }
        for u in &shown {
            httpx_get(u).await;
        }
        assert_eq!(
            hits.load(Ordering::SeqCst),
            0,
            "{tool}: httpx opened loopback from what the client was shown: {shown:?}"
        );
        assert!(
            !String::from_utf8_lossy(&ex.raw_body).contains("127.0.0.1"),
            "{tool}: the client was shown the loopback address: {:?}",
            ex.message
        );
    }
    assert_eq!(
        metric(
            &gw,
            "mrtr_gateway_policy_refusals_total",
            &[
                ("kind", "elicitation_url"),
                ("reason", "url_parser_mismatch")
            ]
        ),
        2.0
    );
    running.stop().await;
    legacy.kill().await;
}

/// The policy of issue 23: `auth.example.com` only, sampling capped at 1024 tokens, and the
/// tool `where` may ask elicitation only.
const ISSUE_POLICY: &str = "[policy.url]\nallow_hosts = [\"auth.example.com\"]\n\
    [policy.sampling]\nmax_tokens = 1024\n\
    [[policy.rules]]\nmethod = \"tools/call\"\nname = \"where\"\nallow = [\"elicitation\"]\n";

fn refusals(gw: &mrtr_gateway::gateway::Gateway, kind: &str, reason: &str) -> f64 {
    metric(
        gw,
        "mrtr_gateway_policy_refusals_total",
        &[("kind", kind), ("reason", reason)],
    )
}

/// The Python `mcp` 1.x client through the dual-era front to FastMCP: the questions the
/// policy refuses for a 2026-07-28 client never reach it either (the legacy server is told
/// "decline" or error -1 and finishes its tool), and what passes comes rewritten as the stage
/// rewrites it.
#[tokio::test]
async fn a_legacy_client_gets_only_the_questions_the_policy_lets_through() {
    let py = PyLegacyServer::start(&[]).await;
    let (gw, running, url) = start_gateway(config(&py.url(), "", "", ISSUE_POLICY)).await;

    // URL elicitations off the allow-list or unsafe: held back, declined for the server.
    for bad in [
        "javascript:alert(document.cookie)",
        "https://169.254.169.254/latest/meta-data/",
        "https://evil.example/login",
    ] {
        let args = json!({ "url": bad }).to_string();
        let report = legacy_client(&url, &["--tool", "open_url", "--args", &args]).await;
        assert_eq!(report["ok"], true, "{bad}: {report:#}");
        assert_eq!(
            report["callbacks"]["elicitation"], 0,
            "{bad} reached the legacy client: {:#}",
            report["asked"]
        );
        assert_eq!(result_text(&report), "url:decline", "{bad}");
    }
    // The same URL carried by a legacy -32042 error: the error the client gets names the
    // policy's reason, never the URL.
    let args = json!({"url": "https://169.254.169.254/latest/meta-data/"}).to_string();
    let report = legacy_client(&url, &["--tool", "url_required", "--args", &args]).await;
    let shown = report.to_string();
    assert!(
        !shown.contains("169.254"),
        "the URL reached the client: {report:#}"
    );
    assert_eq!(report["error"]["code"], -32603, "{report:#}");
    assert_eq!(
        report["error"]["data"]["policyReason"],
        "url_non_public_address"
    );
    assert_eq!(
        refusals(&gw, "elicitation_url", "url_non_public_address"),
        2.0
    );

    assert_eq!(refusals(&gw, "elicitation_url", "url_scheme"), 1.0);
    assert_eq!(
        refusals(&gw, "elicitation_url", "url_host_not_allowed"),
        1.0
    );

    // An allowed URL passes, in the form that was judged.
    let args = json!({"url": "https://AUTH.example.com/authorize?state=abc"}).to_string();
    let report = legacy_client(&url, &["--tool", "open_url", "--args", &args]).await;
    assert_eq!(report["callbacks"]["elicitation"], 1, "{report:#}");
    assert_eq!(
        report["asked"][0]["params"]["url"],
        "https://auth.example.com/authorize?state=abc"
    );

    // Sampling passes with maxTokens lowered to the cap (asked: 100000).
    let report = legacy_client(&url, &["--tool", "sample_big"]).await;
    assert_eq!(report["callbacks"]["sampling"], 1, "{report:#}");
    assert_eq!(report["asked"][0]["params"]["maxTokens"], 1024);
    assert!(result_text(&report).starts_with("sampled: "), "{report:#}");

    // `where` may only elicit: FastMCP asks roots/list on the GET stream, where the asking
    // call is unknown, so only kinds every rule allows pass; the server hears error -1 and
    // goes on to its elicitation, which the client does see.
    let report = legacy_client(&url, &["--tool", "where"]).await;
    assert_eq!(report["ok"], true, "{report:#}");
    assert_eq!(report["callbacks"]["roots"], 0, "roots reached the client");
    assert_eq!(report["callbacks"]["elicitation"], 1, "{report:#}");
    let text = result_text(&report);
    assert!(
        text.contains("roots error -1: refused by the gateway's policy"),
        "{text}"
    );
    assert!(refusals(&gw, "roots", "kind_not_allowed") >= 1.0);

    running.stop().await;
    py.kill().await;
}

/// A FastMCP server in JSON-response mode ends a call with -32042 in a plain JSON body: its
/// URLs pass the stage too.
#[tokio::test]
async fn a_legacy_client_gets_no_refused_url_in_a_plain_json_error() {
    let py = PyLegacyServer::start(&["--json-response"]).await;
    let (gw, running, url) = start_gateway(config(&py.url(), "", "", ISSUE_POLICY)).await;
    let args = json!({"url": "https://169.254.169.254/latest/meta-data/"}).to_string();
    let report = legacy_client(&url, &["--tool", "url_required", "--args", &args]).await;
    assert!(
        !report.to_string().contains("169.254"),
        "the URL reached the client: {report:#}"
    );
    assert_eq!(report["error"]["code"], -32603, "{report:#}");
    assert_eq!(
        report["error"]["data"]["policyReason"],
        "url_non_public_address"
    );
    // A plain result passes untouched.
    let report = legacy_client(&url, &["--tool", "add", "--args", r#"{"a":2,"b":3}"#]).await;
    assert_eq!(report["ok"], true, "{report:#}");
    assert_eq!(result_text(&report), "5");
    assert_eq!(
        refusals(&gw, "elicitation_url", "url_non_public_address"),
        1.0
    );
    running.stop().await;
    py.kill().await;
}

/// `[legacy_clients] enabled = false`: a legacy `initialize` is answered as a 2026-07-28-only
/// server answers it (400, -32022, the supported versions), and nothing reaches the legacy
/// server.
#[tokio::test]
async fn legacy_clients_can_be_turned_off() {
    let py = PyLegacyServer::start(&[]).await;
    let (gw, running, url) = start_gateway(config(
        &py.url(),
        "",
        "",
        "[legacy_clients]\nenabled = false\n",
    ))
    .await;
    let report = legacy_client(&url, &["--tool", "greet"]).await;
    assert_eq!(report["ok"], false, "{report:#}");
    assert_eq!(report["callbacks"]["elicitation"], 0);
    let raw = ModernClient::new(&url)
        .send_raw(
            http::Method::POST,
            http::HeaderMap::new(),
            bytes::Bytes::from(
                json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                    "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                               "clientInfo": {"name": "raw-legacy", "version": "1"}}})
                .to_string(),
            ),
        )
        .await
        .unwrap();
    assert_eq!(raw.status, 400, "{:?}", raw.message);
    let err = raw.error().expect("a JSON-RPC error");
    assert_eq!(err["code"], -32022);
    assert!(err["data"]["supported"].is_array(), "{err}");
    assert_eq!(
        metric(
            &gw,
            "mrtr_gateway_legacy_passthrough_total",
            &[("kind", "initialize")]
        ),
        0.0
    );
    assert_eq!(py.starts("greet"), 0);
    running.stop().await;
    py.kill().await;
}
