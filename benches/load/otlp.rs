//! `--otlp`: what trace export costs. Two gateway children in front of the same legacy server,
//! one at the shipped defaults (export off) and one exporting every request's spans to an
//! OTLP/HTTP sink in this process; the plain call and the 2-round elicitation go through each,
//! in rotating slices as the main comparison does, so both see the same machine.
//!
//! The sink answers every export with 200 and an empty `ExportTraceServiceResponse` (an empty
//! protobuf message is zero bytes) and counts requests and bytes; it decodes nothing, so its
//! own CPU stays small next to the gateways'.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};

use super::compare::{self, Caller, CpuProbe, Flow, Path};
use super::gateway_child::GatewayChild;
use super::samples::{Slice, Summary, median, summarize};

/// Export requests and body bytes the sink received.
#[derive(Default)]
pub struct SinkCounts {
    pub requests: AtomicU64,
    pub bytes: AtomicU64,
}

/// Starts the sink on a free loopback port; returns its traces URL and its counters.
pub async fn start_sink() -> Result<(String, Arc<SinkCounts>), String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let counts = Arc::new(SinkCounts::default());
    let seen = counts.clone();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let seen = seen.clone();
                    async move {
                        let body = req.into_body().collect().await?.to_bytes();
                        seen.requests.fetch_add(1, Ordering::Relaxed);
                        seen.bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
                        let mut resp = Response::new(Full::new(Bytes::new()));
                        *resp.status_mut() = StatusCode::OK;
                        resp.headers_mut().insert(
                            http::header::CONTENT_TYPE,
                            http::HeaderValue::from_static("application/x-protobuf"),
                        );
                        Ok::<_, hyper::Error>(resp)
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(sock), service)
                    .await;
            });
        }
    });
    Ok((format!("http://127.0.0.1:{port}/v1/traces"), counts))
}

const SCENARIOS: [(Flow, Path); 4] = [
    (Flow::Plain, Path::Gateway),
    (Flow::Plain, Path::GatewayTraced),
    (Flow::Elicit, Path::Gateway),
    (Flow::Elicit, Path::GatewayTraced),
];

pub struct TracedFlow {
    pub flow: Flow,
    pub off: Summary,
    pub on: Summary,
}

impl TracedFlow {
    fn cpu(s: &Summary) -> f64 {
        s.hop_cpu_us_per_call.0 + s.hop_cpu_us_per_call.1
    }

    /// Export on / off: throughput (pooled, and the median of per-round ratios), p50, p99,
    /// CPU per call.
    fn ratios(&self) -> (f64, f64, f64, f64, f64) {
        let per_round: Vec<f64> = self
            .off
            .per_slice
            .iter()
            .zip(&self.on.per_slice)
            .map(|(off, on)| on / off)
            .collect();
        (
            self.on.throughput / self.off.throughput,
            median(&per_round),
            self.on.p50_ms / self.off.p50_ms,
            self.on.p99_ms / self.off.p99_ms,
            Self::cpu(&self.on) / Self::cpu(&self.off),
        )
    }
}

/// Warms up each scenario, then measures `rounds` rotating rounds of one slice each.
pub async fn run(
    callers: &[Arc<Caller>],
    warmup: Duration,
    slice_len: Duration,
    rounds: usize,
    progress: bool,
    cpu: CpuProbe<'_>,
) -> Vec<TracedFlow> {
    for (flow, path) in SCENARIOS {
        let s = compare::slice(callers, flow, path, warmup, cpu).await;
        if progress {
            eprintln!(
                "warm-up {:<11} {:<12} {:>8.0} calls/s  {} errors",
                flow.key(),
                path.key(),
                s.throughput(),
                s.errors
            );
        }
    }
    let mut slices: Vec<Vec<Slice>> = vec![Vec::new(); SCENARIOS.len()];
    for round in 0..rounds {
        for k in 0..SCENARIOS.len() {
            let i = (round + k) % SCENARIOS.len();
            let (flow, path) = SCENARIOS[i];
            slices[i].push(compare::slice(callers, flow, path, slice_len, cpu).await);
        }
        if progress {
            let t: Vec<String> = slices
                .iter()
                .map(|s| format!("{:.0}", s.last().map_or(0.0, Slice::throughput)))
                .collect();
            eprintln!(
                "round {:>3}/{rounds}: calls/s export off/on: plain {}/{}, elicitation {}/{}",
                round + 1,
                t[0],
                t[1],
                t[2],
                t[3]
            );
        }
    }
    vec![
        TracedFlow {
            flow: Flow::Plain,
            off: summarize(&slices[0]),
            on: summarize(&slices[1]),
        },
        TracedFlow {
            flow: Flow::Elicit,
            off: summarize(&slices[2]),
            on: summarize(&slices[3]),
        },
    ]
}

pub fn table(flows: &[TracedFlow], setup: &str) -> String {
    let mut out = format!("{setup}\n");
    for f in flows {
        out.push_str(&format!("\n{}\n", f.flow.label()));
        out.push_str(&format!(
            "  {:<11} {:>10} {:>9} {:>9} {:>9} {:>7} {:>11}\n",
            "export", "calls/s", "p50 ms", "p99 ms", "calls", "errors", "hop µs/call"
        ));
        for (label, s) in [("off", &f.off), ("on", &f.on)] {
            out.push_str(&format!(
                "  {label:<11} {:>10.0} {:>9.3} {:>9.3} {:>9} {:>7} {:>11.1}\n",
                s.throughput,
                s.p50_ms,
                s.p99_ms,
                s.calls,
                s.errors,
                TracedFlow::cpu(s)
            ));
        }
        let (tp, tp_median, p50, p99, cpu) = f.ratios();
        out.push_str(&format!(
            "  on/off: throughput {tp:.3} (median of rounds {tp_median:.3}), p50 {p50:.2}×, p99 {p99:.2}×, CPU per call {cpu:.2}×\n"
        ));
        if let Some(e) = f.off.first_error.as_ref().or(f.on.first_error.as_ref()) {
            out.push_str(&format!("  first error: {e}\n"));
        }
    }
    out
}

pub fn json(flows: &[TracedFlow], setup: Value) -> Value {
    let summary = |s: &Summary| {
        json!({
            "calls_per_s": s.throughput, "p50_ms": s.p50_ms, "p99_ms": s.p99_ms,
            "calls": s.calls, "errors": s.errors, "hop_cpu_us_per_call": TracedFlow::cpu(s),
        })
    };
    let flows: Vec<Value> = flows
        .iter()
        .map(|f| {
            let (tp, tp_median, p50, p99, cpu) = f.ratios();
            json!({
                "flow": f.flow.key(), "off": summary(&f.off), "on": summary(&f.on),
                "on_off": {"throughput": tp, "throughput_median": tp_median,
                           "p50": p50, "p99": p99, "cpu_per_call": cpu},
            })
        })
        .collect();
    json!({"setup": setup, "flows": flows})
}

/// The spans the traced gateway exported, as it counts them.
pub async fn exported(gw: &GatewayChild) -> Result<(f64, f64, f64), String> {
    Ok((
        gw.metric("mrtr_gateway_trace_spans_total", &[("result", "exported")])
            .await?,
        gw.metric("mrtr_gateway_trace_spans_total", &[("result", "dropped")])
            .await?,
        gw.metric("mrtr_gateway_trace_spans_total", &[("result", "failed")])
            .await?,
    ))
}
