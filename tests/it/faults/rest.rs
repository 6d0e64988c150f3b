//! Resting HTTP/1 connections (`listen.idle_release_after`): a connection quiet that long is
//! taken back from hyper and keeps only its socket until its next request starts. Each test
//! speaks HTTP/1.1 by hand on one socket, so the same connection is seen across the rest.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mrtr_gateway::config::Config;
use mrtr_testkit::client::ModernClient;
use mrtr_testkit::legacy_server::{Handlers, LegacyServer, LegacyServerConfig};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::support::*;

/// A gateway in front of the in-repo legacy server, with `listen` keys in `[listen]`. The
/// server also has `big`, which answers `size` bytes of text.
async fn rest_env(listen: &str) -> Env {
    let handlers = super::with_echo(Handlers::new()).tool(
        "big",
        "returns `size` bytes",
        json!({"type": "object"}),
        |_, args| async move {
            let size = args["size"].as_u64().unwrap_or(0) as usize;
            Ok(tool_text("x".repeat(size)))
        },
    );
    let legacy = LegacyServer::start(LegacyServerConfig::default(), handlers)
        .await
        .expect("legacy server starts");
    let text = format!(
        "[listen]\naddr = \"127.0.0.1:0\"\n{listen}\n\
         [upstream]\nurl = \"{}\"\n[[state.keys]]\nid = \"k1\"\nsecret = \"{TEST_KEY}\"\n",
        legacy.url()
    );
    let cfg = Config::from_toml_str(&text, &[], None)
        .unwrap_or_else(|e| panic!("rest config: {e}\n{text}"));
    Env::start(legacy, cfg).await
}

/// A whole `tools/call` request, as sent on the wire, with `extra` header lines.
fn call_request(addr: SocketAddr, id: u64, tool: &str, args: Value, extra: &str) -> Vec<u8> {
    let body = json!({
        "jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": ModernClient::new("http://unused/").params_with_meta(json!({"name": tool, "arguments": args})),
    });
    let body = serde_json::to_vec(&body).unwrap();
    let mut head = format!(
        "POST /mcp HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         accept: application/json, text/event-stream\r\ncontent-length: {}\r\n{extra}",
        body.len()
    );
    for (name, value) in ModernClient::routing_headers(&serde_json::from_slice(&body).unwrap()) {
        let name = name.expect("one value per header");
        head.push_str(&format!("{name}: {}\r\n", value.to_str().unwrap()));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(&body);
    out
}

/// Reads one response (content-length or chunked) within 10 s: its status and body.
async fn read_response(s: &mut TcpStream) -> (u16, String) {
    tokio::time::timeout(Duration::from_secs(10), async {
        let mut got = Vec::new();
        let mut buf = [0u8; 8192];
        let head_end = loop {
            if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let n = s.read(&mut buf).await.expect("read");
            assert!(n > 0, "the connection closed before a response");
            got.extend_from_slice(&buf[..n]);
        };
        let head = String::from_utf8_lossy(&got[..head_end]).to_ascii_lowercase();
        let status = head[9..12].parse().expect("status");
        let mut rest = got[head_end..].to_vec();
        let length = head.lines().find_map(|l| {
            l.strip_prefix("content-length:")
                .map(|v| v.trim().parse::<usize>().unwrap())
        });
        let body = if let Some(length) = length {
            while rest.len() < length {
                let n = s.read(&mut buf).await.expect("read");
                assert!(n > 0, "the connection closed mid-body");
                rest.extend_from_slice(&buf[..n]);
            }
            rest.truncate(length);
            rest
        } else {
            // Chunked: read until the last chunk, then decode.
            while !rest.ends_with(b"0\r\n\r\n") {
                let n = s.read(&mut buf).await.expect("read");
                assert!(n > 0, "the connection closed mid-body");
                rest.extend_from_slice(&buf[..n]);
            }
            let mut body = Vec::new();
            let mut at = 0;
            loop {
                let line_end = at + rest[at..].windows(2).position(|w| w == b"\r\n").unwrap();
                let size = usize::from_str_radix(
                    std::str::from_utf8(&rest[at..line_end]).unwrap().trim(),
                    16,
                )
                .unwrap();
                if size == 0 {
                    break body;
                }
                body.extend_from_slice(&rest[line_end + 2..line_end + 2 + size]);
                at = line_end + 2 + size + 2;
            }
        };
        (status, String::from_utf8(body).expect("UTF-8 body"))
    })
    .await
    .expect("a response within 10 s")
}

/// Sends an `echo` call on `s` and checks its answer.
async fn echo(s: &mut TcpStream, addr: SocketAddr, id: u64, text: &str) {
    s.write_all(&call_request(addr, id, "echo", json!({"text": text}), ""))
        .await
        .unwrap();
    let (status, body) = read_response(s).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(&format!("\"text\":\"{text}\"")), "{body}");
}

/// A gateway with `listen` keys, and one connection to it that has made one `echo` call.
async fn after_one_call(listen: &str) -> (Env, SocketAddr, TcpStream) {
    let env = rest_env(listen).await;
    let addr = env.running.addr;
    let mut s = TcpStream::connect(addr).await.unwrap();
    echo(&mut s, addr, 1, "first").await;
    (env, addr, s)
}

fn at_rest(env: &Env) -> f64 {
    metric(&env.gw, "mrtr_gateway_connections_at_rest", &[])
}

/// A quiet connection goes to rest, and its next request is served on the same socket; with
/// `idle_release_after = "0s"` it never rests.
#[tokio::test]
async fn a_quiet_connection_rests_and_serves_its_next_request() {
    let (env, addr, mut s) = after_one_call("idle_release_after = \"200ms\"").await;
    assert!(
        eventually(Duration::from_secs(5), || at_rest(&env) == 1.0).await,
        "the connection went to rest"
    );
    echo(&mut s, addr, 2, "after").await;
    // Quiet again: at rest again, and served again.
    assert!(eventually(Duration::from_secs(5), || at_rest(&env) == 1.0).await);
    echo(&mut s, addr, 3, "again").await;
    drop(s);
    assert!(eventually(Duration::from_secs(5), || at_rest(&env) == 0.0).await);

    let (never, addr, mut s) = after_one_call("idle_release_after = \"0s\"").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(at_rest(&never), 0.0);
    echo(&mut s, addr, 2, "after").await;
}

/// A request whose first bytes came before the rest (and the rest of it after) is served
/// whole, and the connection stays usable.
#[tokio::test]
async fn a_request_split_across_the_rest_is_served_whole() {
    let (_env, addr, mut s) = after_one_call("idle_release_after = \"200ms\"").await;
    let request = call_request(addr, 2, "echo", json!({"text": "split"}), "");
    let (early, late) = request.split_at(40);
    s.write_all(early).await.unwrap();
    // Long enough for several rest attempts with the head half-read.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    s.write_all(late).await.unwrap();
    let (status, body) = read_response(&mut s).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"text\":\"split\""), "{body}");
    echo(&mut s, addr, 3, "third").await;
}

/// A head trickled in one byte at a time after a rest is closed at the header deadline that
/// started when the connection went quiet, not one that starts when the rest ends.
#[tokio::test]
async fn a_trickled_head_is_closed_at_the_deadline_that_began_when_it_went_quiet() {
    let (env, addr, mut s) =
        after_one_call("idle_release_after = \"200ms\"\nheader_read_timeout = \"3s\"").await;
    let quiet = Instant::now();
    assert!(eventually(Duration::from_secs(2), || at_rest(&env) == 1.0).await);
    // At rest for most of the deadline, then the head starts and never ends.
    tokio::time::sleep(Duration::from_millis(2500).saturating_sub(quiet.elapsed())).await;
    let request = call_request(addr, 2, "echo", json!({"text": "never"}), "");
    let mut closed_after = None;
    for byte in request.iter().take(60) {
        if s.write_all(&[*byte]).await.is_err() {
            closed_after = Some(quiet.elapsed());
            break;
        }
        let mut buf = [0u8; 64];
        match tokio::time::timeout(Duration::from_millis(150), s.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => {
                closed_after = Some(quiet.elapsed());
                break;
            }
            Ok(Ok(_)) => panic!("no response is due"),
            Err(_) => {}
        }
    }
    let closed_after = closed_after.expect("the connection was closed while the head trickled");
    println!("closed {closed_after:?} after the connection went quiet");
    // 3 s after it went quiet; a deadline restarted at the rest's end would close it at 5.5 s.
    assert!(
        closed_after < Duration::from_millis(4500),
        "{closed_after:?}"
    );
    assert_eq!(
        metric(
            &env.gw,
            "mrtr_gateway_limit_hits_total",
            &[("limit", "header_read_timeout")]
        ),
        1.0
    );
}

/// A `Connection: close` response still flushing when the connection goes quiet ends with
/// the connection closed: hyper closes it to end the exchange, and it is not rested.
#[tokio::test]
async fn a_connection_close_response_still_flushing_is_closed_not_rested() {
    let env = rest_env("idle_release_after = \"200ms\"").await;
    let addr = env.running.addr;
    // A small receive buffer, and nothing read for a while: the response (3 MB) is handed to
    // hyper whole but cannot be flushed until the client reads.
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut s = socket.connect(addr).await.unwrap();
    const SIZE: u64 = 3_000_000;
    s.write_all(&call_request(
        addr,
        1,
        "big",
        json!({"size": SIZE}),
        "connection: close\r\n",
    ))
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut got = Vec::new();
    let mut buf = vec![0u8; 65536];
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    let head = String::from_utf8_lossy(&got[..got.len().min(400)]).into_owned();
    let got = got.len();
    assert!(
        end.is_ok(),
        "the connection was left open after its response ({got} bytes read)"
    );
    assert!(
        got as u64 > SIZE,
        "the whole response arrived: {got} bytes: {head}"
    );
    assert_eq!(at_rest(&env), 0.0);
}

/// Over TLS: the connection rests (the TLS session kept) and its next request is served on
/// the same TLS connection.
#[tokio::test]
async fn a_tls_connection_rests_and_serves_its_next_request() {
    use http_body_util::{BodyExt, Full};

    let legacy = LegacyServer::start(
        LegacyServerConfig::default(),
        super::with_echo(Handlers::new()),
    )
    .await
    .unwrap();
    let (gw, running, ca, _dir) =
        crate::support::tls::tls_gateway(&legacy.url(), "idle_release_after = \"200ms\"").await;
    let stream = crate::support::tls::connect(running.addr, &ca.pem(), None)
        .await
        .unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let client = ModernClient::new("https://localhost/mcp");
    for (id, text) in [(1, "before"), (2, "after")] {
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": client.params_with_meta(json!({"name": "echo", "arguments": {"text": text}}))});
        let mut req = http::Request::builder()
            .method("POST")
            .uri("/mcp")
            .header("host", "localhost")
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        for (name, value) in &ModernClient::routing_headers(&body) {
            req = req.header(name, value);
        }
        let resp = sender
            .send_request(
                req.body(Full::new(bytes::Bytes::from(
                    serde_json::to_vec(&body).unwrap(),
                )))
                .unwrap(),
            )
            .await
            .unwrap_or_else(|e| panic!("call {id} on the same TLS connection: {e}"));
        assert_eq!(resp.status(), 200);
        let got = resp.into_body().collect().await.unwrap().to_bytes();
        let got = String::from_utf8_lossy(&got);
        assert!(got.contains(&format!("\"text\":\"{text}\"")), "{got}");
        if id == 1 {
            let rested = || metric(&gw, "mrtr_gateway_connections_at_rest", &[]) == 1.0;
            assert!(
                eventually(Duration::from_secs(5), rested).await,
                "the TLS connection rested"
            );
        }
    }
    running.stop().await;
    legacy.shutdown().await;
}

/// HTTP/2 over TLS (ALPN `h2`): calls sent at once on one connection are each answered, with
/// bodies larger than a TLS record both ways, and the connection serves again after a pause.
#[tokio::test]
async fn http2_over_tls_serves_concurrent_calls_on_one_connection() {
    let legacy = LegacyServer::start(
        LegacyServerConfig::default(),
        super::with_echo(Handlers::new()),
    )
    .await
    .unwrap();
    let (_gw, running, ca, _dir) = crate::support::tls::tls_gateway(&legacy.url(), "").await;
    let stream = crate::support::tls::connect_alpn(running.addr, &ca.pem(), None, b"h2")
        .await
        .unwrap();
    let (client, conn) = h2::client::handshake(stream).await.expect("h2 handshake");
    tokio::spawn(conn);
    let call = |client: h2::client::SendRequest<bytes::Bytes>, id: u64, text: String| async move {
        let call = json!({
            "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": ModernClient::new("https://localhost/").params_with_meta(json!({"name": "echo", "arguments": {"text": text}})),
        });
        let body = serde_json::to_vec(&call).unwrap();
        let mut req = http::Request::post("https://localhost/mcp")
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("content-length", body.len().to_string());
        for (name, value) in ModernClient::routing_headers(&call) {
            req = req.header(name.expect("one value per header"), value);
        }
        let mut client = client.ready().await.unwrap();
        let (resp, mut send) = client
            .send_request(req.body(()).unwrap(), false)
            .expect("stream opens");
        send.send_data(bytes::Bytes::from(body), true).unwrap();
        let resp = resp.await.expect("a response");
        let status = resp.status();
        let mut body = resp.into_body();
        let mut got = Vec::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.unwrap();
            let _ = body.flow_control().release_capacity(chunk.len());
            got.extend_from_slice(&chunk);
        }
        (status, String::from_utf8_lossy(&got).into_owned(), text)
    };
    for round in 0..2u64 {
        let calls: Vec<_> = (0..8u64)
            .map(|i| {
                // 20 KB of text: more than one TLS record each way.
                let text = format!("{round}-{i}-{}", "x".repeat(20_000));
                tokio::spawn(call(client.clone(), round * 100 + i, text))
            })
            .collect();
        for c in calls {
            let (status, got, text) = c.await.unwrap();
            assert_eq!(status, 200, "{got}");
            assert!(
                got.contains(&format!("\"text\":\"{text}\"")),
                "the echo of {} bytes came back whole",
                text.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    running.stop().await;
    legacy.shutdown().await;
}

/// Reads from `s` until it ends: `true` when the gateway closed it within 5 s (well before the
/// listener's 10 s drain deadline; past that deadline nothing would close it but its idle
/// timeout).
async fn closed_within_5s(s: &mut TcpStream) -> bool {
    tokio::time::timeout(Duration::from_secs(5), async {
        let mut buf = [0u8; 1024];
        while let Ok(n) = s.read(&mut buf).await
            && n > 0
        {}
    })
    .await
    .is_ok()
}

/// Shutdown reaches every open connection, whatever it is doing: an HTTP/1 connection hyper
/// serves, one at rest, and an HTTP/2 connection are each closed at once. Each connection
/// watches a token of its own (a child of the listener's shutdown token), not the shutdown
/// token itself, which every wake of every connection would otherwise lock.
#[tokio::test]
async fn shutdown_closes_kept_alive_connections_served_at_rest_and_over_http2() {
    for (listen, rests) in [
        ("idle_release_after = \"0s\"", false),
        ("idle_release_after = \"100ms\"", true),
    ] {
        let (env, _addr, mut s) = after_one_call(listen).await;
        if rests {
            assert!(eventually(Duration::from_secs(5), || at_rest(&env) == 1.0).await);
        }
        env.running.shutdown.cancel();
        assert!(
            closed_within_5s(&mut s).await,
            "shutdown did not close a kept-alive connection ({listen})"
        );
    }

    let env = rest_env("").await;
    let addr = env.running.addr;
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.expect("h2 handshake");
    let conn = tokio::spawn(conn);
    let mut client = client.ready().await.unwrap();
    let call = json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": ModernClient::new("http://unused/").params_with_meta(json!({"name": "echo", "arguments": {"text": "h2"}})),
    });
    let body = serde_json::to_vec(&call).unwrap();
    let mut req = http::Request::post(format!("http://{addr}/mcp"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("content-length", body.len().to_string());
    for (name, value) in ModernClient::routing_headers(&call) {
        req = req.header(name.expect("one value per header"), value);
    }
    let req = req.body(()).unwrap();
    let (resp, mut send) = client.send_request(req, false).expect("stream opens");
    send.send_data(bytes::Bytes::from(body), true).unwrap();
    let resp = resp.await.expect("a response");
    assert_eq!(resp.status(), 200, "the HTTP/2 connection serves a request");
    env.running.shutdown.cancel();
    let ended = tokio::time::timeout(Duration::from_secs(5), conn).await;
    assert!(
        ended.is_ok(),
        "shutdown did not close a kept-alive HTTP/2 connection"
    );
}
