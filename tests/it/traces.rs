//! OpenTelemetry trace export (`[tracing]`), checked against a real OTLP/HTTP receiver
//! (`tests/peers/otlp_receiver.py`, which decodes what it gets with the official
//! opentelemetry-proto classes and prints each span as a JSON line). The gateway runs as its
//! own process, as deployed: the exporter belongs to the process's subscriber. The legacy
//! server is the Python FastMCP peer.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::support::peers::tempdir::TempDir;
use crate::support::peers::{PyLegacyServer, modern_python, repo};
use crate::support::procs::{remote_metric, spawn_gateway};
use crate::support::*;
use mrtr_testkit::client::ModernClient;

/// The caller's trace and span (a sampled W3C `traceparent`).
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";

/// The receiver process and the spans it printed so far.
struct Receiver {
    _child: Child,
    port: u16,
    lines: Arc<Mutex<Vec<Value>>>,
}

impl Receiver {
    async fn start() -> Receiver {
        let mut child = Command::new(modern_python())
            .arg(repo().join("tests/peers/otlp_receiver.py"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("the OTLP receiver starts (tests/peers/setup.sh installs its venv)");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("the receiver reports its port")
            .unwrap()
            .expect("a LISTENING line");
        let port = first
            .strip_prefix("LISTENING ")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line {first:?}"));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let v: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("receiver printed {line:?}: {e}"));
                sink.lock().unwrap().push(v);
            }
        });
        Receiver {
            _child: child,
            port,
            lines: seen,
        }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/v1/traces", self.port)
    }

    fn spans(&self) -> Vec<Value> {
        let lines = self.lines.lock().unwrap().clone();
        let errors: Vec<&Value> = lines.iter().filter(|l| l.get("error").is_some()).collect();
        assert!(
            errors.is_empty(),
            "the receiver refused exports: {errors:?}"
        );
        lines
    }

    /// The spans, once at least `n` have arrived (or whatever came within `limit`).
    async fn at_least(&self, n: usize, limit: Duration) -> Vec<Value> {
        let deadline = Instant::now() + limit;
        while self.spans().len() < n && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.spans()
    }
}

fn gateway_config(upstream: &str, tracing: &str, extra: &str) -> String {
    format!(
        "[upstream]\nurl = \"{upstream}\"\n[log]\nformat = \"json\"\n[[state.keys]]\nid = \"k1\"\nsecret = \"{TEST_KEY}\"\n[tracing]\n{tracing}\n{extra}"
    )
}

fn traced_client(url: &str) -> ModernClient {
    let mut c = ModernClient::new(url);
    c.headers = headers(&[("traceparent", &format!("00-{TRACE_ID}-{PARENT_ID}-01"))]);
    c
}

fn of_kind<'a>(spans: &'a [Value], kind: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["kind"] == kind).collect()
}

fn attr<'a>(span: &'a Value, key: &str) -> &'a Value {
    &span["attributes"][key]
}

/// The client span whose parent is `server`.
fn child_of<'a>(spans: &'a [Value], server: &Value) -> &'a Value {
    let children: Vec<&Value> = of_kind(spans, "SPAN_KIND_CLIENT")
        .into_iter()
        .filter(|c| c["parent_span_id"] == server["span_id"])
        .collect();
    assert_eq!(
        children.len(),
        1,
        "one legacy call under {server}: {spans:#?}"
    );
    children[0]
}

#[tokio::test]
async fn a_two_round_call_is_one_trace_under_the_callers_traceparent() {
    let receiver = Receiver::start().await;
    let legacy = PyLegacyServer::start(&[]).await;
    let dir = TempDir::new("mrtr-traces");
    let cfg = gateway_config(
        &legacy.url(),
        &format!(
            "otlp_endpoint = \"{}\"\nexport_interval = \"100ms\"",
            receiver.endpoint()
        ),
        "",
    );
    let (_gw, url, admin) = spawn_gateway(&cfg, dir.path(), "traced").await;

    let (rounds, done) = greet_flow(&traced_client(&url), 3).await;
    assert_eq!(rounds.len(), 1, "greet asks once");
    assert_eq!(text(done.result().unwrap()), "Hello, name-answer!");

    // Two requests, each a server span with its legacy call under it.
    let spans = receiver.at_least(4, Duration::from_secs(20)).await;
    let mut servers = of_kind(&spans, "SPAN_KIND_SERVER");
    assert_eq!(servers.len(), 2, "{spans:#?}");
    servers.sort_by_key(|s| attr(s, "round").as_i64());
    for s in &spans {
        // One trace: the caller's, and every span sent by this service.
        assert_eq!(s["trace_id"], TRACE_ID, "{s}");
        assert_eq!(s["resource"]["service.name"], "mrtr-gateway", "{s}");
    }
    for s in &servers {
        // The caller's span is the parent of each request's span.
        assert_eq!(s["parent_span_id"], PARENT_ID, "{s}");
        assert_eq!(s["name"], "tools/call greet", "{s}");
        assert_eq!(attr(s, "mcp.method.name"), "tools/call");
        assert_eq!(attr(s, "gen_ai.tool.name"), "greet");
        assert_eq!(attr(s, "call_target"), "greet");
        assert_eq!(attr(s, "http.response.status_code"), 200);
        assert!(attr(s, "request_id").is_string(), "{s}");
        let client = child_of(&spans, s);
        assert_eq!(client["name"], "tools/call greet", "{client}");
        assert_eq!(attr(client, "upstream.transport"), "streamable-http");
        assert!(
            client["start_ns"].as_u64() >= s["start_ns"].as_u64()
                && client["end_ns"].as_u64() <= s["end_ns"].as_u64(),
            "the legacy call lies within its request: {s} {client}"
        );
    }
    // Round 1 started the legacy call and parked it; round 2 resumed it.
    let (first, second) = (servers[0], servers[1]);
    assert_eq!(attr(first, "round"), 1);
    assert_eq!(attr(first, "path"), "fresh");
    assert_eq!(attr(first, "parked"), true);
    assert_eq!(attr(first, "outcome"), "input_required");
    assert_eq!(attr(second, "round"), 2);
    assert_eq!(attr(second, "path"), "resumed");
    assert_eq!(attr(second, "outcome"), "complete");
    assert_eq!(legacy.starts("greet"), 1);

    // Nothing of what the user answered, or of the state, is in a span.
    let state = rounds[0].exchange.result().unwrap()["requestState"]
        .as_str()
        .unwrap()
        .to_string();
    for s in &spans {
        let text = s.to_string();
        assert!(!text.contains("name-answer"), "an answer was exported: {s}");
        assert!(!text.contains(&state[..24]), "the state was exported: {s}");
    }
    // Counted, the same family present for every result.
    assert!(
        metric_reaches_remote(admin, "trace_spans_total", &[("result", "exported")], 4.0).await
    );
    assert_eq!(
        remote_metric(
            admin,
            "mrtr_gateway_trace_spans_total",
            &[("result", "dropped")]
        )
        .await,
        0.0
    );
}

/// Polls the gateway process's metric until it reaches `at_least`.
async fn metric_reaches_remote(
    admin: u16,
    name: &str,
    labels: &[(&str, &str)],
    at_least: f64,
) -> bool {
    let name = format!("mrtr_gateway_{name}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if remote_metric(admin, &name, labels).await >= at_least {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_replayed_round_and_a_traceparent_in_meta() {
    let receiver = Receiver::start().await;
    let legacy = PyLegacyServer::start(&[]).await;
    let dir = TempDir::new("mrtr-traces");
    let cfg = gateway_config(
        &legacy.url(),
        &format!(
            "otlp_endpoint = \"{}\"\nexport_interval = \"100ms\"\nservice_name = \"edge-gw\"",
            receiver.endpoint()
        ),
        "[[parking.rules]]\nmethod = \"tools/call\"\nname = \"greet\"\npolicy = \"replay\"\n",
    );
    let (_gw, url, _admin) = spawn_gateway(&cfg, dir.path(), "replay").await;
    // A 2026-07-28 client may carry trace context in `_meta` instead of the headers.
    let c = ModernClient::new(&url);
    let traceparent = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    let meta = json!({"traceparent": traceparent});
    let first = c
        .request(
            "tools/call",
            json!({"name": "greet", "arguments": {}, "_meta": meta}),
        )
        .await
        .unwrap();
    assert_eq!(first.result_type(), Some("input_required"));
    let result = first.result().unwrap();
    let key = input_key(result);
    let done = c
        .request(
            "tools/call",
            json!({"name": "greet", "arguments": {}, "_meta": meta,
                   "requestState": result["requestState"],
                   "inputResponses": {key: {"action": "accept", "content": {"name": "Ada"}}}}),
        )
        .await
        .unwrap();
    assert_eq!(text(done.result().unwrap()), "Hello, Ada!");

    let spans = receiver.at_least(4, Duration::from_secs(20)).await;
    let mut servers = of_kind(&spans, "SPAN_KIND_SERVER");
    assert_eq!(servers.len(), 2, "{spans:#?}");
    servers.sort_by_key(|s| attr(s, "round").as_i64());
    for s in &servers {
        assert_eq!(s["trace_id"], TRACE_ID, "{s}");
        assert_eq!(s["parent_span_id"], PARENT_ID, "{s}");
        assert_eq!(s["resource"]["service.name"], "edge-gw", "{s}");
        child_of(&spans, s);
    }
    assert_eq!(attr(servers[0], "path"), "fresh");
    assert_eq!(attr(servers[0], "parked"), false);
    assert_eq!(attr(servers[1], "path"), "replayed");
    assert_eq!(attr(servers[1], "round"), 2);
    assert_eq!(legacy.starts("greet"), 2, "the replay ran the tool again");
}

#[tokio::test]
async fn stopping_flushes_the_spans_still_queued() {
    let receiver = Receiver::start().await;
    let legacy = PyLegacyServer::start(&[]).await;
    let dir = TempDir::new("mrtr-traces");
    // Nothing would be sent for a minute: only the flush at shutdown can deliver the spans.
    let cfg = gateway_config(
        &legacy.url(),
        &format!(
            "otlp_endpoint = \"{}\"\nexport_interval = \"1m\"",
            receiver.endpoint()
        ),
        "[drain]\nreadiness_delay = \"0s\"\ndeadline = \"5s\"\n",
    );
    let (mut gw, url, _admin) = spawn_gateway(&cfg, dir.path(), "flush").await;
    let added = traced_client(&url)
        .request(
            "tools/call",
            json!({"name": "add", "arguments": {"a": 2, "b": 3}}),
        )
        .await
        .unwrap();
    assert_eq!(text(added.result().unwrap()), "5");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        receiver.spans().is_empty(),
        "nothing is sent before the interval or the flush"
    );

    let pid = gw.id().expect("the gateway runs");
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid as i32).unwrap(),
        rustix::process::Signal::Term,
    )
    .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(20), gw.wait())
        .await
        .expect("the gateway stops within its drain and export timeout")
        .unwrap();
    assert!(status.success(), "{status}");
    let spans = receiver.at_least(2, Duration::from_secs(5)).await;
    let server = of_kind(&spans, "SPAN_KIND_SERVER");
    assert_eq!(server.len(), 1, "{spans:#?}");
    assert_eq!(server[0]["name"], "tools/call add");
    assert_eq!(server[0]["parent_span_id"], PARENT_ID);
    child_of(&spans, server[0]);
    let log = std::fs::read_to_string(dir.path().join("flush.log")).unwrap();
    assert!(log.contains("trace export flushed and stopped"), "{log}");
}

#[tokio::test]
async fn a_stuck_collector_costs_requests_nothing_and_drops_are_counted() {
    // A collector that accepts connections and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((sock, _)) = silent.accept().await {
            open.push(sock);
        }
    });
    let legacy = PyLegacyServer::start(&[]).await;
    let dir = TempDir::new("mrtr-traces");
    let cfg = gateway_config(
        &legacy.url(),
        &format!(
            "otlp_endpoint = \"http://127.0.0.1:{port}/v1/traces\"\nexport_timeout = \"30s\"\nmax_queue_spans = 2\nmax_batch_spans = 2"
        ),
        "",
    );
    let (_gw, url, admin) = spawn_gateway(&cfg, dir.path(), "stuck").await;
    let c = traced_client(&url);
    for i in 0..4 {
        let started = Instant::now();
        let added = c
            .request(
                "tools/call",
                json!({"name": "add", "arguments": {"a": i, "b": 1}}),
            )
            .await
            .unwrap();
        assert_eq!(text(added.result().unwrap()), (i + 1).to_string());
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "a request waited on the collector: {:?}",
            started.elapsed()
        );
    }
    // Eight spans; one batch of two hangs in export, two more may wait: the rest are dropped.
    assert!(metric_reaches_remote(admin, "trace_spans_total", &[("result", "dropped")], 4.0).await);
    assert!(
        remote_metric(admin, "mrtr_gateway_trace_queued_spans", &[]).await <= 2.0,
        "the queue holds at most tracing.max_queue_spans"
    );
    held.abort();
}
