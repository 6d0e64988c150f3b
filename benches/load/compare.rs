//! Direct versus through-the-gateway, measured side by side in one run.
//!
//! Four scenarios: {plain `tools/call`, 2-round elicitation} × {direct legacy client on a
//! warm session, 2026-07-28 client through the gateway}. After a warm-up of each, the
//! measured time is cut into short slices that rotate through the scenarios round after
//! round (the starting scenario shifts each round), so a noisy neighbour on this shared
//! machine lands on all four alike. Each slice is closed-loop: `clients` callers, each
//! issuing its next call as soon as the previous one ends. Per flow the report gives the
//! pooled ratio and the median of the per-round ratios (a round's slices are adjacent in
//! time, so their ratio is the least disturbed by drift).

use std::sync::Arc;
use std::time::{Duration, Instant};

use mrtr_testkit::client::ModernClient;
use serde_json::{Value, json};

use super::fixture::{answer_form, text_of};
use super::legacy_client::LegacyClient;
use super::samples::{Slice, Summary, median, summarize};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// `tools/call echo`.
    Plain,
    /// `tools/call ask`: one form question, then the result.
    Elicit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    Direct,
    Gateway,
}

impl Flow {
    pub fn label(self) -> &'static str {
        match self {
            Flow::Plain => "plain tools/call",
            Flow::Elicit => "2-round elicitation",
        }
    }

    pub fn key(self) -> &'static str {
        match self {
            Flow::Plain => "plain",
            Flow::Elicit => "elicitation",
        }
    }
}

impl Path {
    pub fn key(self) -> &'static str {
        match self {
            Path::Direct => "direct",
            Path::Gateway => "gateway",
        }
    }
}

const SCENARIOS: [(Flow, Path); 4] = [
    (Flow::Plain, Path::Direct),
    (Flow::Plain, Path::Gateway),
    (Flow::Elicit, Path::Direct),
    (Flow::Elicit, Path::Gateway),
];

/// One caller's two clients: a warm legacy session and a modern client.
pub struct Caller {
    pub direct: LegacyClient,
    pub modern: ModernClient,
}

impl Caller {
    pub async fn connect(legacy_url: &str, gateway_url: &str) -> Result<Caller, String> {
        Ok(Caller {
            direct: LegacyClient::connect(legacy_url).await?,
            // The same capabilities the direct client declares: elicitation (form) only.
            modern: ModernClient::new(gateway_url)
                .with_capabilities(serde_json::json!({"elicitation": {"form": {}}})),
        })
    }

    /// One call of `flow` on `path`, checked for the expected result.
    pub async fn call(&self, flow: Flow, path: Path, n: u64) -> Result<(), String> {
        let answer = |req: &Value| answer_form(req);
        let (result, expected) = match (flow, path) {
            (Flow::Plain, Path::Direct) => {
                let text = format!("hello {n}");
                let r = self
                    .direct
                    .call_tool("echo", json!({"text": text}), &answer)
                    .await?;
                (r, text)
            }
            (Flow::Plain, Path::Gateway) => {
                let text = format!("hello {n}");
                let ex = self
                    .modern
                    .request(
                        "tools/call",
                        json!({"name": "echo", "arguments": {"text": text}}),
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                if ex.result_type() != Some("complete") {
                    return Err(format!("HTTP {}: {:?}", ex.status, ex.message));
                }
                (ex.result().cloned().unwrap_or_default(), text)
            }
            (Flow::Elicit, Path::Direct) => {
                let r = self.direct.call_tool("ask", json!({}), &answer).await?;
                (r, "Hello, name-answer".to_string())
            }
            (Flow::Elicit, Path::Gateway) => {
                let mut answerer = |_key: &str, req: &Value| Ok(answer_form(req));
                let (rounds, ex) = self
                    .modern
                    .call_with_input(
                        "tools/call",
                        json!({"name": "ask", "arguments": {}}),
                        &mut answerer,
                        4,
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                if rounds.len() != 1 || ex.result_type() != Some("complete") {
                    return Err(format!(
                        "{} rounds, then HTTP {}: {:?}",
                        rounds.len(),
                        ex.status,
                        ex.message
                    ));
                }
                (
                    ex.result().cloned().unwrap_or_default(),
                    "Hello, name-answer".to_string(),
                )
            }
        };
        if text_of(&result) == expected {
            Ok(())
        } else {
            Err(format!("unexpected result {result}"))
        }
    }
}

/// Reads the gateway process's CPU seconds (user, system).
pub type CpuProbe<'a> = &'a (dyn Fn() -> (f64, f64) + Sync);

/// Runs `flow` on `path` with every caller for `length`.
async fn slice(
    callers: &[Arc<Caller>],
    flow: Flow,
    path: Path,
    length: Duration,
    cpu: CpuProbe<'_>,
) -> Slice {
    let cpu_before = cpu();
    let start = Instant::now();
    let deadline = start + length;
    let tasks: Vec<_> = callers
        .iter()
        .enumerate()
        .map(|(i, caller)| {
            let caller = caller.clone();
            tokio::spawn(async move {
                let mut out = Slice::default();
                let mut n = (i as u64) << 32;
                while Instant::now() < deadline {
                    let t0 = Instant::now();
                    match caller.call(flow, path, n).await {
                        Ok(()) => out.latencies_us.push(t0.elapsed().as_micros() as u64),
                        Err(e) => {
                            out.errors += 1;
                            out.first_error.get_or_insert(e);
                        }
                    }
                    n += 1;
                }
                out
            })
        })
        .collect();
    let mut total = Slice::default();
    for t in tasks {
        if let Ok(s) = t.await {
            total.merge(s);
        }
    }
    total.elapsed = start.elapsed();
    if path == Path::Gateway {
        let cpu_after = cpu();
        total.gateway_cpu = (cpu_after.0 - cpu_before.0, cpu_after.1 - cpu_before.1);
    }
    total
}

pub struct FlowComparison {
    pub flow: Flow,
    pub direct: Summary,
    pub gateway: Summary,
    /// Gateway throughput / direct throughput, pooled over the run.
    pub throughput_ratio: f64,
    /// The same ratio, per round, then the median.
    pub throughput_ratio_median: f64,
    pub added_p50_ms: f64,
    pub added_p99_ms: f64,
    /// Gateway p50 / direct p50.
    pub p50_ratio: f64,
}

pub struct Comparison {
    pub rounds: usize,
    pub flows: Vec<FlowComparison>,
}

/// Warms up each scenario, then measures `rounds` rounds of one `slice_len` slice each.
pub async fn run(
    callers: &[Arc<Caller>],
    warmup: Duration,
    slice_len: Duration,
    rounds: usize,
    progress: bool,
    cpu: CpuProbe<'_>,
) -> Comparison {
    for (flow, path) in SCENARIOS {
        let s = slice(callers, flow, path, warmup, cpu).await;
        if progress {
            eprintln!(
                "warm-up {:<11} {:<7} {:>8.0} calls/s  {} errors",
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
            slices[i].push(slice(callers, flow, path, slice_len, cpu).await);
        }
        if progress {
            let t: Vec<String> = slices
                .iter()
                .map(|s| format!("{:.0}", s.last().map_or(0.0, Slice::throughput)))
                .collect();
            eprintln!(
                "round {:>3}/{rounds}: calls/s plain direct/gateway {}/{}, elicitation direct/gateway {}/{}",
                round + 1,
                t[0],
                t[1],
                t[2],
                t[3]
            );
        }
    }
    let flows = [(Flow::Plain, 0, 1), (Flow::Elicit, 2, 3)]
        .into_iter()
        .map(|(flow, d, g)| {
            let direct = summarize(&slices[d]);
            let gateway = summarize(&slices[g]);
            let per_round: Vec<f64> = direct
                .per_slice
                .iter()
                .zip(&gateway.per_slice)
                .map(|(d, g)| g / d)
                .collect();
            FlowComparison {
                flow,
                throughput_ratio: gateway.throughput / direct.throughput,
                throughput_ratio_median: median(&per_round),
                added_p50_ms: gateway.p50_ms - direct.p50_ms,
                added_p99_ms: gateway.p99_ms - direct.p99_ms,
                p50_ratio: gateway.p50_ms / direct.p50_ms,
                direct,
                gateway,
            }
        })
        .collect();
    Comparison { rounds, flows }
}
