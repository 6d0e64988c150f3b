//! Operating the gateway: admin endpoints, metrics values, reload, drain, TLS, limits, the CLI.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use crate::support::admin::{get, start as start_admin};
use crate::support::*;
use mrtr_gateway::config::Config;
use mrtr_gateway::front::listener;
use mrtr_gateway::front::tls::TlsReloader;
use mrtr_gateway::gateway::Gateway;
use mrtr_gateway::reload::Reloader;
use mrtr_testkit::client::ModernClient;
use mrtr_testkit::legacy_server::{Handlers, LegacyServer, LegacyServerConfig};
use serde_json::{Value, json};

fn greet() -> Handlers {
    name_asking_tool(Handlers::new(), "", "Name?", |name| format!("Hello {name}")).tool(
        "slow",
        "",
        json!({"type": "object"}),
        |_, a| async move {
            let ms = a["ms"].as_u64().unwrap_or(500);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(tool_text("slept"))
        },
    )
}

#[tokio::test]
async fn health_and_readiness_mean_something() {
    let env = env(greet()).await;
    let admin = start_admin(env.gw.clone()).await;
    let (s, body) = get(&format!("{admin}/healthz")).await;
    assert_eq!((s, body["status"].as_str()), (200, Some("alive")));
    let (s, body) = get(&format!("{admin}/readyz")).await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["checks"]["upstream"]["ok"], true);
    env.gw.start_draining();
    let (s, body) = get(&format!("{admin}/readyz")).await;
    assert_eq!(s, 503);
    assert_eq!(body["checks"]["draining"]["ok"], false);
    let (s, text) = get(&format!("{admin}/metrics")).await;
    assert_eq!(s, 200);
    assert!(
        text.as_str()
            .unwrap()
            .contains("mrtr_gateway_draining{instance_id=")
    );
    env.stop().await;

    // A gateway whose legacy server is down is not ready.
    let port = free_port();
    let (gw, running, _) =
        start_gateway(config(&format!("http://127.0.0.1:{port}/mcp"), "", "", "")).await;
    let admin = start_admin(gw.clone()).await;
    let (s, body) = get(&format!("{admin}/readyz")).await;
    assert_eq!(s, 503);
    assert_eq!(body["checks"]["upstream"]["ok"], false);
    running.stop().await;
}

#[tokio::test]
async fn metrics_count_a_flow_and_a_tampered_state() {
    let env = env(greet()).await;
    let c = env.client();
    let (rounds, last) = greet_flow(&c, 4).await;
    assert_eq!((rounds.len(), last.result_type()), (1, Some("complete")));
    let state = rounds[0].exchange.result().unwrap()["requestState"]
        .as_str()
        .unwrap()
        .to_string();
    let mut tampered = state.clone().into_bytes();
    // A byte in the middle of the ciphertext (the last one could make non-canonical base64).
    let mid = tampered.len() / 2;
    tampered[mid] = if tampered[mid] == b'A' { b'B' } else { b'A' };
    let bad = c
        .request(
            "tools/call",
            json!({"name": "greet", "arguments": {}, "requestState": String::from_utf8(tampered).unwrap()}),
        )
        .await
        .unwrap();
    assert_eq!(bad.error_code(), Some(-32602));
    let m = |name: &str, labels: &[(&str, &str)]| metric(&env.gw, name, labels);
    assert_eq!(
        m(
            "mrtr_gateway_requests_total",
            &[("method", "tools/call"), ("outcome", "input_required")]
        ),
        1.0
    );
    assert_eq!(
        m(
            "mrtr_gateway_requests_total",
            &[("method", "tools/call"), ("outcome", "complete")]
        ),
        1.0
    );
    assert_eq!(
        m(
            "mrtr_gateway_requests_total",
            &[("method", "tools/call"), ("outcome", "error")]
        ),
        1.0
    );
    assert_eq!(
        m(
            "mrtr_gateway_input_required_total",
            &[("method", "tools/call")]
        ),
        1.0
    );
    assert_eq!(
        m("mrtr_gateway_state_seals_total", &[("key_id", "k1")]),
        1.0
    );
    assert_eq!(
        m("mrtr_gateway_state_opens_total", &[("result", "ok")]),
        1.0
    );
    assert_eq!(
        m(
            "mrtr_gateway_state_opens_total",
            &[("result", "state_auth_failed")]
        ),
        1.0
    );
    assert_eq!(
        m(
            "mrtr_gateway_rejections_total",
            &[("reason", "state_auth_failed"), ("fault", "client")]
        ),
        1.0
    );
    assert_eq!(m("mrtr_gateway_retries_total", &[("path", "parked")]), 1.0);
    assert_eq!(
        m("mrtr_gateway_retries_total", &[("path", "replayed")]),
        0.0
    );
    assert_eq!(m("mrtr_gateway_parked_calls", &[]), 0.0);
    assert_eq!(m("mrtr_gateway_state_bytes_count", &[]), 1.0);
    // One session served both rounds (parked, then resumed); nothing else opened one.
    assert_eq!(m("mrtr_gateway_legacy_sessions_opened_total", &[]), 1.0);
    env.stop().await;
}

fn write_key(dir: &Path, id: &str, byte: u8) {
    use base64::Engine;
    std::fs::write(
        dir.join(id),
        base64::engine::general_purpose::STANDARD.encode([byte; 32]),
    )
    .unwrap();
}

#[tokio::test]
async fn reload_rotates_keys_and_limits_while_requests_run_and_a_broken_reload_keeps_the_old() {
    let legacy = LegacyServer::start(LegacyServerConfig::default(), greet())
        .await
        .unwrap();
    let dir = TempDir::new("mrtr-ops");
    let keys = dir.path().join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    write_key(&keys, "k2026-01-01", 1);
    let cfg_path = dir.path().join("gateway.toml");
    let toml = |max_rounds: u32| {
        format!(
            "[listen]\naddr = \"127.0.0.1:0\"\n[upstream]\nurl = \"{}\"\n[state]\nmax_rounds = {max_rounds}\nkeys_dir = \"keys\"\n",
            legacy.url()
        )
    };
    std::fs::write(&cfg_path, toml(16)).unwrap();
    let (gw, running, url) = start_gateway(Config::load(&cfg_path).unwrap()).await;
    let reloader = Reloader {
        gw: gw.clone(),
        config_path: cfg_path.clone(),
        tls: None,
        log: None,
    };

    // Background traffic for the whole test: every request must succeed.
    let stop = tokio_util::sync::CancellationToken::new();
    let traffic = {
        let url = url.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let c = ModernClient::new(&url);
            let mut n = 0;
            while !stop.is_cancelled() {
                let (_, last) = greet_flow(&c, 4).await;
                assert_eq!(last.result_type(), Some("complete"), "{:?}", last.message);
                n += 1;
            }
            n
        })
    };

    let c = ModernClient::new(&url);
    let first = call_tool(&c, "greet").await;
    let old_state = first.result().unwrap()["requestState"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(old_state.starts_with("m1.k2026-01-01."));

    // A newer key file becomes the sealing key; states sealed under the old key still open.
    write_key(&keys, "k2026-02-01", 2);
    std::fs::write(&cfg_path, toml(8)).unwrap();
    reloader.reload_now().unwrap();
    assert_eq!(gw.config().state.max_rounds, 8);
    let next = call_tool(&c, "greet").await;
    assert!(
        next.result().unwrap()["requestState"]
            .as_str()
            .unwrap()
            .starts_with("m1.k2026-02-01.")
    );
    let answer_key = input_key(first.result().unwrap());
    let retry = |state: &str| {
        json!({"name": "greet", "arguments": {}, "requestState": state,
               "inputResponses": {answer_key.clone(): {"action": "accept", "content": {"name": "Ada"}}}})
    };
    let done = c.request("tools/call", retry(&old_state)).await.unwrap();
    assert_eq!(text(done.result().unwrap()), "Hello Ada");

    // A broken key file: the reload fails, the previous ring stays, the failure is counted.
    std::fs::write(keys.join("k2026-03-01"), "not base64!").unwrap();
    assert!(reloader.reload_now().is_err());
    assert_metric!(&gw, "config_reloads_total", &[("result", "error")], 1.0);
    assert_eq!(gw.codec.ring().sealing_key().id, "k2026-02-01");
    std::fs::remove_file(keys.join("k2026-03-01")).unwrap();

    // Removing the old key stops its states from opening.
    std::fs::remove_file(keys.join("k2026-01-01")).unwrap();
    reloader.reload_now().unwrap();
    let refused = c.request("tools/call", retry(&old_state)).await.unwrap();
    assert_eq!(refused.error_code(), Some(-32602));
    assert_metric!(
        &gw,
        "state_opens_total",
        &[("result", "state_unknown_key")],
        1.0
    );
    assert_metric!(&gw, "config_reloads_total", &[("result", "ok")], 2.0);

    stop.cancel();
    let served = traffic.await.expect("no background request failed");
    assert!(served > 0);
    running.stop().await;
    legacy.shutdown().await;
}

/// The question of `greet`'s first round: the state and its input key.
async fn greet_round_one(c: &ModernClient, tool: &str) -> (String, String) {
    let first = c
        .request("tools/call", json!({"name": tool, "arguments": {}}))
        .await
        .unwrap();
    let r = first.result().expect("round 1 asks");
    let key = input_key(r);
    (r["requestState"].as_str().unwrap().to_string(), key)
}

fn greet_retry(tool: &str, state: &str, key: &str) -> Value {
    json!({"name": tool, "arguments": {}, "requestState": state,
           "inputResponses": {key: {"action": "accept", "content": {"name": "Ada"}}}})
}

/// A reload that changes `[single_use]` never forgets a claim this replica made. A state
/// completed before the reload, presented again after it, gets the kept outcome and the tool
/// body does not run again: after a change of limits (the memory store is kept), with a retry
/// still running across that reload (it settles where it was claimed), and after a switch to
/// Redis (the memory store is still asked until its entries expire).
#[tokio::test]
async fn reloads_that_change_single_use_never_forget_a_claim() {
    let handlers = greet().tool(
        "greet_slowly",
        "",
        json!({"type": "object"}),
        |ctx, _| async move {
            let a = ctx.elicit_form("Name?", form("name")).await?;
            tokio::time::sleep(Duration::from_millis(400)).await;
            Ok(tool_text(format!(
                "Slowly, hello {}",
                a["content"]["name"].as_str().unwrap_or("?")
            )))
        },
    );
    let legacy = LegacyServer::start(LegacyServerConfig::default(), handlers)
        .await
        .unwrap();
    let redis = crate::support::procs::start_redis().await;
    let dir = TempDir::new("mrtr-ops");
    let cfg_path = dir.path().join("gateway.toml");
    let toml = |single_use: &str| {
        format!(
            "[listen]\naddr = \"127.0.0.1:0\"\n[upstream]\nurl = \"{}\"\n\
             [[state.keys]]\nid = \"k1\"\nsecret = \"{TEST_KEY}\"\n[single_use]\n{single_use}\n",
            legacy.url()
        )
    };
    std::fs::write(&cfg_path, toml("max_entries = 1000")).unwrap();
    let (gw, running, url) = start_gateway(Config::load(&cfg_path).unwrap()).await;
    let reloader = Reloader {
        gw: gw.clone(),
        config_path: cfg_path.clone(),
        tls: None,
        log: None,
    };
    let c = ModernClient::new(&url);
    let starts =
        || legacy.stats().tool_starts("greet") + legacy.stats().tool_starts("greet_slowly");

    // One state completed, one retry still running when the configuration changes.
    let (done_state, done_key) = greet_round_one(&c, "greet").await;
    let done = c
        .request("tools/call", greet_retry("greet", &done_state, &done_key))
        .await
        .unwrap();
    assert_eq!(text(done.result().unwrap()), "Hello Ada");
    let (slow_state, slow_key) = greet_round_one(&c, "greet_slowly").await;
    let slow = {
        let (url, retry) = (
            url.clone(),
            greet_retry("greet_slowly", &slow_state, &slow_key),
        );
        tokio::spawn(async move {
            ModernClient::new(&url)
                .request("tools/call", retry)
                .await
                .unwrap()
        })
    };
    assert!(
        eventually(Duration::from_secs(5), || gw.single_use().entries()
            == Some(2))
        .await
    );
    let executions = starts();

    // 1. Only limits change: the store and both claims are kept.
    std::fs::write(
        &cfg_path,
        toml("max_entries = 2000\nmax_outcome_bytes = 100000"),
    )
    .unwrap();
    reloader.reload_now().unwrap();
    assert_eq!(gw.config().single_use.max_entries, 2000);
    let again = c
        .request("tools/call", greet_retry("greet", &done_state, &done_key))
        .await
        .unwrap();
    assert_eq!(again.result(), done.result(), "{:?}", again.message);
    let running_one = c
        .request(
            "tools/call",
            greet_retry("greet_slowly", &slow_state, &slow_key),
        )
        .await
        .unwrap();
    assert_eq!(
        running_one.status.as_u16(),
        409,
        "{:?}",
        running_one.message
    );
    let slow = slow.await.unwrap();
    assert_eq!(text(slow.result().unwrap()), "Slowly, hello Ada");
    let slow_again = c
        .request(
            "tools/call",
            greet_retry("greet_slowly", &slow_state, &slow_key),
        )
        .await
        .unwrap();
    assert_eq!(
        slow_again.result(),
        slow.result(),
        "{:?}",
        slow_again.message
    );

    // 2. The store switches to Redis: what memory holds is still honoured on this replica.
    std::fs::write(
        &cfg_path,
        toml(&format!(
            "store = \"redis\"\n[single_use.redis]\nurls = [\"redis://127.0.0.1:{}/0\"]",
            redis.port
        )),
    )
    .unwrap();
    reloader.reload_now().unwrap();
    assert_eq!(gw.single_use().kind(), "redis");
    for (tool, state, key, first) in [
        ("greet", &done_state, &done_key, &done),
        ("greet_slowly", &slow_state, &slow_key, &slow),
    ] {
        let again = c
            .request("tools/call", greet_retry(tool, state, key))
            .await
            .unwrap();
        assert_eq!(
            again.result(),
            first.result(),
            "{tool}: {:?}",
            again.message
        );
    }
    assert_eq!(starts(), executions, "a tool body ran again after a reload");
    // New states are claimed in Redis.
    let (state, key) = greet_round_one(&c, "greet").await;
    let fresh = c
        .request("tools/call", greet_retry("greet", &state, &key))
        .await
        .unwrap();
    assert_eq!(text(fresh.result().unwrap()), "Hello Ada");
    let dup = c
        .request("tools/call", greet_retry("greet", &state, &key))
        .await
        .unwrap();
    assert_eq!(dup.result(), fresh.result());
    assert_metric!(&gw, "config_reloads_total", &[("result", "ok")], 2.0);
    running.stop().await;
    legacy.shutdown().await;
}

#[tokio::test]
async fn a_changed_key_directory_is_picked_up_by_the_watcher() {
    let legacy = LegacyServer::start(LegacyServerConfig::default(), greet())
        .await
        .unwrap();
    let dir = TempDir::new("mrtr-ops");
    let keys = dir.path().join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    write_key(&keys, "a1", 1);
    let cfg_path = dir.path().join("gateway.toml");
    std::fs::write(
        &cfg_path,
        format!(
            "[upstream]\nurl = \"{}\"\n[state]\nkeys_dir = \"keys\"\n",
            legacy.url()
        ),
    )
    .unwrap();
    let gw = Gateway::new(Config::load(&cfg_path).unwrap());
    let shutdown = tokio_util::sync::CancellationToken::new();
    tokio::spawn(
        Reloader {
            gw: gw.clone(),
            config_path: cfg_path,
            tls: None,
            log: None,
        }
        .run(shutdown.clone()),
    );
    tokio::time::sleep(Duration::from_millis(200)).await; // let the watch register
    write_key(&keys, "b2", 2);
    assert!(
        eventually(Duration::from_secs(5), || gw.codec.ring().sealing_key().id
            == "b2")
        .await,
        "the new key was not loaded"
    );
    assert_eq!(gw.codec.ring().ids(), vec!["b2", "a1"]);
    shutdown.cancel();
    legacy.shutdown().await;
}

#[tokio::test]
async fn load_is_shed_with_503_and_retry_after() {
    let legacy = LegacyServer::start(LegacyServerConfig::default(), greet())
        .await
        .unwrap();
    let cfg = config(&legacy.url(), "", "", "");
    let text = "[listen]\naddr = \"127.0.0.1:0\"\nmax_concurrent_requests = 1\n";
    let mut limited = Config::from_toml_str(
        &format!("{text}[upstream]\nurl = \"{}\"\n[[state.keys]]\nid = \"k1\"\nsecret = \"{TEST_KEY}\"\n", legacy.url()),
        &[],
        None,
    )
    .unwrap();
    limited.upstream = cfg.upstream;
    let (gw, running, url) = start_gateway(limited).await;
    let slow = tokio::spawn({
        let url = url.clone();
        async move {
            ModernClient::new(&url)
                .request(
                    "tools/call",
                    json!({"name": "slow", "arguments": {"ms": 800}}),
                )
                .await
        }
    });
    assert!(
        metric_reaches(
            &gw,
            "mrtr_gateway_active_requests",
            &[],
            1.0,
            Duration::from_secs(3)
        )
        .await
    );
    let shed = ModernClient::new(&url)
        .request("tools/list", json!({}))
        .await
        .unwrap();
    assert_eq!(shed.status.as_u16(), 503);
    assert_eq!(shed.headers.get("retry-after").unwrap(), "1");
    assert_eq!(shed.error_code(), Some(-32603));
    assert_metric!(
        &gw,
        "limit_hits_total",
        &[("limit", "max_concurrent_requests")],
        1.0
    );
    assert_eq!(text_of(&slow.await.unwrap().unwrap()), "slept");
    // The slot came back.
    let after = ModernClient::new(&url)
        .request("tools/list", json!({}))
        .await
        .unwrap();
    assert_eq!(after.status.as_u16(), 200);
    running.stop().await;
    legacy.shutdown().await;
}

fn text_of(ex: &mrtr_testkit::client::Exchange) -> String {
    text(ex.result().unwrap())
}

#[tokio::test]
async fn origins_are_checked() {
    let env = env(greet()).await;
    let c = env.client();
    let body = json!({"jsonrpc":"2.0","id":1,"method":"tools/list","params": c.params_with_meta(json!({}))});
    let send = |origin: &'static str| {
        let mut h = ModernClient::routing_headers(&body);
        h.insert("origin", origin.parse().unwrap());
        c.send_raw(
            http::Method::POST,
            h,
            serde_json::to_vec(&body).unwrap().into(),
        )
    };
    let evil = send("https://evil.example").await.unwrap();
    assert_eq!(evil.status.as_u16(), 403);
    assert_eq!(evil.error_code(), Some(-32600));
    let local = send("http://localhost:3000").await.unwrap();
    assert_eq!(local.status.as_u16(), 200);
    env.stop().await;
}

#[tokio::test]
async fn idle_keep_alive_connections_are_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let legacy = LegacyServer::start(LegacyServerConfig::default(), greet())
        .await
        .unwrap();
    let text = format!(
        "[listen]\naddr = \"127.0.0.1:0\"\nidle_timeout = \"700ms\"\n[upstream]\nurl = \"{}\"\n[[state.keys]]\nid = \"k1\"\nsecret = \"{TEST_KEY}\"\n",
        legacy.url()
    );
    let (gw, running, _) = start_gateway(Config::from_toml_str(&text, &[], None).unwrap()).await;
    let mut s = tokio::net::TcpStream::connect(running.addr).await.unwrap();
    s.write_all(b"GET /mcp HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = s.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 405"));
    // Nothing more is sent: the server closes the idle connection (EOF) within a few seconds.
    let eof = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return true,
                Ok(_) => continue,
            }
        }
    })
    .await;
    assert_eq!(eof, Ok(true));
    assert_metric!(&gw, "limit_hits_total", &[("limit", "idle_timeout")], 1.0);
    running.stop().await;
    legacy.shutdown().await;
}

#[tokio::test]
async fn tls_front_reloads_certificates_and_mtls_requires_a_client_certificate() {
    let legacy = LegacyServer::start(LegacyServerConfig::default(), greet())
        .await
        .unwrap();
    let dir = TempDir::new("mrtr-ops");
    let ca = crate::support::tls::Ca::new("test CA");
    let first = ca.leaf("gateway-1", &["localhost"]);
    let client_ca = crate::support::tls::Ca::new("client CA");
    std::fs::write(dir.path().join("tls.crt"), &first.cert_pem).unwrap();
    std::fs::write(dir.path().join("tls.key"), &first.key_pem).unwrap();
    std::fs::write(dir.path().join("ca.crt"), client_ca.pem()).unwrap();
    let text = format!(
        "[listen]\naddr = \"127.0.0.1:0\"\n[upstream]\nurl = \"{}\"\n[tls]\ncert_file = \"tls.crt\"\nkey_file = \"tls.key\"\nclient_ca_file = \"ca.crt\"\nclient_auth = \"required\"\n[[state.keys]]\nid = \"k1\"\nsecret = \"{TEST_KEY}\"\n",
        legacy.url()
    );
    let cfg = Config::from_toml_str(&text, &[], Some(dir.path())).unwrap();
    let tls = Arc::new(TlsReloader::load(cfg.tls.as_ref().unwrap()).unwrap());
    let gw = Gateway::new(cfg);
    let running = listener::start_with_tls(
        gw.front.clone(),
        "127.0.0.1:0".parse().unwrap(),
        Some(tls.clone()),
    )
    .await
    .unwrap();
    let client_cert = client_ca.leaf("alice", &["alice.example"]);
    let body = json!({"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{
        "io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}});
    let headers = [
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/list"),
    ];
    let bytes = serde_json::to_vec(&body).unwrap();

    let (status, resp, served) = crate::support::tls::post(
        running.addr,
        &ca.pem(),
        Some(&client_cert),
        "/mcp",
        &headers,
        &bytes,
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&resp));
    assert_eq!(served, first.der);

    // Without a client certificate the handshake (or the first read) fails.
    let refused =
        crate::support::tls::post(running.addr, &ca.pem(), None, "/mcp", &headers, &bytes).await;
    assert!(refused.is_err(), "{refused:?}");

    // Swap the certificate on disk and reload: new connections get the new one, nothing else changes.
    let second = ca.leaf("gateway-2", &["localhost"]);
    std::fs::write(dir.path().join("tls.crt"), &second.cert_pem).unwrap();
    std::fs::write(dir.path().join("tls.key"), &second.key_pem).unwrap();
    tls.reload().unwrap();
    let (status, _, served) = crate::support::tls::post(
        running.addr,
        &ca.pem(),
        Some(&client_cert),
        "/mcp",
        &headers,
        &bytes,
    )
    .await
    .unwrap();
    assert_eq!(status, 200);
    assert_eq!(served, second.der);
    // A broken key file is refused and the current certificate stays.
    std::fs::write(dir.path().join("tls.key"), "garbage").unwrap();
    assert!(tls.reload().is_err());
    let (status, _, served) = crate::support::tls::post(
        running.addr,
        &ca.pem(),
        Some(&client_cert),
        "/mcp",
        &headers,
        &bytes,
    )
    .await
    .unwrap();
    assert_eq!((status, served), (200, second.der.clone()));
    running.stop().await;
    legacy.shutdown().await;
}

/// mTLS identities through the TLS listener: a client certificate whose single CN imitates a
/// whole subject (`alice, O=Example`) is another principal than `CN=alice, O=Example`, so a
/// `requestState` issued to one is refused for the other; under `subject_cn` a certificate
/// with two CNs is refused.
#[tokio::test]
async fn mtls_identities_through_the_tls_listener_cannot_collide() {
    use rcgen::DnType;
    let legacy = LegacyServer::start(LegacyServerConfig::default(), greet())
        .await
        .unwrap();
    let dir = TempDir::new("mrtr-ops");
    let ca = crate::support::tls::Ca::new("test CA");
    let server = ca.leaf("gateway", &["localhost"]);
    let client_ca = crate::support::tls::Ca::new("client CA");
    std::fs::write(dir.path().join("tls.crt"), &server.cert_pem).unwrap();
    std::fs::write(dir.path().join("tls.key"), &server.key_pem).unwrap();
    std::fs::write(dir.path().join("ca.crt"), client_ca.pem()).unwrap();
    let start = |identity: &str| {
        let text = format!(
            "[listen]\naddr = \"127.0.0.1:0\"\n[upstream]\nurl = \"{}\"\n[tls]\ncert_file = \"tls.crt\"\nkey_file = \"tls.key\"\nclient_ca_file = \"ca.crt\"\nclient_auth = \"required\"\n[auth]\nmode = \"mtls\"\n[auth.mtls]\nidentity = \"{identity}\"\n[[state.keys]]\nid = \"k1\"\nsecret = \"{TEST_KEY}\"\n",
            legacy.url()
        );
        Config::from_toml_str(&text, &[], Some(dir.path())).unwrap()
    };
    let call = |state: Option<&str>| {
        let mut params = json!({"name": "greet", "arguments": {}, "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}}}});
        if let Some(state) = state {
            params["requestState"] = json!(state);
        }
        serde_json::to_vec(
            &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}),
        )
        .unwrap()
    };
    let headers = [
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("mcp-name", "greet"),
    ];

    // identity = "subject"
    let cfg = start("subject");
    let tls = Arc::new(TlsReloader::load(cfg.tls.as_ref().unwrap()).unwrap());
    let gw = Gateway::new(cfg);
    let running =
        listener::start_with_tls(gw.front.clone(), "127.0.0.1:0".parse().unwrap(), Some(tls))
            .await
            .unwrap();
    let real = client_ca.leaf_with_subject(
        &[
            (DnType::CommonName, "alice"),
            (DnType::OrganizationName, "Example"),
        ],
        &[],
    );
    let forged = client_ca.leaf_with_subject(&[(DnType::CommonName, "alice, O=Example")], &[]);
    let post = |addr: std::net::SocketAddr, leaf: &crate::support::tls::Leaf, body: Vec<u8>| {
        let ca_pem = ca.pem();
        let leaf = crate::support::tls::Leaf {
            cert_pem: leaf.cert_pem.clone(),
            key_pem: leaf.key_pem.clone(),
            der: leaf.der.clone(),
        };
        async move {
            let (status, body, _) =
                crate::support::tls::post(addr, &ca_pem, Some(&leaf), "/mcp", &headers, &body)
                    .await
                    .unwrap();
            (status, serde_json::from_slice::<Value>(&body).unwrap())
        }
    };
    let (status, first) = post(running.addr, &real, call(None)).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["result"]["resultType"], "input_required", "{first}");
    let state = first["result"]["requestState"]
        .as_str()
        .unwrap()
        .to_string();
    // The forged certificate presents the real subject's state: another principal, refused.
    let (status, stolen) = post(running.addr, &forged, call(Some(&state))).await;
    assert_eq!(status, 400, "{stolen}");
    assert_eq!(stolen["error"]["code"], -32602, "{stolen}");
    running.stop().await;

    // identity = "subject_cn": two CNs are refused, one is accepted.
    let cfg = start("subject_cn");
    let tls = Arc::new(TlsReloader::load(cfg.tls.as_ref().unwrap()).unwrap());
    let gw = Gateway::new(cfg);
    let running =
        listener::start_with_tls(gw.front.clone(), "127.0.0.1:0".parse().unwrap(), Some(tls))
            .await
            .unwrap();
    let two_cns = client_ca.leaf_with_subject(
        &[
            (DnType::CommonName, "alice"),
            (DnType::CustomDnType(vec![2, 5, 4, 3]), "admin"),
        ],
        &[],
    );
    let (status, refused) = post(running.addr, &two_cns, call(None)).await;
    assert_eq!(status, 401, "{refused}");
    assert_metric!(
        &gw,
        "rejections_total",
        &[("reason", "auth_ambiguous_identity"), ("fault", "client")],
        1.0
    );
    let (status, ok) = post(running.addr, &real, call(None)).await;
    assert_eq!(status, 200, "{ok}");
    running.stop().await;
    legacy.shutdown().await;
}

#[tokio::test]
async fn sigterm_drains_in_flight_calls_refuses_new_ones_and_exits_zero() {
    let legacy = LegacyServer::start(LegacyServerConfig::default(), greet())
        .await
        .unwrap();
    let dir = TempDir::new("mrtr-ops");
    let (port, admin) = (free_port(), free_port());
    let cfg = dir.path().join("gateway.toml");
    std::fs::write(
        &cfg,
        format!(
            "[listen]\naddr = \"127.0.0.1:{port}\"\n[admin]\naddr = \"127.0.0.1:{admin}\"\n[upstream]\nurl = \"{}\"\n[drain]\nreadiness_delay = \"700ms\"\ndeadline = \"10s\"\n[log]\nformat = \"text\"\n[[state.keys]]\nid = \"k1\"\nsecret = \"{TEST_KEY}\"\n",
            legacy.url()
        ),
    )
    .unwrap();
    let mut child = serve(&cfg);
    let url = format!("http://127.0.0.1:{port}/mcp");
    let admin_url = format!("http://127.0.0.1:{admin}");
    assert!(
        eventually_async(Duration::from_secs(10), || async {
            std::net::TcpStream::connect(("127.0.0.1", admin)).is_ok()
        })
        .await,
        "the gateway did not start"
    );
    let in_flight = tokio::spawn({
        let url = url.clone();
        async move {
            ModernClient::new(&url)
                .request(
                    "tools/call",
                    json!({"name": "slow", "arguments": {"ms": 1500}}),
                )
                .await
        }
    });
    assert!(
        legacy
            .stats()
            .wait_until(|s| s.tool_starts("slow") == 1, Duration::from_secs(5))
            .await
    );
    let t0 = std::time::Instant::now();
    std::process::Command::new("kill")
        .args(["-TERM", &child.id().unwrap().to_string()])
        .status()
        .unwrap();
    // Readiness turns off at once.
    assert!(
        eventually_async(Duration::from_secs(2), || async {
            get(&format!("{admin_url}/readyz")).await.0 == 503
        })
        .await
    );
    // After the readiness delay the listener refuses new connections.
    assert!(
        eventually_async(Duration::from_secs(5), || async {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err()
        })
        .await,
        "still accepting after the readiness delay"
    );
    assert!(
        t0.elapsed() >= Duration::from_millis(600),
        "stopped accepting before the delay"
    );
    // The call that was in flight completes normally.
    let done = in_flight.await.unwrap().unwrap();
    assert_eq!(text_of(&done), "slept");
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("exits within the deadline")
        .unwrap();
    assert!(status.success(), "{status:?}");
    legacy.shutdown().await;
}

/// The gateway binary serving `cfg`, its output discarded, killed when dropped.
fn serve(cfg: &Path) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_mrtr-gateway"))
        .args(["serve", "--config"])
        .arg(cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

async fn eventually_async<F, Fut>(timeout: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if cond().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test]
async fn check_config_exits_64_naming_the_key_and_the_environment_wins() {
    let dir = TempDir::new("mrtr-ops");
    let path = dir.path().join("g.toml");
    let run = |vars: &[(&str, &str)]| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_mrtr-gateway"));
        cmd.args(["check-config", "--config"]).arg(&path);
        for (k, v) in vars {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    };
    let cases: &[(&str, &str)] = &[
        ("[listen]\nbogus = 1\n", "listen"),
        ("[state]\nttl = \"soon\"\n", "state.ttl"),
        (
            "[state]\nkeys_dir = \"/nonexistent/keys\"\n",
            "state.keys_dir",
        ),
        (
            "[[state.keys]]\nid = \"k1\"\nsecret = \"%%%\"\n",
            "state.keys[0].secret",
        ),
        (
            "[[state.keys]]\nid = \"k1\"\nsecret_file = \"/nonexistent\"\n",
            "state.keys[0].secret_file",
        ),
        ("[listen]\naddr = \"nowhere\"\n", "listen.addr"),
        ("", "state.keys"),
    ];
    for (text, key) in cases {
        std::fs::write(&path, text).unwrap();
        let out = run(&[]);
        assert_eq!(out.status.code(), Some(64), "{text}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(key), "{text}: {err}");
    }
    let dup = format!(
        "[[state.keys]]\nid = \"k1\"\nsecret = \"{TEST_KEY}\"\n[[state.keys]]\nid = \"k1\"\nsecret = \"{TEST_KEY}\"\n"
    );
    std::fs::write(&path, dup).unwrap();
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("duplicate"));
    // A valid file passes; an environment override beats it, and its errors name the variable.
    std::fs::write(
        &path,
        format!("[state]\nttl = \"5m\"\n[[state.keys]]\nid = \"k1\"\nsecret = \"{TEST_KEY}\"\n"),
    )
    .unwrap();
    let ok = run(&[]);
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("state ttl 300s"));
    let over = run(&[("MRTR_GATEWAY__STATE__TTL", "90s")]);
    assert!(String::from_utf8_lossy(&over.stdout).contains("state ttl 90s"));
    let bad = run(&[("MRTR_GATEWAY__STATE__TTL", "whenever")]);
    assert_eq!(bad.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("MRTR_GATEWAY__STATE__TTL"));
    // --print shows the effective configuration, environment included, secrets redacted.
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_mrtr-gateway"));
    cmd.args(["check-config", "--print", "--config"])
        .arg(&path)
        .env("MRTR_GATEWAY__LISTEN__PATH", "/custom");
    let printed = cmd.output().unwrap();
    assert_eq!(printed.status.code(), Some(0));
    let printed = String::from_utf8_lossy(&printed.stdout);
    assert!(printed.contains("path = \"/custom\""), "{printed}");
    assert!(printed.contains("ttl = \"5m\""), "{printed}");
    assert!(printed.contains("<redacted>"), "{printed}");
    assert!(
        !printed.contains(TEST_KEY),
        "a secret was printed: {printed}"
    );
    assert!(
        printed.contains("gather_window = \"100ms\""),
        "defaults are shown: {printed}"
    );
    // The shipped example parses.
    let example = run(&[]);
    assert_eq!(example.status.code(), Some(0));
    let shipped = std::process::Command::new(env!("CARGO_BIN_EXE_mrtr-gateway"))
        .args([
            "check-config",
            "--config",
            concat!(env!("CARGO_MANIFEST_DIR"), "/config/gateway.toml"),
        ])
        .output()
        .unwrap();
    assert_eq!(
        shipped.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&shipped.stderr)
    );
    // It carries the public example key, valid but worth a word, naming where it is.
    let warned = String::from_utf8_lossy(&shipped.stderr);
    assert!(
        warned.contains("state.keys[0].secret") && warned.contains("public example secret"),
        "{warned}"
    );
    assert!(
        !String::from_utf8_lossy(&ok.stderr).contains("example"),
        "a real key gets no such warning"
    );
}

/// `keygen --dir` writes a date-named key file a key directory loads, newest sealing.
#[test]
fn keygen_writes_a_key_file_the_key_directory_loads() {
    let dir = TempDir::new("mrtr-keygen");
    let keygen = || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_mrtr-gateway"))
            .args(["keygen", "--dir"])
            .arg(dir.path())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    };
    let (first, second) = (keygen(), keygen());
    assert!(first.starts_with(dir.path()) && second.starts_with(dir.path()));
    let cfg = Config::from_toml_str(
        &format!("[state]\nkeys_dir = \"{}\"\n", dir.path().display()),
        &[],
        None,
    )
    .unwrap();
    let ids: Vec<&str> = cfg.state.keys.iter().map(|k| k.id.as_str()).collect();
    let name = |p: &Path| p.file_name().unwrap().to_string_lossy().into_owned();
    assert_eq!(ids, [name(&second), name(&first)], "the newer key seals");
}

/// `runtime.worker_threads` sets the threads the gateway's tasks run on, and the gauge shows
/// the number in force. The test asks for one more than the CPUs here, which the default
/// (one per CPU) never gives.
#[tokio::test]
async fn worker_threads_set_the_runtime_and_the_gauge_shows_them() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let want = cpus + 1;
    let dir = TempDir::new("mrtr-workers");
    let (port, admin) = (free_port(), free_port());
    let cfg = dir.path().join("gateway.toml");
    std::fs::write(
        &cfg,
        format!(
            "[listen]\naddr = \"127.0.0.1:{port}\"\n[admin]\naddr = \"127.0.0.1:{admin}\"\n\
             [upstream]\nurl = \"http://127.0.0.1:9/mcp\"\n[runtime]\nworker_threads = {want}\n\
             [[state.keys]]\nid = \"k1\"\nsecret = \"{TEST_KEY}\"\n"
        ),
    )
    .unwrap();
    let _child = serve(&cfg);
    let metrics = format!("http://127.0.0.1:{admin}/metrics");
    let mut gauge = None;
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", admin)).is_ok() {
            let (status, body) = get(&metrics).await;
            assert_eq!(status, 200);
            let text = body.as_str().unwrap_or_default().to_string();
            gauge = text
                .lines()
                .find(|l| l.starts_with("mrtr_gateway_runtime_worker_threads"))
                .and_then(|l| l.rsplit(' ').next())
                .map(str::to_string);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(gauge.as_deref(), Some(want.to_string().as_str()));
}

/// A busy port is reported with the setting and the address, not only the OS's words.
#[test]
fn a_busy_listen_port_is_named_in_the_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let dir = TempDir::new("mrtr-busy");
    let path = dir.path().join("g.toml");
    std::fs::write(
        &path,
        format!(
            "[listen]\naddr = \"{addr}\"\n[upstream]\nurl = \"http://127.0.0.1:9/mcp\"\n\
             [[state.keys]]\nid = \"k1\"\nsecret = \"{TEST_KEY}\"\n"
        ),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mrtr-gateway"))
        .args(["serve", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("listen.addr {addr}")) && err.contains("in use"),
        "{err}"
    );
}

/// Every metric family `docs/metrics.md` documents is in `/metrics` from the start, before
/// anything happened: a dashboard or an alert on a family that appeared only after its first
/// event would read "no data" instead of 0.
#[tokio::test]
async fn every_documented_metric_family_is_present_from_start() {
    let doc = std::fs::read_to_string(crate::support::peers::repo().join("docs/metrics.md"))
        .expect("docs/metrics.md");
    // Rows of the metric tables: | `name` | counter, gauge or histogram | …
    let documented: Vec<String> = doc
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let name = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            let kind = *cells.get(2)?;
            (matches!(kind, "counter" | "gauge" | "histogram") && !name.contains('*'))
                .then(|| format!("mrtr_gateway_{name}"))
        })
        .collect();
    assert!(
        documented.len() > 40,
        "the tables were read: {documented:?}"
    );
    let env = env(greet_handlers()).await;
    let text = env.gw.metrics.render();
    env.stop().await;
    let present = |name: &str| {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .any(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ', '_']))
    };
    let missing: Vec<&String> = documented.iter().filter(|n| !present(n)).collect();
    assert!(missing.is_empty(), "absent at start: {missing:#?}");
    // The families by reason have a series per reason (and fault) from the start.
    let series = |family: &str, labels: &[&str]| {
        text.lines().any(|l| {
            l.starts_with(&format!("{family}{{"))
                && labels.iter().all(|kv| l.contains(&format!("{kv}\"")))
        })
    };
    for (family, labels) in [
        (
            "rejections_total",
            &["fault=\"client", "reason=\"legacy_error"][..],
        ),
        (
            "rejections_total",
            &["fault=\"upstream", "reason=\"legacy_error"],
        ),
        (
            "rejections_total",
            &["fault=\"internal", "reason=\"single_use_full"],
        ),
        (
            "policy_refusals_total",
            &["kind=\"elicitation_url", "reason=\"url_localhost"],
        ),
        (
            "policy_refusals_total",
            &["kind=\"error_data", "reason=\"url_in_text"],
        ),
        (
            "legacy_sessions_failed_total",
            &["reason=\"upstream_unreachable"],
        ),
    ] {
        let family = format!("mrtr_gateway_{family}");
        assert!(
            series(&family, labels),
            "{family} {labels:?} absent at start"
        );
    }
}
