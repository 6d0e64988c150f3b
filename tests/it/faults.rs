//! Fault harness: the in-repo legacy server misbehaves on demand (failed `initialize`, broken,
//! oversized, cut and hanging call streams, closed GET streams, a crash mid-call), and
//! clients misbehave (one disconnects mid-stream, one never reads its response).
//!
//! For each fault the test checks that the documented error (docs/architecture.md, "Error
//! mapping") reaches the client within its timeout, that the gateway stays healthy (a
//! normal call right after succeeds), and that nothing leaks: the gateway's
//! `legacy_sessions_active` and `active_requests` gauges return to 0, the legacy server has
//! no live session left, and the runtime's task count does not grow when the fault repeats
//! (the count after the third repetition is at most the count after the first, so
//! connection pools that fill once do not count as growth). Upstream timeouts are short so
//! each test stays well under ten seconds.
//!
//! Hostile clients at the front edge (stalled bodies, silent connections, connection caps, the
//! admin listener, per-principal quotas on long-lived streams and parked stdio calls) are in
//! `faults/edge.rs`.

mod edge;
mod rest;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::*;
use bytes::Bytes;
use http::{Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use mrtr_gateway::config::Config;
use mrtr_testkit::client::{Exchange, ModernClient};
use mrtr_testkit::legacy_server::{CallStreamFault, Handlers, LegacyServer, LegacyServerConfig};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::sync::Notify;

/// Upstream limits every fault test runs with, unless it overrides one.
#[derive(Clone, Copy)]
struct Upstream {
    response_timeout: &'static str,
    idle_timeout: &'static str,
    call_timeout: &'static str,
    max_event_bytes: usize,
}

const SHORT: Upstream = Upstream {
    response_timeout: "1s",
    idle_timeout: "1s",
    call_timeout: "3s",
    max_event_bytes: 1 << 20,
};

fn fault_config(upstream: &str, u: Upstream) -> Config {
    fault_config_with(upstream, u, "")
}

/// [`fault_config`] with more sections (`extra`, TOML).
fn fault_config_with(upstream: &str, u: Upstream, extra: &str) -> Config {
    let text = format!(
        "[listen]\naddr = \"127.0.0.1:0\"\n\
         [upstream]\nurl = \"{upstream}\"\nconnect_timeout = \"1s\"\nresponse_timeout = \"{}\"\n\
         idle_timeout = \"{}\"\ncall_timeout = \"{}\"\nmax_event_bytes = {}\n\
         [state]\n[[state.keys]]\nid = \"k1\"\nsecret = \"{TEST_KEY}\"\n{extra}",
        u.response_timeout, u.idle_timeout, u.call_timeout, u.max_event_bytes
    );
    Config::from_toml_str(&text, &[], None).unwrap_or_else(|e| panic!("fault config: {e}\n{text}"))
}

/// `echo` (the healthy call) plus the test's own tools.
fn with_echo(h: Handlers) -> Handlers {
    h.tool(
        "echo",
        "returns its text",
        json!({"type": "object"}),
        |_, args| async move { Ok(tool_text(args["text"].as_str().unwrap_or_default())) },
    )
}

async fn fault_env_with(server: LegacyServerConfig, h: Handlers, u: Upstream) -> Env {
    let legacy = LegacyServer::start(server, with_echo(h))
        .await
        .expect("legacy server starts");
    let cfg = fault_config(&legacy.url(), u);
    let env = Env::start(legacy, cfg).await;
    // Warm the discover cache so a failing `initialize` hits the call, not routing.
    healthy(&env).await;
    env
}

async fn fault_env(h: Handlers, u: Upstream) -> Env {
    fault_env_with(LegacyServerConfig::default(), h, u).await
}

async fn call(env: &Env, tool: &str, params: Value) -> Exchange {
    let mut p = params;
    p["name"] = json!(tool);
    env.client()
        .request("tools/call", p)
        .await
        .expect("the gateway answers")
}

/// A normal call succeeds.
async fn healthy(env: &Env) {
    let ex = call(env, "echo", json!({"arguments": {"text": "still fine"}})).await;
    assert_eq!(ex.status, StatusCode::OK, "{:?}", ex.message);
    assert_eq!(ex.result_type(), Some("complete"), "{:?}", ex.message);
    assert_eq!(text(ex.result().unwrap()), "still fine");
}

/// Asserts an upstream failure as the error table documents it: the client hears `told` (the
/// class of failure); `logged`, what the legacy server did, is only in the WARN line carrying
/// the request id the client was given.
fn assert_upstream_error(ex: &Exchange, status: u16, told: &str, logged: Option<&str>) {
    assert_eq!(ex.status.as_u16(), status, "{:?}", ex.message);
    assert_eq!(ex.error_code(), Some(-32603), "{:?}", ex.message);
    let message = ex.error().unwrap()["message"].as_str().unwrap_or_default();
    assert!(message.contains(told), "expected {told:?} in {message:?}");
    if let Some(detail) = logged {
        crate::support::logs::assert_detail_logged_not_told(ex.error().unwrap(), detail);
    }
}

fn tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// Waits (bounded) until neither side holds anything for finished calls.
async fn assert_quiet(gw: &mrtr_gateway::gateway::Gateway, legacy: &LegacyServer) {
    // Warm sessions are kept on purpose; anything else left would be a leak.
    gw.sessions.pool().clear().await;
    let quiet = eventually(Duration::from_secs(5), || {
        metric(gw, "mrtr_gateway_legacy_sessions_active", &[]) == 0.0
            && metric(gw, "mrtr_gateway_active_requests", &[]) == 0.0
    })
    .await;
    assert!(
        quiet,
        "gateway still holds legacy sessions {} / active requests {}",
        metric(gw, "mrtr_gateway_legacy_sessions_active", &[]),
        metric(gw, "mrtr_gateway_active_requests", &[])
    );
    let stats = legacy.stats_handle();
    assert!(
        stats
            .wait_until(|s| s.sessions_live() == 0, Duration::from_secs(5))
            .await,
        "the legacy server still has {} live sessions",
        stats.sessions_live()
    );
}

/// Tracks the task count across repetitions of a fault.
struct TaskCount {
    after_first: Option<usize>,
}

impl TaskCount {
    fn new() -> Self {
        TaskCount { after_first: None }
    }

    async fn check(&mut self) {
        match self.after_first {
            None => self.after_first = Some(tasks()),
            Some(base) => assert!(
                eventually(Duration::from_secs(5), || tasks() <= base).await,
                "tasks grew from {base} to {} while repeating the fault",
                tasks()
            ),
        }
    }
}

/// Runs `fault` three times; after each: a normal call succeeds and nothing is held.
async fn repeat_fault(env: &Env, mut fault: impl AsyncFnMut(usize)) {
    let mut count = TaskCount::new();
    for i in 0..3 {
        fault(i).await;
        healthy(env).await;
        assert_quiet(&env.gw, &env.legacy).await;
        count.check().await;
    }
}

#[tokio::test]
async fn a_failing_initialize_is_a_502_naming_it() {
    let env = fault_env(Handlers::new(), SHORT).await;
    repeat_fault(&env, async |_| {
        // A warm session would need no initialize.
        env.gw.sessions.pool().clear().await;
        env.legacy.faults().fail_initialize(Some(500));
        let ex = call(&env, "echo", json!({"arguments": {"text": "x"}})).await;
        env.legacy.faults().fail_initialize(None);
        assert_upstream_error(
            &ex,
            502,
            "refused to initialize",
            Some("legacy initialize failed"),
        );
    })
    .await;
    assert_metric!(
        &env.gw,
        "legacy_sessions_failed_total",
        &[("reason", "upstream_initialize_failed")],
        3.0
    );
    env.stop().await;
}

#[tokio::test]
async fn a_malformed_event_breaks_the_call_with_a_502() {
    let env = fault_env(Handlers::new(), SHORT).await;
    repeat_fault(&env, async |_| {
        env.legacy
            .faults()
            .next_call_stream(CallStreamFault::MalformedEvent);
        let ex = call(&env, "echo", json!({"arguments": {"text": "x"}})).await;
        assert_upstream_error(&ex, 502, "without a response", Some("malformed JSON"));
    })
    .await;
    env.stop().await;
}

#[tokio::test]
async fn an_event_over_max_event_bytes_breaks_the_call_with_a_502() {
    let u = Upstream {
        max_event_bytes: 16 * 1024,
        ..SHORT
    };
    let env = fault_env(Handlers::new(), u).await;
    repeat_fault(&env, async |_| {
        env.legacy
            .faults()
            .next_call_stream(CallStreamFault::OversizeEvent(64 * 1024));
        let ex = call(&env, "echo", json!({"arguments": {"text": "x"}})).await;
        assert_upstream_error(&ex, 502, "without a response", Some("exceeded 16384 bytes"));
    })
    .await;
    assert_metric!(
        &env.gw,
        "rejections_total",
        &[("reason", "upstream_stream_broken"), ("fault", "upstream")],
        3.0
    );
    env.stop().await;
}

#[tokio::test]
async fn a_stream_closed_after_its_headers_is_a_502() {
    let env = fault_env(Handlers::new(), SHORT).await;
    repeat_fault(&env, async |_| {
        env.legacy
            .faults()
            .next_call_stream(CallStreamFault::CloseAfterHeaders);
        let ex = call(&env, "echo", json!({"arguments": {"text": "x"}})).await;
        assert_upstream_error(&ex, 502, "without a response", None);
    })
    .await;
    env.stop().await;
}

/// A tool that reports progress, then answers.
fn progress_then_done() -> Handlers {
    Handlers::new().tool(
        "progress_then_done",
        "one progress notification, then a result",
        json!({"type": "object"}),
        |ctx, _| async move {
            ctx.progress(0.5, Some(1.0), Some("half"));
            Ok(tool_text("done"))
        },
    )
}

#[tokio::test]
async fn a_stream_cut_after_its_first_event_ends_the_sse_response_with_an_error() {
    let env = fault_env(progress_then_done(), SHORT).await;
    repeat_fault(&env, async |_| {
        env.legacy
            .faults()
            .next_call_stream(CallStreamFault::CloseAfterFirstEvent);
        let ex = call(
            &env,
            "progress_then_done",
            json!({"arguments": {}, "_meta": {"progressToken": "p"}}),
        )
        .await;
        // The progress came first, so the response is already an SSE stream (HTTP 200); the
        // failure is its final message.
        assert!(ex.streamed, "{:?}", ex.raw_body);
        assert_eq!(ex.status, StatusCode::OK);
        assert_eq!(ex.notifications.len(), 1, "{:?}", ex.notifications);
        assert_eq!(ex.notifications[0]["method"], "notifications/progress");
        assert_eq!(ex.error_code(), Some(-32603), "{:?}", ex.message);
        assert!(
            ex.error().unwrap()["message"]
                .as_str()
                .unwrap()
                .contains("without a response")
        );
    })
    .await;
    env.stop().await;
}

#[tokio::test]
async fn a_hanging_stream_fails_at_the_idle_timeout() {
    let u = Upstream {
        idle_timeout: "400ms",
        call_timeout: "5s",
        ..SHORT
    };
    let env = fault_env(Handlers::new(), u).await;
    repeat_fault(&env, async |_| {
        env.legacy
            .faults()
            .next_call_stream(CallStreamFault::HangAfterHeaders);
        let t0 = Instant::now();
        let ex = call(&env, "echo", json!({"arguments": {"text": "x"}})).await;
        // The error table has no row for a silent stream; today it is a broken stream (502),
        // not "too slow" (504).
        assert_upstream_error(&ex, 502, "without a response", Some("sent nothing for"));
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    })
    .await;
    env.stop().await;
}

#[tokio::test]
async fn a_hang_past_call_timeout_is_a_504() {
    let u = Upstream {
        idle_timeout: "10s",
        call_timeout: "500ms",
        ..SHORT
    };
    let env = fault_env(Handlers::new(), u).await;
    repeat_fault(&env, async |_| {
        env.legacy
            .faults()
            .next_call_stream(CallStreamFault::HangAfterHeaders);
        let t0 = Instant::now();
        let ex = call(&env, "echo", json!({"arguments": {"text": "x"}})).await;
        assert_upstream_error(&ex, 504, "upstream.call_timeout", None);
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    })
    .await;
    assert_metric!(
        &env.gw,
        "rejections_total",
        &[("reason", "call_timeout")],
        3.0
    );
    env.stop().await;
}

#[tokio::test]
async fn closing_the_get_streams_mid_call_does_not_break_the_call() {
    let go = Arc::new(Notify::new());
    let tool_go = go.clone();
    let h = Handlers::new().tool(
        "wait_then_echo",
        "waits for the test, then answers",
        json!({"type": "object"}),
        move |_, _| {
            let go = tool_go.clone();
            async move {
                go.notified().await;
                Ok(tool_text("after the GET stream closed"))
            }
        },
    );
    let env = fault_env(h, SHORT).await;
    repeat_fault(&env, async |i| {
        let client = env.client();
        let pending = tokio::spawn(async move {
            client
                .request(
                    "tools/call",
                    json!({"name": "wait_then_echo", "arguments": {}}),
                )
                .await
        });
        let stats = env.legacy.stats_handle();
        assert!(
            stats
                .wait_until(
                    |s| s.tool_starts("wait_then_echo") == i as u64 + 1
                        && s.get_streams_open() == 1,
                    Duration::from_secs(2)
                )
                .await
        );
        assert_eq!(env.legacy.faults().close_all_get_streams(), 1);
        go.notify_one();
        let ex = pending.await.unwrap().expect("the gateway answers");
        assert_eq!(ex.result_type(), Some("complete"), "{:?}", ex.message);
        assert_eq!(text(ex.result().unwrap()), "after the GET stream closed");
    })
    .await;
    env.stop().await;
}

/// A tool that waits until it is cancelled.
fn waits_forever() -> Handlers {
    Handlers::new().tool(
        "wait",
        "waits until cancelled",
        json!({"type": "object"}),
        |ctx, _| async move {
            ctx.cancelled().await;
            Ok(tool_text("cancelled"))
        },
    )
}

/// A legacy server on `addr` (a restart on the same port).
async fn legacy_on(addr: SocketAddr, h: Handlers) -> LegacyServer {
    let config = LegacyServerConfig {
        bind: addr,
        ..Default::default()
    };
    LegacyServer::start(config, with_echo(h))
        .await
        .expect("the legacy server restarts on its port")
}

#[tokio::test]
async fn a_legacy_server_killed_mid_call_is_a_502_and_its_restart_is_used() {
    let mut legacy = LegacyServer::start(LegacyServerConfig::default(), with_echo(waits_forever()))
        .await
        .unwrap();
    let addr = legacy.addr();
    let (gw, running, url) = start_gateway(fault_config(&legacy.url(), SHORT)).await;
    let client = ModernClient::new(&url);
    let mut count = TaskCount::new();
    for _ in 0..3 {
        let c = ModernClient::new(&url);
        let pending = tokio::spawn(async move {
            c.request("tools/call", json!({"name": "wait", "arguments": {}}))
                .await
        });
        let stats = legacy.stats_handle();
        assert!(
            stats
                .wait_until(|s| s.tool_starts("wait") == 1, Duration::from_secs(2))
                .await
        );
        let t0 = Instant::now();
        legacy.shutdown().await;
        let ex = pending.await.unwrap().expect("the gateway answers");
        assert_upstream_error(&ex, 502, "without a response", None);
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
        // While it is down: a clear 502 at once.
        let down = client
            .request(
                "tools/call",
                json!({"name": "echo", "arguments": {"text": "x"}}),
            )
            .await
            .unwrap();
        assert_upstream_error(
            &down,
            502,
            "could not be reached",
            Some("cannot reach the legacy server"),
        );
        legacy = legacy_on(addr, waits_forever()).await;
        let ex = client
            .request(
                "tools/call",
                json!({"name": "echo", "arguments": {"text": "back"}}),
            )
            .await
            .unwrap();
        assert_eq!(ex.result_type(), Some("complete"), "{:?}", ex.message);
        assert_quiet(&gw, &legacy).await;
        count.check().await;
    }
    running.stop().await;
    legacy.shutdown().await;
}

#[tokio::test]
async fn a_parked_call_whose_server_dies_is_evicted_and_its_retry_replays() {
    let h = Handlers::new().tool(
        "greet",
        "asks a name",
        json!({"type": "object"}),
        |ctx, _| async move {
            let a = ctx.elicit_form("Your name?", form("name")).await?;
            Ok(tool_text(format!(
                "Hello, {}",
                a["content"]["name"].as_str().unwrap_or("?")
            )))
        },
    );
    let mut legacy = LegacyServer::start(LegacyServerConfig::default(), with_echo(h.clone()))
        .await
        .unwrap();
    let addr = legacy.addr();
    let (gw, running, url) = start_gateway(fault_config(&legacy.url(), SHORT)).await;
    let client = ModernClient::new(&url);
    let mut count = TaskCount::new();
    for i in 0..3 {
        let params = json!({"name": "greet", "arguments": {}});
        let first = client.request("tools/call", params.clone()).await.unwrap();
        assert_eq!(first.result_type(), Some("input_required"));
        assert_eq!(metric(&gw, "mrtr_gateway_parked_calls", &[]), 1.0);
        legacy.shutdown().await;
        // The sweeper notices the ended stream and releases the parked call.
        assert!(
            eventually(Duration::from_secs(3), || {
                metric(&gw, "mrtr_gateway_parked_calls", &[]) == 0.0
                    && metric(&gw, "mrtr_gateway_legacy_sessions_active", &[]) == 0.0
            })
            .await
        );
        assert_metric!(
            &gw,
            "parked_evictions_total",
            &[("reason", "stream_ended")],
            i as f64 + 1.0
        );
        legacy = legacy_on(addr, h.clone()).await;
        let r = first.result().unwrap();
        let key = r["inputRequests"]
            .as_object()
            .unwrap()
            .keys()
            .next()
            .unwrap();
        let mut retry = params.clone();
        retry["inputResponses"] = json!({key: {"action": "accept", "content": {"name": "Ada"}}});
        retry["requestState"] = r["requestState"].clone();
        let done = client.request("tools/call", retry).await.unwrap();
        assert_eq!(done.result_type(), Some("complete"), "{:?}", done.message);
        assert_eq!(text(done.result().unwrap()), "Hello, Ada");
        assert_quiet(&gw, &legacy).await;
        count.check().await;
    }
    assert_eq!(
        metric(&gw, "mrtr_gateway_retries_total", &[("path", "replayed")]),
        3.0
    );
    running.stop().await;
    legacy.shutdown().await;
}

/// A tool that reports progress, then waits until cancelled.
fn progress_then_wait() -> Handlers {
    Handlers::new().tool(
        "slow",
        "progress, then waits until cancelled",
        json!({"type": "object"}),
        |ctx, _| async move {
            ctx.progress(0.0, Some(1.0), Some("started"));
            ctx.cancelled().await;
            Ok(tool_text("cancelled"))
        },
    )
}

/// The bytes of a modern `tools/call` POST, headers included.
fn modern_post(tool: &str, meta: Value) -> (Value, http::HeaderMap) {
    let c = ModernClient::new("http://127.0.0.1:1/mcp");
    let body = json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": c.params_with_meta(json!({"name": tool, "arguments": {}, "_meta": meta})),
    });
    let headers = ModernClient::routing_headers(&body);
    (body, headers)
}

#[tokio::test]
async fn a_client_that_disconnects_mid_stream_cancels_the_legacy_call() {
    let env = fault_env(progress_then_wait(), SHORT).await;
    repeat_fault(&env, async |i| {
        let raw = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let (body, headers) = modern_post("slow", json!({"progressToken": "p"}));
        let mut req = Request::post(&env.url)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json, text/event-stream")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        req.headers_mut().extend(headers);
        let resp = raw.request(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()[header::CONTENT_TYPE], "text/event-stream");
        let mut stream = resp.into_body();
        let first = stream.frame().await.unwrap().unwrap().into_data().unwrap();
        assert!(
            String::from_utf8_lossy(&first).contains("notifications/progress"),
            "{first:?}"
        );
        // Go away in the middle of the stream.
        drop(stream);
        drop(raw);
        let stats = env.legacy.stats_handle();
        assert!(
            stats
                .wait_until(|s| s.cancellations().len() == i + 1, Duration::from_secs(3))
                .await,
            "the legacy call was not cancelled: {:?}",
            stats.cancellations()
        );
    })
    .await;
    assert_eq!(env.legacy.stats().tool_finishes("slow"), 0);
    env.stop().await;
}

#[tokio::test]
async fn a_client_that_never_reads_does_not_hold_the_legacy_call_past_call_timeout() {
    // About 32 MB of progress: far more than loopback socket buffers hold.
    let h = Handlers::new().tool(
        "flood",
        "streams a lot of progress, then answers",
        json!({"type": "object"}),
        |ctx, _| async move {
            let chunk = "x".repeat(64 * 1024);
            for i in 0..512 {
                ctx.progress(i as f64, Some(512.0), Some(&chunk));
            }
            Ok(tool_text("flooded"))
        },
    );
    let u = Upstream {
        call_timeout: "1s",
        idle_timeout: "5s",
        ..SHORT
    };
    let env = fault_env(h, u).await;
    let (body, headers) = modern_post("flood", json!({"progressToken": "p"}));
    let body = body.to_string();
    let addr = env
        .url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let mut request = format!(
        "POST /mcp HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         accept: application/json, text/event-stream\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in &headers {
        request.push_str(&format!("{k}: {}\r\n", v.to_str().unwrap()));
    }
    request.push_str("\r\n");
    request.push_str(&body);
    let mut socket = tokio::net::TcpStream::connect(&addr).await.unwrap();
    socket.write_all(request.as_bytes()).await.unwrap();
    // Never read. The tool runs and the gateway starts streaming into a socket that fills up.
    let stats = env.legacy.stats_handle();
    assert!(
        stats
            .wait_until(|s| s.tool_finishes("flood") == 1, Duration::from_secs(3))
            .await
    );
    // Others are still served meanwhile (their warm session is put away, not counted below).
    healthy(&env).await;
    env.gw.sessions.pool().clear().await;
    // call_timeout bounds the time a request spends upstream: the legacy call must be let go
    // even though the client keeps its connection open.
    let released = eventually(Duration::from_secs(4), || {
        metric(&env.gw, "mrtr_gateway_legacy_sessions_active", &[]) == 0.0
    })
    .await;
    assert!(
        released,
        "the gateway still holds the legacy session of a client that never reads ({} s after call_timeout)",
        4
    );
    assert!(
        stats
            .wait_until(|s| s.sessions_live() == 0, Duration::from_secs(3))
            .await
    );
    // Once the client goes away, so does its request.
    drop(socket);
    assert_quiet(&env.gw, &env.legacy).await;
    healthy(&env).await;
    env.stop().await;
}

// ---- client faults on the retry path -------------------------------------------------------

/// A tool that asks twice; the first answer is carried in the state of the second round.
fn asks_twice() -> Handlers {
    Handlers::new().tool(
        "two_questions",
        "elicits `first`, then `second`",
        json!({"type": "object"}),
        |ctx, _| async move {
            let first = ctx.elicit_form("First?", form("first")).await?;
            let second = ctx.elicit_form("Second?", form("second")).await?;
            Ok(tool_text(format!(
                "{} bytes, then {}",
                first["content"]["first"].as_str().unwrap_or("").len(),
                second["content"]["second"].as_str().unwrap_or("?")
            )))
        },
    )
}

fn only_key(result: &Value) -> String {
    let requests = result["inputRequests"].as_object().unwrap();
    assert_eq!(requests.len(), 1, "{requests:?}");
    requests.keys().next().unwrap().clone()
}

/// A 900 KB answer fits the request body (1 MiB) but not the next round's requestState
/// (`state.max_bytes`, 64 KiB): that is the client's answer being too big, so it is a 413
/// naming the limit and the answer's key, counted as the client's fault, and so is every
/// duplicate of it; the gateway stays healthy.
#[tokio::test]
async fn an_answer_too_large_for_the_next_state_is_a_client_fault_naming_the_limit_and_key() {
    let env = fault_env(asks_twice(), SHORT).await;
    let c = env.client();
    let round1 = c
        .request(
            "tools/call",
            json!({"name": "two_questions", "arguments": {}}),
        )
        .await
        .unwrap();
    let first = round1.result().expect("round 1 asks").clone();
    let key = only_key(&first);
    let retry = json!({"name": "two_questions", "arguments": {},
        "requestState": first["requestState"],
        "inputResponses": {&key: {"action": "accept", "content": {"first": "x".repeat(900_000)}}}});
    let refused = c.request("tools/call", retry.clone()).await.unwrap();
    assert_eq!(refused.status.as_u16(), 413, "{:?}", refused.message);
    assert_eq!(refused.error_code(), Some(-32602));
    let error = refused.error().unwrap();
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("state.max_bytes (65536)"), "{message}");
    assert!(
        message.contains(&format!("inputResponses[{key:?}]")),
        "{message}"
    );
    assert_eq!(error["data"]["limit"], "state.max_bytes");
    assert_eq!(error["data"]["key"], key.as_str());
    assert_metric!(
        &env.gw,
        "rejections_total",
        &[("reason", "input_response_too_large"), ("fault", "client")],
        1.0
    );
    assert_metric!(
        &env.gw,
        "limit_hits_total",
        &[("limit", "state_max_bytes")],
        1.0
    );
    // A duplicate gets the same answer, and it is still the client's fault.
    let again = c.request("tools/call", retry).await.unwrap();
    assert_eq!(again.status.as_u16(), 413, "{:?}", again.message);
    assert_eq!(again.error(), refused.error());
    assert_metric!(
        &env.gw,
        "rejections_total",
        &[("reason", "duplicate_of_error"), ("fault", "client")],
        1.0
    );
    for fault in ["internal", "upstream"] {
        assert!(
            !env.gw
                .metrics
                .render()
                .lines()
                .any(|l| l.starts_with("mrtr_gateway_rejections_total")
                    && l.contains(&format!("fault=\"{fault}\""))
                    && !l.ends_with(" 0")),
            "a {fault} fault was counted:\n{}",
            env.gw.metrics.render()
        );
    }
    healthy(&env).await;
    assert_quiet(&env.gw, &env.legacy).await;
    env.stop().await;
}

/// A tool that asks for confirmation, reports progress, works for a while, then answers.
fn confirm_then_work() -> Handlers {
    Handlers::new().tool(
        "transfer",
        "asks, then works",
        json!({"type": "object"}),
        |ctx, _| async move {
            let ok = ctx.elicit_form("Transfer?", form("confirm")).await?;
            ctx.progress(1.0, Some(2.0), Some("working"));
            tokio::time::sleep(Duration::from_millis(600)).await;
            Ok(tool_text(format!(
                "transferred ({})",
                ok["content"]["confirm"].as_str().unwrap_or("?")
            )))
        },
    )
}

/// The client's connection drops in the middle of a retry that carried its answers (after
/// the first progress event). The claimed state is spent, so the call is not cancelled: it
/// finishes (the tool body runs once, nothing is cancelled upstream), and presenting the same
/// state again gets its result — "in progress" meanwhile, never "already used".
#[tokio::test]
async fn a_client_that_drops_during_a_retry_gets_its_result_on_the_next_presentation() {
    let env = fault_env(confirm_then_work(), SHORT).await;
    let c = env.client();
    let meta = json!({"progressToken": "t"});
    let round1 = c
        .request(
            "tools/call",
            json!({"name": "transfer", "arguments": {}, "_meta": meta}),
        )
        .await
        .unwrap();
    let first = round1.result().expect("round 1 asks").clone();
    let key = only_key(&first);
    let retry = json!({"name": "transfer", "arguments": {}, "_meta": meta,
        "requestState": first["requestState"],
        "inputResponses": {&key: {"action": "accept", "content": {"confirm": "yes"}}}});

    // The retry, sent by hand so that the connection can be dropped mid-stream.
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                      "params": c.params_with_meta(retry.clone())});
    let raw = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut req = Request::post(&env.url)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json, text/event-stream")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    req.headers_mut()
        .extend(ModernClient::routing_headers(&body));
    let resp = raw.request(req).await.unwrap();
    assert_eq!(resp.headers()[header::CONTENT_TYPE], "text/event-stream");
    let mut stream = resp.into_body();
    let progress = stream.frame().await.unwrap().unwrap().into_data().unwrap();
    assert!(
        String::from_utf8_lossy(&progress).contains("notifications/progress"),
        "{progress:?}"
    );
    drop(stream);
    drop(raw);

    // Presented again: "in progress" while the call finishes, then its result.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut waits = 0;
    let result = loop {
        let ex = c.request("tools/call", retry.clone()).await.unwrap();
        if let Some(r) = ex.result() {
            eprintln!("re-presented: {waits} x 409 in progress, then the result");
            break r.clone();
        }
        waits += 1;
        assert_eq!(
            (ex.status.as_u16(), ex.error_code()),
            (409, Some(-32603)),
            "only 'in progress' may come before the result: {:?}",
            ex.message
        );
        assert!(Instant::now() < deadline, "no result after 5 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(text(&result), "transferred (yes)");
    let stats = env.legacy.stats();
    assert_eq!(
        stats.tool_starts("transfer"),
        1,
        "resumed, never re-executed"
    );
    assert_eq!(stats.tool_finishes("transfer"), 1);
    assert!(
        stats.cancellations().is_empty(),
        "the claimed call was cancelled upstream: {:?}",
        stats.cancellations()
    );
    assert_eq!(
        metric(&env.gw, "mrtr_gateway_single_use_detached_runs_total", &[]),
        1.0
    );
    // The result is kept: later presentations get it too.
    let again = c.request("tools/call", retry).await.unwrap();
    assert_eq!(again.result(), Some(&result));
    healthy(&env).await;
    assert_quiet(&env.gw, &env.legacy).await;
    env.stop().await;
}

/// A replayed call runs to its end on the legacy server, whose connection then closes before
/// the response's head. The server had the whole request, so the call may have run: the
/// claim on its state keeps the error, the state presented again gets that error, and the
/// tool does not run again. (A connection that broke after the request went out once counted
/// as a server never reached; the claim was given back and the next presentation ran the tool
/// a second time.)
#[tokio::test]
async fn a_call_whose_response_is_lost_after_it_ran_is_not_run_again() {
    // The tool asks only the first time it runs; the retry's replay runs it without a
    // question, as a call the server answers after the tool has run, which lets the
    // connection close before the answer's head (`drop_next_call_response`).
    let counted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let h = Handlers::new().tool(
        "transfer",
        "asks the first time, then works",
        json!({"type": "object"}),
        move |ctx, _| {
            let first = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
            async move {
                if first {
                    ctx.elicit_form("Transfer?", form("confirm")).await?;
                }
                Ok(tool_text("transferred"))
            }
        },
    );
    let legacy = LegacyServer::start(LegacyServerConfig::default(), with_echo(h))
        .await
        .expect("legacy server starts");
    // Every retry replays (nothing parked), so the retry's call is a POST of its own.
    let cfg = fault_config_with(
        &legacy.url(),
        SHORT,
        "[parking]\ndefault_policy = \"replay\"\n",
    );
    let env = Env::start(legacy, cfg).await;
    let c = env.client();
    let round1 = call(&env, "transfer", json!({"arguments": {}})).await;
    let first = round1
        .result()
        .unwrap_or_else(|| panic!("round 1 asks: {:?}", round1.message))
        .clone();
    let key = only_key(&first);
    let retry = json!({"name": "transfer", "arguments": {},
        "requestState": first["requestState"],
        "inputResponses": {&key: {"action": "accept", "content": {"confirm": "yes"}}}});

    env.legacy.faults().drop_next_call_response();
    let lost = c.request("tools/call", retry.clone()).await.unwrap();
    let stats = env.legacy.stats();
    assert_eq!(
        stats.tool_finishes("transfer"),
        1,
        "the replay ran to its end"
    );

    let again = c.request("tools/call", retry).await.unwrap();
    assert_eq!(
        (again.status, again.error_code()),
        (lost.status, lost.error_code()),
        "presented again, the state gets the error its call ended with: {:?}",
        again.message
    );
    assert_eq!(
        stats.tool_starts("transfer"),
        2,
        "round 1 and its replay only"
    );
    assert_eq!(stats.tool_finishes("transfer"), 1, "never run again");
    // Told what failed: the response, not reaching the server.
    assert_upstream_error(
        &lost,
        502,
        "reading the upstream MCP server's response failed",
        None,
    );
    healthy(&env).await;
    env.stop().await;
}

/// The legacy server's own JSON-RPC errors are passed on; the ones that say the request was
/// wrong (an unknown tool: -32602) are counted as the client's fault, the others (an internal
/// error in a tool) as the upstream's.
#[tokio::test]
async fn legacy_errors_about_the_request_count_as_client_faults() {
    let h = Handlers::new().tool(
        "broken",
        "fails inside",
        json!({"type": "object"}),
        |_, _| async move {
            Err(mrtr_testkit::legacy_server::RpcError::internal(
                "the database is down",
            ))
        },
    );
    let env = fault_env(h, SHORT).await;
    let unknown = call(&env, "no_such_tool", json!({"arguments": {}})).await;
    assert_eq!(unknown.error_code(), Some(-32602), "{:?}", unknown.message);
    let broken = call(&env, "broken", json!({"arguments": {}})).await;
    assert_eq!(broken.error_code(), Some(-32603), "{:?}", broken.message);
    for fault in ["client", "upstream"] {
        assert_metric!(
            &env.gw,
            "rejections_total",
            &[("reason", "legacy_error"), ("fault", fault)],
            1.0,
            "{fault}"
        );
    }
    healthy(&env).await;
    env.stop().await;
}
