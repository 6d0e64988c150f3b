//! The dual-era front: a legacy client on the modern endpoint is passed through to the legacy
//! server as a legacy session, server requests and all, under a session id the gateway sealed;
//! any replica can serve any of its requests. Forged, tampered and foreign session ids get 404.

use std::time::Duration;

use crate::support::peers::{PyLegacyServer, legacy_client, result_text};
use crate::support::procs::{remote_metric, spawn_gateway};
use crate::support::round_robin::RoundRobin;
use crate::support::*;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method};
use mrtr_testkit::client::{Exchange, ModernClient};
use mrtr_testkit::legacy_server::Handlers;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(10);
const ROOTS: &str = "file:///tmp/project-a,file:///tmp/project-b";

fn initialize() -> Bytes {
    Bytes::from(
        serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "raw-legacy", "version": "1"}}}))
        .unwrap(),
    )
}

fn rpc(id: i64, method: &str) -> Bytes {
    Bytes::from(
        serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": {}}))
            .unwrap(),
    )
}

/// A POST as a 2025-11-25 client sends it on its session.
async fn on_session(c: &ModernClient, session: &str, body: Bytes) -> Exchange {
    c.send_raw(
        Method::POST,
        headers(&[
            ("mcp-session-id", session),
            ("mcp-protocol-version", "2025-11-25"),
        ]),
        body,
    )
    .await
    .unwrap()
}

fn assert_unknown_session(ex: &Exchange) {
    assert_eq!(
        ex.status.as_u16(),
        404,
        "{}",
        String::from_utf8_lossy(&ex.raw_body)
    );
    assert_eq!(ex.error_code(), Some(-32600));
    assert!(ex.headers.get("mcp-session-id").is_none());
}

/// Flips one character of the token's sealed part.
fn tampered(token: &str) -> String {
    let mut b = token.to_string().into_bytes();
    let i = b.len() - 5;
    b[i] = if b[i] == b'A' { b'B' } else { b'A' };
    String::from_utf8(b).unwrap()
}

#[tokio::test]
async fn sealed_session_ids_carry_a_raw_legacy_session_and_forgeries_get_404() {
    let env = env(
        Handlers::new().tool("t", "", json!({"type": "object"}), |_, _| async move {
            Ok(tool_text("ok"))
        }),
    )
    .await;
    let c = env.client();
    let init = c
        .send_raw(Method::POST, HeaderMap::new(), initialize())
        .await
        .unwrap();
    assert_eq!(init.status.as_u16(), 200, "{:?}", init.message);
    assert_eq!(init.result().unwrap()["protocolVersion"], "2025-11-25");
    let sealed = init.headers["mcp-session-id"].to_str().unwrap().to_string();
    let upstream = env.legacy.session_ids();
    assert_eq!(upstream.len(), 1);
    assert!(sealed.starts_with("m1.k1."), "{sealed}");
    assert!(
        !sealed.contains(&upstream[0]),
        "the upstream id never shows"
    );

    // The session works: notifications, requests, the GET stream, through the sealed id.
    let n = on_session(
        &c,
        &sealed,
        Bytes::from_static(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
    )
    .await;
    assert_eq!(n.status.as_u16(), 202);
    assert!(
        env.legacy
            .session(&upstream[0])
            .is_some_and(|s| s.initialized)
    );
    let list = on_session(&c, &sealed, rpc(1, "tools/list")).await;
    assert_eq!(list.status.as_u16(), 200);
    assert_eq!(list.result().unwrap()["tools"][0]["name"], "t");
    assert!(
        list.result().unwrap().get("resultType").is_none(),
        "legacy results pass unchanged"
    );
    if let Some(echoed) = list.headers.get("mcp-session-id") {
        assert_eq!(
            echoed.to_str().unwrap(),
            sealed,
            "swapped back to the sealed id"
        );
    }
    let get = c
        .open_raw_stream(
            Method::GET,
            headers(&[
                ("mcp-session-id", &sealed),
                ("mcp-protocol-version", "2025-11-25"),
                ("accept", "text/event-stream"),
            ]),
            Bytes::new(),
        )
        .await
        .unwrap();
    assert_eq!(get.status.as_u16(), 200);
    assert!(get.streamed);
    assert!(
        env.legacy
            .stats()
            .wait_until(|s| s.get_streams_open() == 1, WAIT)
            .await
    );
    drop(get);

    // Forgeries: a flipped byte, the raw upstream id, a requestState, nothing sealed at all.
    let state = env
        .gw
        .codec
        .seal(&env.gw.codec.fresh_payload("anonymous", "o", 1))
        .unwrap()
        .0;
    let calls_before = env.legacy.stats().count_method("tools/list");
    for forged in [tampered(&sealed), upstream[0].clone(), state, "nope".into()] {
        let ex = on_session(&c, &forged, rpc(2, "tools/list")).await;
        assert_unknown_session(&ex);
        // GET and DELETE with an id that does not open are plain 405, as before.
        for m in [Method::GET, Method::DELETE] {
            let ex = c
                .send_raw(m, headers(&[("mcp-session-id", &forged)]), Bytes::new())
                .await
                .unwrap();
            assert_eq!(ex.status.as_u16(), 405);
        }
    }
    assert_eq!(
        env.legacy.stats().count_method("tools/list"),
        calls_before,
        "nothing forged reached the legacy server"
    );
    assert_metric!(
        &env.gw,
        "rejections_total",
        &[("reason", "legacy_session_unknown")],
        4.0
    );

    // A modern request that happens to carry the id is still modern.
    let mut modern = env.client();
    modern
        .headers
        .insert("mcp-session-id", HeaderValue::from_str(&sealed).unwrap());
    let ex = modern.request("tools/list", json!({})).await.unwrap();
    assert_eq!(ex.result_type(), Some("complete"));

    // DELETE ends the legacy session; the server's 404 afterwards comes through as is.
    let del = c
        .send_raw(
            Method::DELETE,
            headers(&[("mcp-session-id", &sealed)]),
            Bytes::new(),
        )
        .await
        .unwrap();
    assert_eq!(del.status.as_u16(), 200);
    assert!(
        env.legacy.session(&upstream[0]).is_none(),
        "the legacy server ended the session"
    );
    let gone = on_session(&c, &sealed, rpc(3, "tools/list")).await;
    assert_eq!(gone.status.as_u16(), 404);
    for kind in ["initialize", "post", "get", "delete"] {
        assert!(
            metric(
                &env.gw,
                "mrtr_gateway_legacy_passthrough_total",
                &[("kind", kind)]
            ) >= 1.0,
            "{kind}"
        );
    }
    env.stop().await;
}

#[tokio::test]
async fn a_session_id_works_only_for_the_principal_it_was_issued_to() {
    let env = env_with(
        Default::default(),
        Handlers::new(),
        "",
        "[auth]\nmode = \"header\"\n",
    )
    .await;
    let c = env.client();
    let as_user = |user: &str| ("x-authenticated-user", user.to_string());
    let (k, alice) = as_user("alice");
    let init = c
        .send_raw(Method::POST, headers(&[(k, &alice)]), initialize())
        .await
        .unwrap();
    assert_eq!(init.status.as_u16(), 200);
    let sealed = init.headers["mcp-session-id"].to_str().unwrap().to_string();
    let post = |user: Option<&str>| {
        let mut h = headers(&[
            ("mcp-session-id", &sealed),
            ("mcp-protocol-version", "2025-11-25"),
        ]);
        if let Some(u) = user {
            h.insert("x-authenticated-user", HeaderValue::from_str(u).unwrap());
        }
        c.send_raw(Method::POST, h, rpc(1, "ping"))
    };
    assert_unknown_session(&post(Some("bob")).await.unwrap());
    assert_eq!(post(None).await.unwrap().status.as_u16(), 401);
    let ok = post(Some("alice")).await.unwrap();
    assert_eq!(ok.status.as_u16(), 200, "{:?}", ok.message);
    assert_metric!(
        &env.gw,
        "rejections_total",
        &[("reason", "legacy_session_wrong_principal")],
        1.0
    );
    env.stop().await;
}

#[tokio::test]
async fn initialize_needs_a_streamable_http_upstream() {
    let cfg = config_with_upstream(
        "transport = \"sse\"\nurl = \"http://127.0.0.1:9/sse\"\n",
        "",
        "",
    );
    let (_gw, running, url) = start_gateway(cfg).await;
    let ex = ModernClient::new(&url)
        .send_raw(Method::POST, HeaderMap::new(), initialize())
        .await
        .unwrap();
    assert_eq!(ex.status.as_u16(), 400);
    assert_eq!(ex.error_code(), Some(-32022));
    assert_eq!(ex.message.as_ref().unwrap()["id"], 0);
    assert_eq!(
        ex.error().unwrap()["data"],
        json!({"supported": ["2026-07-28"], "requested": "2025-11-25"})
    );
    assert!(
        ex.error().unwrap()["message"]
            .as_str()
            .unwrap()
            .contains("Streamable HTTP")
    );
    running.stop().await;
}

/// The official legacy client, through one gateway, to FastMCP: each server request reaches
/// the client's callback and every tool completes.
#[tokio::test]
async fn the_python_legacy_client_gets_its_server_requests_through_the_gateway() {
    let py = PyLegacyServer::start(&[]).await;
    let (gw, running, url) = start_gateway(config(&py.url(), "", "", "")).await;
    let cases = [
        ("greet", "Hello, Ada!", [1, 0, 0]),
        ("sample_only", "Paris", [0, 1, 0]),
        ("list_my_roots", ROOTS, [0, 0, 1]),
        ("parallel_three", &format!("Ada|7|{ROOTS}"), [1, 1, 1]),
    ];
    for (tool, want, [elicitation, sampling, roots]) in cases {
        let report = legacy_client(&url, &["--tool", tool]).await;
        assert_eq!(report["ok"], true, "{tool}: {report:#}");
        assert_eq!(result_text(&report), want, "{tool}");
        assert_eq!(
            report["callbacks"],
            json!({"elicitation": elicitation, "sampling": sampling, "roots": roots}),
            "{tool}"
        );
        assert_eq!(report["protocolVersion"], "2025-11-25");
    }
    assert_metric!(
        &gw,
        "legacy_passthrough_total",
        &[("kind", "initialize")],
        4.0
    );
    assert_eq!(
        metric(&gw, "mrtr_gateway_legacy_sessions_opened_total", &[]),
        0.0,
        "passed through, not bridged: the gateway opened no session of its own"
    );
    running.stop().await;
    py.kill().await;
}

/// Two gateway processes behind a proxy that alternates per HTTP request: one legacy session's
/// requests are served by both, with no affinity and no shared store.
#[tokio::test]
async fn one_legacy_session_is_served_by_two_replicas_alternately() {
    let py = PyLegacyServer::start(&[]).await;
    let dir = peers_tempdir();
    let cfg = format!(
        "[upstream]\nurl = \"{}\"\n[log]\nformat = \"text\"\n[[state.keys]]\nid = \"k1\"\nsecret = \"{TEST_KEY}\"\n",
        py.url()
    );
    let (_a, url_a, admin_a) = spawn_gateway(&cfg, dir.path(), "era-a").await;
    let (_b, url_b, admin_b) = spawn_gateway(&cfg, dir.path(), "era-b").await;
    let authority = |u: &str| {
        u.trim_start_matches("http://")
            .trim_end_matches("/mcp")
            .to_string()
    };
    let proxy = RoundRobin::start(vec![authority(&url_a), authority(&url_b)]).await;

    let report = legacy_client(&proxy.url("/mcp"), &["--tool", "parallel_three"]).await;
    assert_eq!(report["ok"], true, "{report:#}");
    assert_eq!(result_text(&report), format!("Ada|7|{ROOTS}"));
    assert_eq!(
        report["callbacks"],
        json!({"elicitation": 1, "sampling": 1, "roots": 1})
    );

    let hits = proxy.hits();
    let session = hits
        .iter()
        .find_map(|h| h.session.clone())
        .expect("requests on a session");
    assert!(session.starts_with("m1.k1."));
    let on_session: Vec<_> = hits
        .iter()
        .filter(|h| h.session.as_deref() == Some(session.as_str()))
        .collect();
    for replica in [0, 1] {
        assert!(
            on_session.iter().any(|h| h.backend == replica),
            "replica {replica} served none of the session's requests: {hits:?}"
        );
    }
    // Both replicas forwarded session requests (their own count, not the proxy's).
    for admin in [admin_a, admin_b] {
        assert!(
            remote_metric(
                admin,
                "mrtr_gateway_legacy_passthrough_total",
                &[("kind", "post")]
            )
            .await
                >= 1.0
        );
    }
    py.kill().await;
}

fn peers_tempdir() -> crate::support::peers::tempdir::TempDir {
    crate::support::peers::tempdir::TempDir::new("mrtr-dual-era")
}
