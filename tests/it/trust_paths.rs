//! Issue 23, points 1 and 2: the policy stage holds on every path a legacy server's question
//! takes to a client, and a URL is judged as the client will read it.
//!
//! Real peers throughout: the Python FastMCP legacy server (`tests/peers/legacy_server.py`),
//! Python `httpx` as the program that opens the URL a client was shown, and the Python `mcp`
//! 1.x client as the 2025-era client of the dual-era front.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::peers::{PyLegacyServer, legacy_python};
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
