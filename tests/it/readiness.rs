//! `/readyz` means the legacy server speaks MCP: an `initialize` that succeeds (with the
//! configured credentials), a stdio command that starts. Against the Python FastMCP peer, and
//! nginx where a server must demand a token.

use crate::support::nginx::{Nginx, NginxTls};
use crate::support::peers::tempdir::TempDir;
use crate::support::peers::{PyLegacyServer, python_stdio_command};
use crate::support::tls::Ca;
use crate::support::*;
use serde_json::Value;

/// `/readyz` through the admin listener: status, and the `upstream` check.
async fn readyz(admin: &str) -> (u16, Value) {
    let (status, body) = crate::support::admin::get(&format!("{admin}/readyz")).await;
    (status, body["checks"]["upstream"].clone())
}

#[tokio::test]
async fn a_wrong_upstream_path_is_not_ready() {
    let legacy = PyLegacyServer::start(&[]).await;
    // The server is there, but not at this path: HTTP 404 on initialize.
    let wrong = format!("http://127.0.0.1:{}/not-mcp", legacy.port);
    let (gw, running, _) = start_gateway(config(&wrong, "", "", "")).await;
    let admin = crate::support::admin::start(gw.clone()).await;
    let (status, check) = readyz(&admin).await;
    assert_eq!(status, 503, "{check}");
    assert_eq!(check["ok"], false);
    let detail = check["detail"].as_str().unwrap();
    assert!(detail.contains("HTTP 404"), "{detail}");
    // Names the failing check, not the server's body or its address.
    assert!(!detail.contains("Not Found"), "{detail}");
    assert!(!detail.contains(&legacy.port.to_string()), "{detail}");
    running.stop().await;

    // The right path: ready, after a real initialize.
    let (gw, running, _) = start_gateway(config(&legacy.url(), "", "", "")).await;
    let admin = crate::support::admin::start(gw.clone()).await;
    let (status, check) = readyz(&admin).await;
    assert_eq!(status, 200, "{check}");
    assert!(
        check["detail"].as_str().unwrap().contains("speaks MCP"),
        "{check}"
    );
    // Probes within admin.upstream_check_cache reuse the result: one check was sent.
    for _ in 0..3 {
        assert_eq!(readyz(&admin).await.0, 200);
    }
    assert_metric!(&gw, "upstream_checks_total", &[("result", "ok")], 1.0);
    running.stop().await;
    legacy.kill().await;
}

#[tokio::test]
async fn a_stdio_command_must_start_for_readiness() {
    let dir = TempDir::new("mrtr-readiness-stdio");
    let missing = dir.path().join("no-such-mcp-server");
    let command = toml_strings(&[
        missing.to_string_lossy().as_ref(),
        "--api-key=API-KEY-readiness",
    ]);
    let cfg = config_with_upstream(
        &format!("transport = \"stdio\"\ncommand = {command}\nresponse_timeout = \"10s\"\n"),
        "",
        "",
    );
    let (gw, running, _) = start_gateway(cfg).await;
    let admin = crate::support::admin::start(gw.clone()).await;
    let (status, check) = readyz(&admin).await;
    assert_eq!(status, 503, "{check}");
    let detail = check["detail"].as_str().unwrap();
    assert!(detail.contains("could not be started"), "{detail}");
    assert!(!detail.contains("API-KEY-readiness"), "{detail}");
    assert!(!detail.contains("no-such-mcp-server"), "{detail}");
    running.stop().await;

    // The Python peer as a stdio server: the command starts and initializes.
    let command = python_stdio_command(&[]);
    let cfg = config_with_upstream(
        &format!("transport = \"stdio\"\ncommand = {command}\nresponse_timeout = \"60s\"\n"),
        "",
        // A slow interpreter start must not make the probe answer "not finished yet".
        "[admin]\nupstream_check_wait = \"60s\"\n",
    );
    let (gw, running, _) = start_gateway(cfg).await;
    let admin = crate::support::admin::start(gw.clone()).await;
    let (status, check) = readyz(&admin).await;
    assert_eq!(status, 200, "{check}");
    running.stop().await;
}

/// A legacy server behind nginx that answers 401 without `Authorization: Bearer <token>`.
#[tokio::test]
async fn readiness_presents_the_configured_credentials() {
    let ca = Ca::new("readiness CA");
    let server = ca.leaf("legacy", &["localhost"]);
    let dir = TempDir::new("mrtr-readiness-token");
    std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
    std::fs::write(dir.path().join("token"), "tok-readiness\n").unwrap();
    let legacy = PyLegacyServer::start(&[]).await;
    let nginx = Nginx::start(
        NginxTls {
            server: &server,
            client_ca_pem: None,
            require_bearer: Some("tok-readiness"),
        },
        legacy.port,
    )
    .await;
    let upstream = format!("https://localhost:{}/mcp", nginx.port);
    let ca_line = format!("ca_file = {:?}\n", dir.path().join("ca.pem"));
    let token_file = dir.path().join("token");
    let cases = [
        // (upstream_credentials, extra auth keys, ready, detail part)
        ("none", String::new(), false, "(HTTP 401)"),
        (
            "static",
            format!("upstream_token_file = {token_file:?}\n"),
            true,
            "speaks MCP",
        ),
        // No caller, no token to forward: the server is there and asks for one.
        ("forward", String::new(), true, "answers HTTP 401"),
    ];
    for (mode, extra, ready, part) in cases {
        let cfg = config(
            &upstream,
            &ca_line,
            "",
            &format!("[auth]\nupstream_credentials = \"{mode}\"\n{extra}"),
        );
        let (gw, running, _) = start_gateway(cfg).await;
        let admin = crate::support::admin::start(gw.clone()).await;
        let (status, check) = readyz(&admin).await;
        assert_eq!(status == 200, ready, "{mode}: {check}");
        let detail = check["detail"].as_str().unwrap();
        assert!(detail.contains(part), "{mode}: {detail}");
        assert!(!detail.contains("tok-readiness"), "{mode}: {detail}");
        running.stop().await;
    }
    nginx.stop().await;
    legacy.kill().await;
}

/// A slow first check does not hold the probe past `admin.upstream_check_wait`.
#[tokio::test]
async fn a_probe_does_not_wait_longer_than_upstream_check_wait() {
    // A listener that accepts and never answers: initialize hangs until response_timeout.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let cfg = config(
        &format!("http://127.0.0.1:{port}/mcp"),
        "",
        "",
        "[admin]\nupstream_check_wait = \"200ms\"\n",
    );
    let (gw, running, _) = start_gateway(cfg).await;
    let admin = crate::support::admin::start(gw.clone()).await;
    // The check itself would end at upstream.response_timeout (5 s) with "did not answer";
    // the probe answers first, saying the check is still running.
    let (status, check) = readyz(&admin).await;
    assert_eq!(status, 503, "{check}");
    assert!(
        check["detail"]
            .as_str()
            .unwrap()
            .contains("has not finished yet"),
        "{check}"
    );
    running.stop().await;
    hold.abort();
}
