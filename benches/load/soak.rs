//! `--soak`: a bounded mixed run with the gateway's resident memory sampled.
//!
//! Every caller loops over a fixed mix (out of 20 operations): 10 plain calls, 5 three-round
//! flows (`ask_twice`), 2 retries with a tampered `requestState` (expected: HTTP 400,
//! -32602), 2 client disconnects in the middle of an SSE response (the `slow` tool; the
//! gateway must cancel the legacy call), and 1 abandoned flow (round one only: the parked
//! call waits for its parking TTL or is not parked once the principal's quota is full).
//! VmRSS of the gateway process is read every `--sample-every`; at the end the run waits for
//! the gateway to go quiet and reads its gauges, so a leak shows as sessions or requests
//! that never went away.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use mrtr_testkit::client::ModernClient;
use mrtr_testkit::legacy_server::LegacyServer;
use serde_json::{Map, Value, json};

use super::fixture::{answer_form, text_of};
use super::gateway_child::GatewayChild;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Op {
    Plain,
    ThreeRounds,
    TamperedState,
    Disconnect,
    Abandoned,
}

impl Op {
    fn of(i: u64) -> Op {
        match i % 20 {
            0..=9 => Op::Plain,
            10..=14 => Op::ThreeRounds,
            15 | 16 => Op::TamperedState,
            17 | 18 => Op::Disconnect,
            _ => Op::Abandoned,
        }
    }

    fn key(self) -> &'static str {
        match self {
            Op::Plain => "plain",
            Op::ThreeRounds => "three_rounds",
            Op::TamperedState => "tampered_state",
            Op::Disconnect => "disconnect",
            Op::Abandoned => "abandoned",
        }
    }
}

#[derive(Default, Clone)]
struct Tally {
    ok: u64,
    unexpected: u64,
    first_unexpected: Option<String>,
}

type Tallies = Arc<Mutex<BTreeMap<Op, Tally>>>;

fn ask(name: &str) -> Value {
    json!({"name": name, "arguments": {}})
}

/// Changes one character in the middle of the token's sealed part.
fn tamper(state: &str) -> String {
    let mut bytes = state.as_bytes().to_vec();
    let i = bytes.len() - bytes.len() / 3;
    bytes[i] = if bytes[i] == b'A' { b'B' } else { b'A' };
    String::from_utf8(bytes).expect("base64url is ASCII")
}

async fn first_round(c: &ModernClient, name: &str) -> Result<(Map<String, Value>, String), String> {
    let ex = c
        .request("tools/call", ask(name))
        .await
        .map_err(|e| e.to_string())?;
    if ex.result_type() != Some("input_required") {
        return Err(format!("round one: HTTP {} {:?}", ex.status, ex.message));
    }
    let r = ex.result().cloned().unwrap_or_default();
    let requests = r["inputRequests"].as_object().cloned().unwrap_or_default();
    let state = r["requestState"].as_str().unwrap_or_default().to_string();
    Ok((requests, state))
}

async fn run_op(
    op: Op,
    c: &ModernClient,
    raw: &Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    url: &str,
    n: u64,
) -> Result<(), String> {
    match op {
        Op::Plain => {
            let text = format!("soak {n}");
            let ex = c
                .request(
                    "tools/call",
                    json!({"name": "echo", "arguments": {"text": text}}),
                )
                .await
                .map_err(|e| e.to_string())?;
            match ex.result() {
                Some(r) if text_of(r) == text => Ok(()),
                _ => Err(format!("HTTP {} {:?}", ex.status, ex.message)),
            }
        }
        Op::ThreeRounds => {
            let mut answerer = |_key: &str, req: &Value| Ok(answer_form(req));
            let (rounds, ex) = c
                .call_with_input("tools/call", ask("ask_twice"), &mut answerer, 4)
                .await
                .map_err(|e| e.to_string())?;
            match ex.result() {
                Some(r) if rounds.len() == 2 && text_of(r) == "name-answer from city-answer" => {
                    Ok(())
                }
                _ => Err(format!(
                    "{} rounds, HTTP {} {:?}",
                    rounds.len(),
                    ex.status,
                    ex.message
                )),
            }
        }
        Op::TamperedState => {
            let (requests, state) = first_round(c, "ask").await?;
            let answers: Map<String, Value> = requests
                .iter()
                .map(|(k, req)| (k.clone(), answer_form(req)))
                .collect();
            let mut params = ask("ask");
            params["inputResponses"] = Value::Object(answers);
            params["requestState"] = json!(tamper(&state));
            let ex = c
                .request("tools/call", params)
                .await
                .map_err(|e| e.to_string())?;
            if ex.status == StatusCode::BAD_REQUEST && ex.error_code() == Some(-32602) {
                Ok(())
            } else {
                Err(format!(
                    "tampered retry: HTTP {} {:?}",
                    ex.status, ex.message
                ))
            }
        }
        Op::Disconnect => disconnect_mid_stream(c, raw, url).await,
        Op::Abandoned => first_round(c, "ask").await.map(|_| ()),
    }
}

/// Starts `slow` with a progress token, waits for the SSE response's first event, then
/// drops the response (closing the connection).
async fn disconnect_mid_stream(
    c: &ModernClient,
    raw: &Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    url: &str,
) -> Result<(), String> {
    let body = json!({
        "jsonrpc": "2.0", "id": c.next_id(), "method": "tools/call",
        "params": c.params_with_meta(json!({"name": "slow", "arguments": {}, "_meta": {"progressToken": 1}})),
    });
    let mut req = Request::post(url)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json, text/event-stream")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("valid request");
    req.headers_mut()
        .extend(ModernClient::routing_headers(&body));
    let fut = async {
        let resp = raw.request(req).await.map_err(|e| e.to_string())?;
        let sse = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        if resp.status() != StatusCode::OK || !sse {
            return Err(format!("slow: HTTP {} (SSE {sse})", resp.status()));
        }
        let mut body = resp.into_body();
        match body.frame().await {
            Some(Ok(_)) => Ok(()),
            other => Err(format!("slow: no first event ({other:?})")),
        }
        // The body (and its connection) is dropped here, mid-stream.
    };
    tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .map_err(|_| "slow: no first event within 10 s".to_string())?
}

pub struct SoakOptions {
    pub clients: usize,
    pub duration: Duration,
    pub sample_every: Duration,
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Runs the soak; returns the report as text and JSON.
pub async fn run(
    legacy: &LegacyServer,
    gw: &GatewayChild,
    o: &SoakOptions,
) -> Result<(String, Value), String> {
    let tallies: Tallies = Arc::new(Mutex::new(BTreeMap::new()));
    let start_rss = gw.status_kib("VmRSS").unwrap_or(0);
    let started = Instant::now();
    let deadline = started + o.duration;
    let callers: Vec<_> = (0..o.clients)
        .map(|i| {
            let tallies = tallies.clone();
            let url = gw.url.clone();
            tokio::spawn(async move {
                let c = ModernClient::new(&url);
                let raw = Client::builder(TokioExecutor::new()).build_http();
                // Callers start at different points of the mix.
                let mut n = i as u64 * 7;
                while Instant::now() < deadline {
                    let op = Op::of(n);
                    let outcome = run_op(op, &c, &raw, &url, n).await;
                    let mut t = tallies.lock().unwrap_or_else(|e| e.into_inner());
                    let entry = t.entry(op).or_default();
                    match outcome {
                        Ok(()) => entry.ok += 1,
                        Err(e) => {
                            entry.unexpected += 1;
                            entry.first_unexpected.get_or_insert(e);
                        }
                    }
                    n += 1;
                }
            })
        })
        .collect();
    let mut samples: Vec<(f64, u64)> = vec![(0.0, start_rss)];
    let mut peak = start_rss;
    while Instant::now() < deadline {
        let wait = o
            .sample_every
            .min(deadline.saturating_duration_since(Instant::now()));
        tokio::time::sleep(wait).await;
        let rss = gw.status_kib("VmRSS").unwrap_or(0);
        peak = peak.max(rss);
        let t = started.elapsed().as_secs_f64();
        samples.push((t, rss));
        let (ops, bad) = {
            let t = tallies.lock().unwrap_or_else(|e| e.into_inner());
            t.values().fold((0, 0), |(a, b), x| {
                (a + x.ok + x.unexpected, b + x.unexpected)
            })
        };
        eprintln!(
            "t={t:>6.1}s  gateway VmRSS {:>7.1} MiB  ops {ops:>8}  unexpected {bad}",
            mib(rss)
        );
    }
    for c in callers {
        let _ = c.await;
    }
    // Quiet down: nothing in flight, and only parked calls still hold legacy sessions.
    let quiet_deadline = Instant::now() + Duration::from_secs(15);
    let (mut active, mut sessions, mut parked) = (f64::NAN, f64::NAN, f64::NAN);
    while Instant::now() < quiet_deadline {
        active = gw.metric("mrtr_gateway_active_requests", &[]).await?;
        sessions = gw
            .metric("mrtr_gateway_legacy_sessions_active", &[])
            .await?;
        parked = gw.metric("mrtr_gateway_parked_calls", &[]).await?;
        if active == 0.0 && sessions == parked {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let end_rss = gw.status_kib("VmRSS").unwrap_or(0);
    peak = peak.max(end_rss);
    let hwm = gw.status_kib("VmHWM").unwrap_or(0);
    let legacy_live = legacy.live_sessions();
    let evictions = gw
        .metric("mrtr_gateway_parked_evictions_total", &[])
        .await?;
    // Claims and kept outcomes of single-use states live as long as the state (10 minutes
    // here): memory retained in proportion to the run's retries, not a leak.
    let single_use = gw.metric("mrtr_gateway_single_use_entries", &[]).await?;
    let tallies = tallies.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let elapsed = started.elapsed().as_secs_f64();

    let mut text = format!(
        "soak: {} clients for {:.0} s against the gateway child (pid {})\n\n\
         gateway VmRSS: start {:.1} MiB, peak {:.1} MiB (kernel VmHWM {:.1} MiB), end {:.1} MiB\n\n\
         {:<16} {:>9} {:>11}\n",
        o.clients,
        o.duration.as_secs_f64(),
        gw.pid(),
        mib(start_rss),
        mib(peak),
        mib(hwm),
        mib(end_rss),
        "operation",
        "ok",
        "unexpected"
    );
    let mut ops_json = serde_json::Map::new();
    for (op, t) in &tallies {
        text.push_str(&format!(
            "{:<16} {:>9} {:>11}\n",
            op.key(),
            t.ok,
            t.unexpected
        ));
        if let Some(e) = &t.first_unexpected {
            text.push_str(&format!("  first unexpected: {e}\n"));
        }
        ops_json.insert(
            op.key().into(),
            json!({"ok": t.ok, "unexpected": t.unexpected, "first_unexpected": t.first_unexpected}),
        );
    }
    let total: u64 = tallies.values().map(|t| t.ok + t.unexpected).sum();
    text.push_str(&format!(
        "\n{total} operations in {elapsed:.0} s ({:.0}/s)\n\
         after the run: active requests {active}, legacy sessions {sessions}, parked calls {parked} \
         (parked-call evictions so far {evictions}); single-use entries {single_use}; \
         legacy server live sessions {legacy_live}\n",
        total as f64 / elapsed
    ));
    let json = json!({
        "clients": o.clients,
        "duration_s": o.duration.as_secs_f64(),
        "rss_mib": {"start": mib(start_rss), "peak": mib(peak), "hwm": mib(hwm), "end": mib(end_rss)},
        "rss_samples": samples.iter().map(|(t, k)| json!([t, mib(*k)])).collect::<Vec<_>>(),
        "operations": ops_json,
        "after": {
            "active_requests": active,
            "legacy_sessions_active": sessions,
            "parked_calls": parked,
            "parked_evictions_total": evictions,
            "single_use_entries": single_use,
            "legacy_server_live_sessions": legacy_live,
        },
    });
    Ok((text, json))
}
