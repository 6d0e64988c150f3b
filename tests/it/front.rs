//! The 2026-07-28 HTTP surface: methods, bodies, headers, versions, `_meta`, routing.
//! Every refusal must carry a JSON-RPC body (with the id when it was readable) and the
//! status the spec gives.

use crate::support::*;
use bytes::Bytes;
use http::{HeaderMap, Method};
use mrtr_testkit::client::{Exchange, ModernClient};
use mrtr_testkit::legacy_server::Handlers;
use serde_json::{Value, json};

fn handlers() -> Handlers {
    Handlers::new().tool("t", "", json!({"type": "object"}), |_, _| async move {
        Ok(tool_text("ok"))
    })
}

fn body(method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": 42, "method": method, "params": params})
}

fn meta() -> Value {
    json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}})
}

async fn post(c: &ModernClient, headers: HeaderMap, body: &Value) -> Exchange {
    c.send_raw(
        Method::POST,
        headers,
        Bytes::from(serde_json::to_vec(body).unwrap()),
    )
    .await
    .unwrap()
}

fn assert_rpc_error(ex: &Exchange, status: u16, code: i64, id: Value) {
    assert_eq!(
        ex.status.as_u16(),
        status,
        "{:?}",
        String::from_utf8_lossy(&ex.raw_body)
    );
    let msg = ex.message.as_ref().expect("a JSON-RPC body");
    assert_eq!(msg["jsonrpc"], "2.0");
    assert_eq!(msg["id"], id);
    assert_eq!(msg["error"]["code"], code, "{msg}");
}

#[tokio::test]
async fn get_and_delete_are_not_allowed() {
    let env = env(handlers()).await;
    let c = env.client();
    for m in [Method::GET, Method::DELETE] {
        let ex = c
            .send_raw(m.clone(), HeaderMap::new(), Bytes::new())
            .await
            .unwrap();
        assert_rpc_error(&ex, 405, -32600, Value::Null);
        assert_eq!(ex.headers.get("allow").unwrap(), "POST", "{m}");
        assert!(ex.headers.get("mcp-session-id").is_none());
    }
    env.stop().await;
}

#[tokio::test]
async fn malformed_json_batches_and_bad_envelopes() {
    let env = env(handlers()).await;
    let c = env.client();
    let ex = c
        .send_raw(
            Method::POST,
            HeaderMap::new(),
            Bytes::from_static(b"{\"jsonrpc\":"),
        )
        .await
        .unwrap();
    assert_rpc_error(&ex, 400, -32700, Value::Null);
    let ex = c
        .send_raw(Method::POST, HeaderMap::new(), Bytes::from_static(b"[]"))
        .await
        .unwrap();
    assert_rpc_error(&ex, 400, -32600, Value::Null);
    let ex = post(
        &c,
        HeaderMap::new(),
        &json!({"jsonrpc": "2.0", "id": 5, "result": {}}),
    )
    .await;
    assert_rpc_error(&ex, 400, -32600, json!(5));
    // A notification is accepted and ignored.
    let ex = post(
        &c,
        HeaderMap::new(),
        &json!({"jsonrpc": "2.0", "method": "notifications/whatever"}),
    )
    .await;
    assert_eq!(ex.status.as_u16(), 202);
    assert!(ex.raw_body.is_empty());
    env.stop().await;
}

#[tokio::test]
async fn oversize_bodies_get_413_and_are_counted() {
    let env = env_with(Default::default(), handlers(), "", "").await;
    let c = env.client();
    let big = "x".repeat(env.gw.config().listen.max_body_bytes + 1);
    let ex = c
        .send_raw(Method::POST, HeaderMap::new(), Bytes::from(big))
        .await
        .unwrap();
    assert_rpc_error(&ex, 413, -32600, Value::Null);
    assert_metric!(
        &env.gw,
        "limit_hits_total",
        &[("limit", "max_body_bytes")],
        1.0
    );
    env.stop().await;
}

#[tokio::test]
async fn header_version_and_meta_checks_in_order() {
    let env = env(handlers()).await;
    let c = env.client();
    let mut call_meta = meta();
    let good = body(
        "tools/call",
        json!({"name": "t", "_meta": call_meta.clone()}),
    );
    let ok_headers = [
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("mcp-name", "t"),
    ];
    assert_eq!(
        post(&c, headers(&ok_headers), &good).await.result_type(),
        Some("complete")
    );

    // Missing or mismatched routing headers: 400 + -32020, with the request's id.
    let ex = post(&c, headers(&ok_headers[..2]), &good).await;
    assert_rpc_error(&ex, 400, -32020, json!(42));
    let ex = post(
        &c,
        headers(&[ok_headers[0], ("mcp-method", "tools/list"), ok_headers[2]]),
        &good,
    )
    .await;
    assert_rpc_error(&ex, 400, -32020, json!(42));
    let ex = post(
        &c,
        headers(&[ok_headers[0], ok_headers[1], ("mcp-name", "other")]),
        &good,
    )
    .await;
    assert_rpc_error(&ex, 400, -32020, json!(42));
    let ex = post(
        &c,
        headers(&[
            ("mcp-protocol-version", "2025-11-25"),
            ok_headers[1],
            ok_headers[2],
        ]),
        &good,
    )
    .await;
    assert_rpc_error(&ex, 400, -32020, json!(42));

    // Consistent but unsupported version: 400 + -32022 naming both.
    call_meta["io.modelcontextprotocol/protocolVersion"] = json!("1900-01-01");
    let old = body("tools/call", json!({"name": "t", "_meta": call_meta}));
    let ex = post(
        &c,
        headers(&[
            ("mcp-protocol-version", "1900-01-01"),
            ok_headers[1],
            ok_headers[2],
        ]),
        &old,
    )
    .await;
    assert_rpc_error(&ex, 400, -32022, json!(42));
    assert_eq!(
        ex.error().unwrap()["data"],
        json!({"supported": ["2026-07-28"], "requested": "1900-01-01"})
    );

    // Supported version, `_meta` missing its capabilities: 400 + -32602.
    let no_caps = body(
        "tools/call",
        json!({"name": "t", "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}),
    );
    let ex = post(&c, headers(&ok_headers), &no_caps).await;
    assert_rpc_error(&ex, 400, -32602, json!(42));
    let no_meta = body("tools/list", json!({}));
    let ex = post(
        &c,
        headers(&[ok_headers[0], ("mcp-method", "tools/list")]),
        &no_meta,
    )
    .await;
    assert_rpc_error(&ex, 400, -32602, json!(42));
    assert!(
        metric(
            &env.gw,
            "mrtr_gateway_rejections_total",
            &[("reason", "header_mismatch")]
        ) >= 4.0
    );
    env.stop().await;
}

#[tokio::test]
async fn removed_and_unknown_methods_are_not_found() {
    let env = env(handlers()).await;
    let c = env.client();
    for m in [
        "ping",
        "logging/setLevel",
        "resources/subscribe",
        "resources/unsubscribe",
        "no/such/method",
    ] {
        let ex = c.request(m, json!({})).await.unwrap();
        assert_rpc_error(&ex, 404, -32601, ex.message.as_ref().unwrap()["id"].clone());
        assert!(
            ex.message.as_ref().unwrap()["id"].is_i64(),
            "{m}: the id is echoed"
        );
    }
    env.stop().await;
}

#[tokio::test]
async fn every_result_is_typed_and_stamped() {
    let env = env(handlers()).await;
    let c = env.client();
    for (method, params) in [
        ("server/discover", json!({})),
        ("tools/list", json!({})),
        ("tools/call", json!({"name": "t", "arguments": {}})),
    ] {
        let ex = c.request(method, params).await.unwrap();
        let r = ex
            .result()
            .unwrap_or_else(|| panic!("{method}: {:?}", ex.message));
        assert_eq!(r["resultType"], "complete", "{method}");
        assert!(
            r["_meta"]["io.modelcontextprotocol/serverInfo"]["name"].is_string(),
            "{method}"
        );
        let cacheable = method != "tools/call";
        assert_eq!(r.get("ttlMs").is_some(), cacheable, "{method}");
        assert_eq!(r.get("cacheScope").is_some(), cacheable, "{method}");
        assert!(ex.headers.get("mcp-session-id").is_none());
    }
    env.stop().await;
}

#[tokio::test]
async fn an_unreachable_legacy_server_is_a_clear_upstream_error() {
    // A port that was bound and let go has nothing behind it.
    let port = free_port();
    let cfg = config(&format!("http://127.0.0.1:{port}/mcp"), "", "", "");
    let (gw, running, url) = start_gateway(cfg).await;
    let ex = ModernClient::new(&url)
        .request("tools/list", json!({}))
        .await
        .unwrap();
    assert_rpc_error(&ex, 502, -32603, ex.message.as_ref().unwrap()["id"].clone());
    assert!(
        ex.error().unwrap()["message"]
            .as_str()
            .unwrap()
            .contains("could not be reached")
    );
    // How it failed is in the WARN line with the request id the client got.
    crate::support::logs::assert_detail_logged_not_told(
        ex.error().unwrap(),
        "cannot reach the legacy server",
    );
    assert_metric!(
        &gw,
        "legacy_sessions_failed_total",
        &[("reason", "upstream_unreachable")],
        1.0
    );
    running.stop().await;
}

#[tokio::test]
async fn a_legacy_initialize_takes_the_legacy_path() {
    // A dual-era server chooses per request: a legacy `initialize` (no 2026-07-28 version in
    // its header or `_meta`) selects legacy semantics, so it is passed through to the legacy
    // server and answered with a session id the gateway sealed. (One sent as a 2026-07-28
    // request is "method not found": isolation.rs.)
    let env = env(handlers()).await;
    let c = env.client();
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                      "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                                 "clientInfo": {"name": "c", "version": "1"}}});
    let ex = post(
        &c,
        headers(&[("mcp-protocol-version", "2025-11-25")]),
        &body,
    )
    .await;
    assert_eq!(ex.status.as_u16(), 200, "{:?}", ex.message);
    assert_eq!(ex.result().unwrap()["protocolVersion"], "2025-11-25");
    let sealed = ex.headers.get("mcp-session-id").unwrap().to_str().unwrap();
    let upstream = env.legacy.session_ids();
    assert_eq!(upstream.len(), 1);
    assert!(sealed.starts_with("m1.") && sealed != upstream[0]);
    env.stop().await;
}

/// The conformance suite's `server-stateless` scenario sends `initialize` with the modern
/// headers and `_meta` and expects 404 with -32601 (the id echoed). Either marker alone makes
/// it a modern request. A legacy `initialize` is still passed through.
#[tokio::test]
async fn initialize_as_a_2026_request_is_method_not_found() {
    let env = env(handlers()).await;
    let c = env.client();
    let legacy_params = json!({"protocolVersion": "2025-11-25", "capabilities": {},
                               "clientInfo": {"name": "c", "version": "1"}});

    // Headers and _meta, as the conformance suite sends it.
    let ex = c.request("initialize", json!({})).await.unwrap();
    assert_eq!(ex.status.as_u16(), 404, "{:?}", ex.message);
    let msg = ex.message.as_ref().unwrap();
    assert_eq!(msg["error"]["code"], -32601);
    assert!(msg["id"].is_i64(), "the id is echoed: {msg}");
    assert_eq!(msg["error"]["data"]["supported"], json!(["2026-07-28"]));

    // Only the header (a legacy-shaped body).
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": "initialize", "params": legacy_params});
    let ex = post(&c, ModernClient::routing_headers(&body), &body).await;
    assert_eq!(ex.status.as_u16(), 404, "{:?}", ex.message);
    assert_eq!(ex.error_code(), Some(-32601));

    // Only _meta.
    let mut params = legacy_params.clone();
    params["_meta"] = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28"});
    let body = json!({"jsonrpc": "2.0", "id": 8, "method": "initialize", "params": params});
    let ex = post(&c, HeaderMap::new(), &body).await;
    assert_eq!(ex.status.as_u16(), 404, "{:?}", ex.message);
    assert_eq!(ex.error_code(), Some(-32601));
    assert!(
        env.legacy.session_ids().is_empty(),
        "nothing reached the legacy server"
    );

    // A legacy client's initialize (no 2026-07-28 anywhere) is passed through as before.
    let body = json!({"jsonrpc": "2.0", "id": 9, "method": "initialize", "params": legacy_params});
    let ex = post(&c, HeaderMap::new(), &body).await;
    assert_eq!(ex.status.as_u16(), 200, "{:?}", ex.message);
    assert_eq!(ex.result().unwrap()["protocolVersion"], "2025-11-25");
    assert_eq!(env.legacy.session_ids().len(), 1);
    env.stop().await;
}

#[tokio::test]
async fn a_request_refused_on_its_head_is_logged_under_its_own_request_id() {
    // Refusals decided from the request's head alone (method, Origin) are written when the
    // request is first polled, under its context: their access lines name their request.
    let (logs, _guard) = crate::support::logs::on_this_thread();
    let env = env(handlers()).await;
    let c = env.client();
    let ex = c
        .send_raw(Method::GET, HeaderMap::new(), Bytes::new())
        .await
        .unwrap();
    assert_rpc_error(&ex, 405, -32600, Value::Null);
    let mut h = HeaderMap::new();
    h.insert("origin", "https://elsewhere.example".parse().unwrap());
    let ex = post(&c, h, &body("tools/list", json!({"_meta": meta()}))).await;
    assert_eq!(ex.status.as_u16(), 403, "{:?}", ex.message);
    env.stop().await;

    let lines = logs.access_lines("status=");
    let refused: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("status=405") || l.contains("status=403"))
        .collect();
    assert_eq!(refused.len(), 2, "{lines:#?}");
    let ids: Vec<&str> = refused
        .iter()
        .map(|l| {
            l.split("request_id=")
                .nth(1)
                .and_then(|rest| rest.split([' ', '}']).next())
                .filter(|id| !id.is_empty())
                .unwrap_or_else(|| panic!("no request id: {l}"))
        })
        .collect();
    assert_ne!(ids[0], ids[1], "{refused:#?}");
}
