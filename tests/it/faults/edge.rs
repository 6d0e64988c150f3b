//! Hostile clients at the front edge (issue 12, points 1–3): stalled request bodies over
//! HTTP/1 and HTTP/2, silent and half-sent connections (plain and TLS), connection caps,
//! authentication before the body, the admin listener (caps, timeouts, Host allow-list, a
//! descriptor budget that keeps idle admin sockets from starving the MCP listener), and the
//! per-principal quotas on long-lived streams and on parked stdio calls.
//!
//! Each test prints the figures it saw (slots held, the legitimate call's latency, when the
//! stalled connections were closed); the asserts are on behaviour, never on those times.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use mrtr_gateway::config::Config;
use mrtr_testkit::client::{EventStream, ModernClient};
use mrtr_testkit::legacy_server::{Handlers, LegacyServer, LegacyServerConfig};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::support::peers::python_stdio_command;
use crate::support::peers::tempdir::TempDir;
use crate::support::*;

/// A gateway in front of the in-repo legacy server (`echo` and the tests' tools), with
/// `listen` keys in `[listen]` and other sections in `extra`.
async fn edge_env(h: Handlers, listen: &str, extra: &str) -> Env {
    let legacy = LegacyServer::start(LegacyServerConfig::default(), super::with_echo(h))
        .await
        .expect("legacy server starts");
    let text = format!(
        "[listen]\naddr = \"127.0.0.1:0\"\n{listen}\n\
         [upstream]\nurl = \"{}\"\nresponse_timeout = \"5s\"\ncall_timeout = \"20s\"\n\
         [[state.keys]]\nid = \"k1\"\nsecret = \"{TEST_KEY}\"\n{extra}\n",
        legacy.url()
    );
    let cfg = Config::from_toml_str(&text, &[], None)
        .unwrap_or_else(|e| panic!("edge config: {e}\n{text}"));
    Env::start(legacy, cfg).await
}

/// Makes sure this test process may hold `n` descriptors (both ends of every test socket
/// live here): raises the soft limit up to the hard one if need be.
fn ensure_descriptors(n: u64) {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let Rlimit { current, maximum } = getrlimit(Resource::Nofile);
    if current.is_some_and(|c| c < n) {
        let want = maximum.map_or(n, |m| m.min(n));
        let _ = setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(want),
                maximum,
            },
        );
    }
    let now = getrlimit(Resource::Nofile).current;
    assert!(
        now.is_none_or(|c| c >= n),
        "this test needs {n} open files; the hard limit (ulimit -Hn) allows {maximum:?}"
    );
}

/// The headers of a modern `tools/call` POST whose body is announced but never sent.
fn stalled_head(addr: SocketAddr, extra: &str) -> String {
    format!(
        "POST /mcp HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         accept: application/json, text/event-stream\r\nmcp-protocol-version: 2026-07-28\r\n\
         mcp-method: tools/call\r\nmcp-name: echo\r\ncontent-length: 200\r\n{extra}\r\n"
    )
}

/// Reads until the server closes the connection, at most `limit`; what arrived, or `None`
/// if it was still open.
async fn read_to_close(s: &mut TcpStream, limit: Duration) -> Option<String> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = tokio::time::timeout(limit, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    closed
        .ok()
        .map(|_| String::from_utf8_lossy(&out).into_owned())
}

/// A normal call succeeds; returns how long it took.
async fn served(env: &Env) -> Duration {
    let t0 = Instant::now();
    let ex = env
        .client()
        .request(
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "served"}}),
        )
        .await
        .expect("the gateway answers");
    let took = t0.elapsed();
    assert_eq!(ex.status.as_u16(), 200, "{:?}", ex.message);
    assert_eq!(text(ex.result().unwrap()), "served");
    took
}

fn gauge(env: &Env, name: &str) -> f64 {
    metric(&env.gw, name, &[])
}

fn limit_hits(env: &Env, limit: &str) -> f64 {
    metric(
        &env.gw,
        "mrtr_gateway_limit_hits_total",
        &[("limit", limit)],
    )
}

/// The attack: more stalled bodies than request slots. They hold connections (within
/// the caps, configured above the attacker's count here since every test socket comes from
/// 127.0.0.1) but no slot; a legitimate call is served meanwhile; every stalled request gets
/// 408 and its connection is closed at the body deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_bodies_hold_no_request_slot_and_are_closed_at_the_body_deadline() {
    const STALLED: usize = 1100;
    ensure_descriptors(2 * STALLED as u64 + 1024);
    let env = edge_env(
        Handlers::new(),
        "max_concurrent_requests = 1024\nmax_connections = 1200\nmax_connections_per_source = 1200\n\
         body_read_timeout = \"3s\"\nheader_read_timeout = \"10s\"",
        "",
    )
    .await;
    let addr = env.running.addr;
    let baseline = served(&env).await;
    let head = stalled_head(addr, "");
    let mut sockets = Vec::with_capacity(STALLED);
    for _ in 0..STALLED {
        let mut s = TcpStream::connect(addr).await.expect("connects");
        s.write_all(head.as_bytes()).await.unwrap();
        sockets.push(s);
    }
    let sent = Instant::now();
    assert!(
        eventually(Duration::from_secs(30), || gauge(
            &env,
            "mrtr_gateway_requests_reading_body"
        ) == STALLED as f64)
        .await,
        "the gateway sees {} of {STALLED} stalled requests",
        gauge(&env, "mrtr_gateway_requests_reading_body")
    );
    let slots_held = gauge(&env, "mrtr_gateway_active_requests");
    let latency = served(&env).await;
    assert_eq!(slots_held, 0.0, "stalled bodies hold no request slot");
    assert_eq!(
        gauge(&env, "mrtr_gateway_requests_reading_body"),
        STALLED as f64,
        "the stalled requests are all still waiting"
    );
    // Each stalled request: 408 with a JSON-RPC error, then the connection is closed.
    let reads = sockets.into_iter().map(|mut s| {
        tokio::spawn(async move { read_to_close(&mut s, Duration::from_secs(60)).await })
    });
    let mut closed = 0;
    for r in futures_util::future::join_all(reads).await {
        let answer = r.unwrap().expect("the stalled connection is closed");
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("listen.body_read_timeout"), "{answer}");
        closed += 1;
    }
    let all_closed_after = sent.elapsed();
    assert_eq!(closed, STALLED);
    assert_eq!(limit_hits(&env, "body_read_timeout"), STALLED as f64);
    assert_metric!(
        &env.gw,
        "rejections_total",
        &[("reason", "body_read_timeout"), ("fault", "client")],
        STALLED as f64
    );
    assert!(
        eventually(Duration::from_secs(10), || gauge(
            &env,
            "mrtr_gateway_active_connections"
        ) == 0.0)
        .await
    );
    served(&env).await;
    println!(
        "{STALLED} stalled bodies, 1024 slots: slots held {slots_held}, legitimate call {latency:?} \
         (before the attack: {baseline:?}), \
         all stalled connections answered 408 and closed {all_closed_after:?} after the last was sent \
         (body_read_timeout 3s)"
    );
    env.stop().await;
}

/// The HTTP/2 variant: few connections, many streams. A connection opens at most
/// `http2_max_concurrent_streams` streams; stalled streams hold no slot; each gets 408 and
/// the connection is closed (GOAWAY) once they are answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_http2_streams_hold_no_request_slot_and_are_bounded_per_connection() {
    const CONNS: usize = 6;
    const STREAMS: usize = 100;
    ensure_descriptors(1024);
    let env = edge_env(
        Handlers::new(),
        "max_concurrent_requests = 256\nhttp2_max_concurrent_streams = 100\nbody_read_timeout = \"3s\"",
        "",
    )
    .await;
    let addr = env.running.addr;
    let baseline = served(&env).await;
    let mut responses = Vec::new();
    let mut senders = Vec::new();
    let mut conns = Vec::new();
    for _ in 0..CONNS {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let (client, conn) = h2::client::handshake(tcp).await.expect("h2 handshake");
        conns.push(tokio::spawn(conn));
        let mut client = client.ready().await.unwrap();
        // One stream more than the server allows: the client must hold it back.
        for i in 0..=STREAMS {
            let req = http::Request::post(format!("http://{addr}/mcp"))
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .header("mcp-protocol-version", "2026-07-28")
                .header("content-length", "200")
                .body(())
                .unwrap();
            let (resp, send) = client.send_request(req, false).expect("stream opens");
            responses.push(resp);
            senders.push(send);
            if i < STREAMS {
                client = client.ready().await.unwrap();
            }
        }
    }
    let sent = Instant::now();
    let open = (CONNS * STREAMS) as f64;
    assert!(
        eventually(Duration::from_secs(30), || gauge(
            &env,
            "mrtr_gateway_requests_reading_body"
        ) >= open)
        .await
    );
    let slots_held = gauge(&env, "mrtr_gateway_active_requests");
    let latency = served(&env).await;
    assert_eq!(slots_held, 0.0);
    assert_eq!(
        gauge(&env, "mrtr_gateway_requests_reading_body"),
        open,
        "no connection got more than http2_max_concurrent_streams streams"
    );
    let mut timed_out = 0;
    for resp in responses {
        if let Ok(Ok(r)) = tokio::time::timeout(Duration::from_secs(60), resp).await {
            assert_eq!(r.status().as_u16(), 408);
            timed_out += 1;
        }
    }
    // A stream the client held back is opened once the first answers free a place, unless
    // the GOAWAY that follows them is there first; if opened, it stalls and is answered 408
    // too.
    assert!(
        (CONNS * STREAMS..=CONNS * (STREAMS + 1)).contains(&timed_out),
        "{timed_out}"
    );
    for c in conns {
        tokio::time::timeout(Duration::from_secs(30), c)
            .await
            .expect("the connection is closed after its stalled streams are answered")
            .unwrap()
            .ok();
    }
    let closed_after = sent.elapsed();
    drop(senders);
    assert_eq!(limit_hits(&env, "body_read_timeout"), timed_out as f64);
    served(&env).await;
    println!(
        "{CONNS} HTTP/2 connections x {STREAMS} stalled streams (+1 held back each), 256 slots: \
         slots held {slots_held}, legitimate call {latency:?} (before: {baseline:?}), \
         connections closed {closed_after:?} \
         after the streams were opened (body_read_timeout 3s)"
    );
    env.stop().await;
}

/// A connection that sends nothing, or only part of its headers, is closed at
/// `header_read_timeout` (not at `idle_timeout`), over plain TCP and over TLS.
#[tokio::test]
async fn a_connection_must_send_its_first_request_within_header_read_timeout() {
    let env = edge_env(
        Handlers::new(),
        "header_read_timeout = \"1s\"\nidle_timeout = \"5m\"",
        "",
    )
    .await;
    let addr = env.running.addr;
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let mut half = TcpStream::connect(addr).await.unwrap();
    half.write_all(b"POST /mcp HTTP/1.1\r\nhost: x\r\ncontent-")
        .await
        .unwrap();
    assert!(
        read_to_close(&mut silent, Duration::from_secs(20))
            .await
            .is_some(),
        "a silent connection is closed"
    );
    assert!(
        read_to_close(&mut half, Duration::from_secs(20))
            .await
            .is_some(),
        "a connection that never finishes its headers is closed"
    );
    assert!(
        eventually(Duration::from_secs(5), || limit_hits(
            &env,
            "header_read_timeout"
        ) == 2.0)
        .await
    );
    assert!(
        eventually(Duration::from_secs(5), || gauge(
            &env,
            "mrtr_gateway_active_connections"
        ) == 0.0)
        .await
    );
    served(&env).await;
    env.stop().await;

    // Over TLS: the handshake completes, then nothing.
    let legacy = LegacyServer::start(
        LegacyServerConfig::default(),
        super::with_echo(Handlers::new()),
    )
    .await
    .unwrap();
    let (gw, running, ca, _dir) = crate::support::tls::tls_gateway(
        &legacy.url(),
        "header_read_timeout = \"1s\"\nidle_timeout = \"5m\"",
    )
    .await;
    let mut tls = crate::support::tls::connect(running.addr, &ca.pem(), None)
        .await
        .expect("TLS handshake");
    let mut buf = [0u8; 64];
    let closed = tokio::time::timeout(Duration::from_secs(20), tls.read(&mut buf)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "a silent TLS connection is closed: {closed:?}"
    );
    assert!(
        metric_reaches(
            &gw,
            "mrtr_gateway_limit_hits_total",
            &[("limit", "header_read_timeout")],
            1.0,
            Duration::from_secs(5)
        )
        .await
    );
    running.stop().await;
    legacy.shutdown().await;
}

/// A TCP connection to `addr` from the loopback address `from` (all of 127/8 is loopback).
async fn connect_from(from: &str, addr: SocketAddr) -> TcpStream {
    let s = TcpSocket::new_v4().unwrap();
    s.bind(format!("{from}:0").parse().unwrap()).unwrap();
    s.connect(addr).await.expect("connects")
}

/// Whether the server closed `s` at once (refused at accept) rather than waiting for a
/// request.
async fn closed_at_once(s: &mut TcpStream) -> bool {
    read_to_close(s, Duration::from_secs(2)).await.is_some()
}

/// An `echo` call on an already open connection.
async fn echo_on(s: &mut TcpStream, addr: SocketAddr) -> String {
    let c = ModernClient::new("http://127.0.0.1:1/mcp");
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": c.params_with_meta(json!({"name": "echo", "arguments": {"text": "hi"}}))})
    .to_string();
    let head = stalled_head(addr, "connection: close\r\n").replace(
        "content-length: 200",
        &format!("content-length: {}", body.len()),
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body.as_bytes()).await.unwrap();
    read_to_close(s, Duration::from_secs(10))
        .await
        .expect("answered and closed")
}

/// `listen.max_connections_per_source` and `listen.max_connections`: a connection over a cap
/// is closed at accept; other sources are still served; a freed place is reused.
#[tokio::test]
async fn connections_over_the_caps_are_closed_at_accept() {
    let env = edge_env(
        Handlers::new(),
        "max_connections = 5\nmax_connections_per_source = 3\nheader_read_timeout = \"30s\"",
        "",
    )
    .await;
    let addr = env.running.addr;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(connect_from("127.0.0.1", addr).await);
    }
    assert!(
        eventually(Duration::from_secs(5), || gauge(
            &env,
            "mrtr_gateway_active_connections"
        ) == 3.0)
        .await
    );
    let mut fourth = connect_from("127.0.0.1", addr).await;
    assert!(closed_at_once(&mut fourth).await, "over the per-source cap");
    assert_eq!(limit_hits(&env, "max_connections_per_source"), 1.0);
    // Another source still gets in, and is served.
    let mut other = connect_from("127.0.0.2", addr).await;
    let answer = echo_on(&mut other, addr).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let _fifth = connect_from("127.0.0.3", addr).await;
    let _sixth = connect_from("127.0.0.4", addr).await;
    assert!(
        eventually(Duration::from_secs(5), || gauge(
            &env,
            "mrtr_gateway_active_connections"
        ) == 5.0)
        .await
    );
    let mut seventh = connect_from("127.0.0.5", addr).await;
    assert!(closed_at_once(&mut seventh).await, "over the total cap");
    assert_eq!(limit_hits(&env, "max_connections"), 1.0);
    // A place given back is taken again.
    drop(held.pop());
    assert!(
        eventually(Duration::from_secs(5), || gauge(
            &env,
            "mrtr_gateway_active_connections"
        ) == 4.0)
        .await
    );
    let mut again = connect_from("127.0.0.1", addr).await;
    let answer = echo_on(&mut again, addr).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    env.stop().await;
}

/// A caller who fails authentication is answered from its headers: the gateway neither waits
/// for its body nor gives it a slot.
#[tokio::test]
async fn authentication_comes_before_the_body() {
    let env = edge_env(
        Handlers::new(),
        "body_read_timeout = \"60s\"",
        "[auth]\nmode = \"header\"\n",
    )
    .await;
    let addr = env.running.addr;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(stalled_head(addr, "").as_bytes())
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
        .await
        .expect("answered without its body")
        .unwrap();
    let answer = String::from_utf8_lossy(&buf[..n]);
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert_eq!(gauge(&env, "mrtr_gateway_requests_reading_body"), 0.0);
    assert_eq!(gauge(&env, "mrtr_gateway_active_requests"), 0.0);
    env.stop().await;
}

/// Headers that name a user to the trusted-header auth mode.
fn as_user(user: &str, pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("x-authenticated-user", HeaderValue::from_str(user).unwrap());
    for (k, v) in pairs {
        h.insert(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    h
}

/// Opens a listen stream as `user`.
async fn listen_as(c: &ModernClient, user: &str) -> EventStream {
    let body = json!({"jsonrpc": "2.0", "id": c.next_id(), "method": "subscriptions/listen",
        "params": c.params_with_meta(json!({"notifications": {"toolsListChanged": true}}))});
    let mut h = ModernClient::routing_headers(&body);
    h.extend(as_user(user, &[]));
    c.open_raw_stream(Method::POST, h, Bytes::from(body.to_string()))
        .await
        .unwrap()
}

/// `tools/list` as `user`; its HTTP status.
async fn list_as(c: &ModernClient, user: &str) -> u16 {
    let body = json!({"jsonrpc": "2.0", "id": c.next_id(), "method": "tools/list",
        "params": c.params_with_meta(json!({}))});
    let mut h = ModernClient::routing_headers(&body);
    h.extend(as_user(user, &[]));
    c.send_raw(Method::POST, h, Bytes::from(body.to_string()))
        .await
        .unwrap()
        .status
        .as_u16()
}

/// Listen streams: a per-principal quota (429) under the replica's cap (503), and no request
/// slot once they stream.
#[tokio::test]
async fn listen_streams_have_a_per_principal_quota_and_hold_no_slot() {
    let env = edge_env(
        Handlers::new(),
        "max_concurrent_requests = 1",
        "[auth]\nmode = \"header\"\n[subscriptions]\nmax_streams = 3\nmax_streams_per_principal = 2\n",
    )
    .await;
    let c = env.client();
    let a1 = listen_as(&c, "alice").await;
    let a2 = listen_as(&c, "alice").await;
    assert_eq!((a1.status.as_u16(), a2.status.as_u16()), (200, 200));
    let a3 = listen_as(&c, "alice").await;
    assert_eq!(a3.status.as_u16(), 429, "{:?}", a3.headers);
    assert!(a3.headers.contains_key("retry-after"));
    // Bob is not held back by alice's quota.
    let b1 = listen_as(&c, "bob").await;
    assert_eq!(b1.status.as_u16(), 200);
    // The replica is full now: that is not carol's fault.
    let c1 = listen_as(&c, "carol").await;
    assert_eq!(c1.status.as_u16(), 503);
    assert_eq!(limit_hits(&env, "max_listen_streams_per_principal"), 1.0);
    assert_eq!(limit_hits(&env, "max_listen_streams"), 1.0);
    assert_metric!(
        &env.gw,
        "rejections_total",
        &[("reason", "listen_stream_quota"), ("fault", "client")],
        1.0
    );
    // Three streams open, one request slot: ordinary requests are still served.
    assert_eq!(gauge(&env, "mrtr_gateway_listen_streams"), 3.0);
    assert_eq!(list_as(&c, "carol").await, 200);
    drop((a1, a2, b1));
    env.stop().await;
}

/// A legacy client's `initialize` as `user`; the sealed session id.
async fn legacy_session(c: &ModernClient, user: &str) -> String {
    let body = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "raw-legacy", "version": "1"}}});
    let init = c
        .send_raw(
            Method::POST,
            as_user(user, &[]),
            Bytes::from(body.to_string()),
        )
        .await
        .unwrap();
    assert_eq!(init.status.as_u16(), 200, "{:?}", init.message);
    init.headers["mcp-session-id"].to_str().unwrap().to_string()
}

/// A legacy client's standalone GET stream on `session`.
async fn legacy_get(c: &ModernClient, user: &str, session: &str) -> EventStream {
    let h = as_user(
        user,
        &[
            ("mcp-session-id", session),
            ("mcp-protocol-version", "2025-11-25"),
        ],
    );
    c.open_raw_stream(Method::GET, h, Bytes::new())
        .await
        .unwrap()
}

/// Passed-through legacy GET streams: a per-principal quota (429) under the replica's cap
/// (503), and no request slot once they stream (the issue: 32 of them filled the slots).
#[tokio::test]
async fn legacy_get_streams_have_a_per_principal_quota_and_hold_no_slot() {
    let env = edge_env(
        Handlers::new(),
        "max_concurrent_requests = 2",
        "[auth]\nmode = \"header\"\n[legacy_clients]\nmax_get_streams = 3\nmax_get_streams_per_principal = 2\n",
    )
    .await;
    let c = env.client();
    let mut open = Vec::new();
    for _ in 0..2 {
        let s = legacy_session(&c, "alice").await;
        let g = legacy_get(&c, "alice", &s).await;
        assert_eq!(g.status.as_u16(), 200);
        open.push(g);
    }
    let s = legacy_session(&c, "alice").await;
    let refused = legacy_get(&c, "alice", &s).await;
    assert_eq!(refused.status.as_u16(), 429);
    let s = legacy_session(&c, "bob").await;
    let g = legacy_get(&c, "bob", &s).await;
    assert_eq!(
        g.status.as_u16(),
        200,
        "bob is not held back by alice's quota"
    );
    open.push(g);
    let s = legacy_session(&c, "carol").await;
    let full = legacy_get(&c, "carol", &s).await;
    assert_eq!(full.status.as_u16(), 503);
    assert_eq!(
        limit_hits(&env, "max_legacy_get_streams_per_principal"),
        1.0
    );
    assert_eq!(limit_hits(&env, "max_legacy_get_streams"), 1.0);
    assert_eq!(gauge(&env, "mrtr_gateway_legacy_get_streams"), 3.0);
    // Three streams open, two request slots: ordinary requests are still served.
    assert_eq!(gauge(&env, "mrtr_gateway_active_requests"), 0.0);
    assert_eq!(list_as(&c, "carol").await, 200);
    drop(open);
    assert!(
        eventually(Duration::from_secs(5), || gauge(
            &env,
            "mrtr_gateway_legacy_get_streams"
        ) == 0.0)
        .await
    );
    env.stop().await;
}

/// The attack over stdio: elicitations parked by one caller held every stdio child,
/// so nobody else could call until `parking.ttl`. Parking now leaves
/// `parking.stdio_reserved_children` children for fresh calls (FastMCP over stdio).
#[tokio::test]
async fn parked_calls_leave_stdio_children_for_fresh_calls() {
    let dir = TempDir::new("mrtr-edge-stdio");
    let command = python_stdio_command(&[
        "--count-file",
        dir.path().join("counts").to_string_lossy().as_ref(),
    ]);
    let upstream = format!(
        "transport = \"stdio\"\ncommand = {command}\nstdio_max_children = 3\n\
         response_timeout = \"15s\"\ncall_timeout = \"60s\"\n"
    );
    let (gw, running, url) = start_gateway(config_with_upstream(
        &upstream,
        "",
        "[parking]\nstdio_reserved_children = 1\n[mrtr]\ngather_window = \"400ms\"\n",
    ))
    .await;
    let attacker = ModernClient::new(&url);
    for i in 0..3 {
        let ex = call_tool(&attacker, "greet").await;
        assert_eq!(
            ex.result_type(),
            Some("input_required"),
            "call {i}: {:?}",
            ex.message
        );
    }
    // Someone else's fresh call finds a child (without the reserve it waited
    // upstream.response_timeout for one, then got 503).
    let t0 = Instant::now();
    let ex = ModernClient::new(&url)
        .request(
            "tools/call",
            json!({"name": "add", "arguments": {"a": 2, "b": 3}}),
        )
        .await
        .unwrap();
    let latency = t0.elapsed();
    assert_eq!(ex.status.as_u16(), 200, "{:?}", ex.message);
    assert_eq!(text(ex.result().unwrap()), "5");
    // Two parked; the third was not, and its retry will replay.
    assert_eq!(metric(&gw, "mrtr_gateway_parked_calls", &[]), 2.0);
    assert_metric!(
        &gw,
        "limit_hits_total",
        &[("limit", "parking_stdio_reserve")],
        1.0
    );
    println!(
        "stdio_max_children 3, reserve 1: 3 elicitations, 2 parked, a fresh call served in {latency:?}"
    );
    running.stop().await;
    gw.release_parked().await;
}

/// The gateway binary, run with at most `nofile` open files, on free loopback ports; `env`
/// sets configuration through `MRTR_GATEWAY__…` variables.
async fn spawn_limited(
    dir: &std::path::Path,
    config: &str,
    env: &[(&str, &str)],
    nofile: u32,
) -> (tokio::process::Child, u16, u16) {
    let (port, admin) = (free_port(), free_port());
    let path = dir.join("gateway.toml");
    std::fs::write(
        &path,
        format!(
            "[listen]\naddr = \"127.0.0.1:{port}\"\n[admin]\naddr = \"127.0.0.1:{admin}\"\n{config}"
        ),
    )
    .unwrap();
    let log = dir.join("gateway.log");
    let mut cmd = tokio::process::Command::new("sh");
    cmd.arg("-c")
        .arg(format!(
            "ulimit -n {nofile} && exec \"$0\" serve --config \"$1\""
        ))
        .arg(env!("CARGO_BIN_EXE_mrtr-gateway"))
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "gateway exited with {status}: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        assert!(Instant::now() < deadline, "gateway did not start");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    (child, port, admin)
}

/// The issue: 560 idle admin sockets exhausted the descriptors and the MCP listener failed to
/// accept. Here the gateway may hold 256 descriptors and 300 idle admin sockets are opened:
/// the admin listener keeps `admin.max_connections` of them and closes the rest at accept, and
/// the MCP listener serves a call while they are all held (the admin header and idle
/// deadlines, 60 s, have closed none of them yet).
#[tokio::test]
async fn idle_admin_sockets_do_not_starve_the_mcp_listener() {
    const IDLE: usize = 300;
    const CAP: usize = 8;
    ensure_descriptors(2048);
    let legacy = LegacyServer::start(
        LegacyServerConfig::default(),
        super::with_echo(Handlers::new()),
    )
    .await
    .unwrap();
    let dir = TempDir::new("mrtr-edge-admin");
    let config = format!(
        "[upstream]\nurl = \"{}\"\n[[state.keys]]\nid = \"k1\"\nsecret = \"{TEST_KEY}\"\n",
        legacy.url()
    );
    // The caps through the environment, as an operator would set them in a manifest.
    let (_child, port, admin) = spawn_limited(
        dir.path(),
        &config,
        &[
            ("MRTR_GATEWAY__ADMIN__MAX_CONNECTIONS", "8"),
            ("MRTR_GATEWAY__ADMIN__HEADER_READ_TIMEOUT", "60s"),
            ("MRTR_GATEWAY__ADMIN__IDLE_TIMEOUT", "60s"),
            ("MRTR_GATEWAY__LISTEN__MAX_CONNECTIONS", "64"),
            ("MRTR_GATEWAY__LISTEN__MAX_CONCURRENT_REQUESTS", "16"),
            ("MRTR_GATEWAY__PARKING__MAX_CALLS", "8"),
            ("MRTR_GATEWAY__POOL__MAX_IDLE", "4"),
            ("MRTR_GATEWAY__SUBSCRIPTIONS__MAX_STREAMS", "4"),
            ("MRTR_GATEWAY__LEGACY_CLIENTS__MAX_GET_STREAMS", "4"),
        ],
        256,
    )
    .await;
    let mut idle = Vec::with_capacity(IDLE);
    for _ in 0..IDLE {
        idle.push(TcpStream::connect(("127.0.0.1", admin)).await.unwrap());
    }
    // The MCP listener accepts and serves while every idle admin socket is held.
    let url = format!("http://127.0.0.1:{port}/mcp");
    let ex = tokio::time::timeout(
        Duration::from_secs(15),
        ModernClient::new(&url).request(
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "served"}}),
        ),
    )
    .await
    .expect("the MCP listener still accepts")
    .unwrap();
    assert_eq!(text(ex.result().unwrap()), "served");
    // Those over the cap were closed at accept; the others are still open.
    let reads = idle.into_iter().map(|mut s| {
        tokio::spawn(async move {
            let closed = read_to_close(&mut s, Duration::from_secs(3))
                .await
                .is_some();
            (closed, s)
        })
    });
    let results = futures_util::future::join_all(reads).await;
    let closed = results
        .iter()
        .filter(|r| matches!(r, Ok((true, _))))
        .count();
    assert_eq!(closed, IDLE - CAP);
    // Closing the admitted ones frees the admin listener for a scrape.
    drop(results);
    let text = scrape_when_free(admin).await;
    let hits = |limit: &str| sample(&text, "mrtr_gateway_limit_hits_total", &[("limit", limit)]);
    assert!(hits("admin_max_connections") >= (IDLE - CAP) as f64);
    assert_eq!(hits("admin_header_read_timeout"), 0.0);
    assert_sample!(&text, "accept_errors_total", &[("listener", "mcp")], 0.0);
    legacy.shutdown().await;
}

/// `/metrics` from the admin port, once a connection gets a place there (bounded wait).
async fn scrape_when_free(admin: u16) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut s = TcpStream::connect(("127.0.0.1", admin)).await.unwrap();
        let _ = s
            .write_all(b"GET /metrics HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
            .await;
        if let Some(answer) = read_to_close(&mut s, Duration::from_secs(5)).await
            && answer.starts_with("HTTP/1.1 200")
        {
            return answer;
        }
        assert!(Instant::now() < deadline, "the admin port never freed up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `check-config` warns when the caps may need more open files than the machine allows.
#[tokio::test]
async fn check_config_warns_when_the_caps_exceed_the_open_file_limit() {
    let dir = TempDir::new("mrtr-edge-check");
    let path = dir.path().join("gateway.toml");
    std::fs::write(
        &path,
        format!("[[state.keys]]\nid = \"k1\"\nsecret = \"{TEST_KEY}\"\n"),
    )
    .unwrap();
    let run = |nofile: u32| {
        std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "ulimit -n {nofile} && exec \"$0\" check-config --config \"$1\""
            ))
            .arg(env!("CARGO_BIN_EXE_mrtr-gateway"))
            .arg(&path)
            .output()
            .unwrap()
    };
    let low = run(1024);
    assert!(low.status.success());
    // Warnings go to stderr, after the file's name, like every check-config warning.
    let out = String::from_utf8_lossy(&low.stderr);
    assert!(out.contains("warning:"), "{out}");
    assert!(out.contains("listen.max_connections: 4096"), "{out}");
    assert!(out.contains("RLIMIT_NOFILE) is 1024"), "{out}");
    // Enough for the defaults, where the machine allows it.
    let (_, hard) = mrtr_gateway::descriptor_budget::limits();
    if hard.is_none_or(|h| h >= 16384) {
        let high = run(16384);
        let out = String::from_utf8_lossy(&high.stderr);
        assert!(high.status.success() && !out.contains("warning"), "{out}");
    }
}

/// The admin listener answers only allowed `Host`s, and closes silent and idle connections.
#[tokio::test]
async fn the_admin_listener_checks_host_and_closes_silent_and_idle_connections() {
    let env = edge_env(
        Handlers::new(),
        "",
        "[admin]\nheader_read_timeout = \"1s\"\nidle_timeout = \"1s\"\nallowed_hosts = [\"metrics.internal\"]\n",
    )
    .await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = listener.local_addr().unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    tokio::spawn(mrtr_gateway::admin::serve(
        env.gw.clone(),
        listener,
        shutdown.clone(),
    ));
    let get = |host: &'static str| async move {
        let mut s = TcpStream::connect(admin).await.unwrap();
        s.write_all(
            format!("GET /healthz HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
        let answer = read_to_close(&mut s, Duration::from_secs(10))
            .await
            .unwrap();
        answer.split(' ').nth(1).unwrap_or_default().to_string()
    };
    assert_eq!(get("127.0.0.1:9090").await, "200");
    assert_eq!(get("localhost").await, "200");
    assert_eq!(get("metrics.internal:9090").await, "200");
    assert_eq!(get("rebound.evil.example:9090").await, "421");
    assert_eq!(limit_hits(&env, "admin_allowed_hosts"), 1.0);
    // Silent: closed at the header deadline. Idle after a request: closed at the idle timeout.
    let mut silent = TcpStream::connect(admin).await.unwrap();
    let mut idle = TcpStream::connect(admin).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .unwrap();
    let answer = read_to_close(&mut idle, Duration::from_secs(20))
        .await
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        read_to_close(&mut silent, Duration::from_secs(20))
            .await
            .is_some()
    );
    assert!(
        eventually(Duration::from_secs(5), || limit_hits(
            &env,
            "admin_header_read_timeout"
        ) + limit_hits(
            &env,
            "admin_idle_timeout"
        ) >= 2.0)
        .await
    );
    shutdown.cancel();
    env.stop().await;
}
