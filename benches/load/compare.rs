//! Direct, through the cheapest hop, and through the gateway, measured side by side in one run.
//!
//! Six scenarios: {plain `tools/call`, 2-round elicitation} × {direct legacy client on a
//! warm session, the same legacy client through a plain nginx reverse proxy, 2026-07-28 client
//! through the gateway}. After a warm-up of each, the measured time is cut into short slices
//! that rotate through the scenarios round after round (the starting scenario shifts each
//! round), so a noisy neighbour on this shared machine lands on all six alike. Each slice is closed-loop: `clients` callers, each
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
    /// The legacy client through nginx (`proxy_pass`, keep-alive upstream).
    Nginx,
    Gateway,
    /// The same 2026-07-28 client through a second gateway that exports traces (`--otlp`).
    GatewayTraced,
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
            Path::Nginx => "nginx",
            Path::Gateway => "gateway",
            Path::GatewayTraced => "gateway+otlp",
        }
    }
}

const SCENARIOS: [(Flow, Path); 6] = [
    (Flow::Plain, Path::Direct),
    (Flow::Plain, Path::Nginx),
    (Flow::Plain, Path::Gateway),
    (Flow::Elicit, Path::Direct),
    (Flow::Elicit, Path::Nginx),
    (Flow::Elicit, Path::Gateway),
];

fn modern_capabilities(roots: bool) -> Value {
    if roots {
        serde_json::json!({"elicitation": {"form": {}}, "roots": {"listChanged": true}})
    } else {
        serde_json::json!({"elicitation": {"form": {}}})
    }
}

/// One caller's clients: a warm legacy session, one through nginx, and a modern client
/// (and, for `--otlp`, one through the gateway that exports traces).
pub struct Caller {
    pub direct: LegacyClient,
    pub via_nginx: LegacyClient,
    pub modern: ModernClient,
    pub traced: Option<ModernClient>,
}

impl Caller {
    /// `roots`: the modern client also declares `roots`, as desktop clients do (the gateway
    /// then expects a `roots/list` in every round until it has learned the tool's rounds).
    pub async fn connect(
        legacy_url: &str,
        nginx_url: &str,
        gateway_url: &str,
        roots: bool,
    ) -> Result<Caller, String> {
        Ok(Caller {
            direct: LegacyClient::connect(legacy_url).await?,
            via_nginx: LegacyClient::connect(nginx_url).await?,
            // The capabilities the direct client declares (elicitation, form only), and roots
            // when asked for.
            modern: ModernClient::new(gateway_url).with_capabilities(modern_capabilities(roots)),
            traced: None,
        })
    }

    /// The same caller, its gateway client sending `authorization` with every request.
    pub fn with_credential(mut self, authorization: &str) -> Caller {
        let value = http::HeaderValue::from_str(authorization).expect("a valid header value");
        self.modern
            .headers
            .insert(http::header::AUTHORIZATION, value);
        self
    }

    /// The same caller with a client of the gateway at `traced_url` as well.
    pub fn with_traced(mut self, traced_url: &str) -> Caller {
        self.traced =
            Some(ModernClient::new(traced_url).with_capabilities(self.modern.capabilities.clone()));
        self
    }

    /// One call of `flow` on `path`, checked for the expected result.
    pub async fn call(&self, flow: Flow, path: Path, n: u64) -> Result<(), String> {
        let answer = |req: &Value| answer_form(req);
        let legacy = match path {
            Path::Nginx => &self.via_nginx,
            _ => &self.direct,
        };
        let modern = match (path, &self.traced) {
            (Path::GatewayTraced, Some(traced)) => traced,
            (Path::GatewayTraced, None) => return Err("no traced gateway in this run".into()),
            _ => &self.modern,
        };
        let (result, expected) = match (flow, path) {
            (Flow::Plain, Path::Direct | Path::Nginx) => {
                let text = format!("hello {n}");
                let r = legacy
                    .call_tool("echo", json!({"text": text}), &answer)
                    .await?;
                (r, text)
            }
            (Flow::Plain, Path::Gateway | Path::GatewayTraced) => {
                let text = format!("hello {n}");
                let ex = modern
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
            (Flow::Elicit, Path::Direct | Path::Nginx) => {
                let r = legacy.call_tool("ask", json!({}), &answer).await?;
                (r, "Hello, name-answer".to_string())
            }
            (Flow::Elicit, Path::Gateway | Path::GatewayTraced) => {
                let mut answerer = |_key: &str, req: &Value| Ok(answer_form(req));
                let (rounds, ex) = modern
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

/// Reads the CPU seconds (user, system) of the hop process on a path (zeros for direct).
pub type CpuProbe<'a> = &'a (dyn Fn(Path) -> (f64, f64) + Sync);

/// Runs `flow` on `path` with every caller for `length`.
pub async fn slice(
    callers: &[Arc<Caller>],
    flow: Flow,
    path: Path,
    length: Duration,
    cpu: CpuProbe<'_>,
) -> Slice {
    let cpu_before = cpu(path);
    let load_before = own_cpu_seconds();
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
    let cpu_after = cpu(path);
    total.hop_cpu = (cpu_after.0 - cpu_before.0, cpu_after.1 - cpu_before.1);
    total.load_cpu = own_cpu_seconds() - load_before;
    total
}

/// This process's CPU seconds (user + system) so far.
fn own_cpu_seconds() -> f64 {
    crate::gateway_child::proc_cpu_seconds(std::process::id()).map_or(0.0, |(u, s)| u + s)
}

pub struct FlowComparison {
    pub flow: Flow,
    pub direct: Summary,
    pub nginx: Summary,
    pub gateway: Summary,
    /// Gateway throughput / direct throughput, pooled over the run.
    pub throughput_ratio: f64,
    /// The same ratio, per round, then the median.
    pub throughput_ratio_median: f64,
    pub added_p50_ms: f64,
    pub added_p99_ms: f64,
    /// Gateway p50 / direct p50.
    pub p50_ratio: f64,
    /// Gateway throughput / nginx throughput, pooled, and the median of the per-round ratios.
    pub vs_nginx_throughput: f64,
    pub vs_nginx_throughput_median: f64,
    /// Gateway p50 / nginx p50.
    pub vs_nginx_p50: f64,
    /// Gateway CPU per call / nginx CPU per call (user + system).
    pub vs_nginx_cpu: f64,
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
    only: Option<Flow>,
) -> Comparison {
    let measured = |flow: Flow| only.is_none_or(|o| o == flow);
    for (flow, path) in SCENARIOS {
        if !measured(flow) {
            continue;
        }
        let s = slice(callers, flow, path, warmup, cpu).await;
        if progress {
            eprintln!(
                "warm-up {:<11} {:<7} {:>8.0} calls/s  {} errors",
                flow.key(),
                path.key(),
                s.throughput(),
                s.errors
            );
            if let Some(e) = &s.first_error {
                eprintln!("  first error: {e}");
            }
        }
    }
    let mut slices: Vec<Vec<Slice>> = vec![Vec::new(); SCENARIOS.len()];
    for round in 0..rounds {
        for k in 0..SCENARIOS.len() {
            let i = (round + k) % SCENARIOS.len();
            let (flow, path) = SCENARIOS[i];
            if measured(flow) {
                slices[i].push(slice(callers, flow, path, slice_len, cpu).await);
            }
        }
        if progress {
            let t: Vec<String> = slices
                .iter()
                .map(|s| format!("{:.0}", s.last().map_or(0.0, Slice::throughput)))
                .collect();
            eprintln!(
                "round {:>3}/{rounds}: calls/s direct/nginx/gateway plain {}/{}/{}, elicitation {}/{}/{}",
                round + 1,
                t[0],
                t[1],
                t[2],
                t[3],
                t[4],
                t[5]
            );
        }
    }
    let flows = [(Flow::Plain, 0), (Flow::Elicit, 3)]
        .into_iter()
        .filter(|(flow, _)| measured(*flow))
        .map(|(flow, first)| {
            let direct = summarize(&slices[first]);
            let nginx = summarize(&slices[first + 1]);
            let gateway = summarize(&slices[first + 2]);
            let ratio_median = |base: &Summary| {
                let per_round: Vec<f64> = base
                    .per_slice
                    .iter()
                    .zip(&gateway.per_slice)
                    .map(|(b, g)| g / b)
                    .collect();
                median(&per_round)
            };
            let cpu = |s: &Summary| s.hop_cpu_us_per_call.0 + s.hop_cpu_us_per_call.1;
            FlowComparison {
                flow,
                throughput_ratio: gateway.throughput / direct.throughput,
                throughput_ratio_median: ratio_median(&direct),
                added_p50_ms: gateway.p50_ms - direct.p50_ms,
                added_p99_ms: gateway.p99_ms - direct.p99_ms,
                p50_ratio: gateway.p50_ms / direct.p50_ms,
                vs_nginx_throughput: gateway.throughput / nginx.throughput,
                vs_nginx_throughput_median: ratio_median(&nginx),
                vs_nginx_p50: gateway.p50_ms / nginx.p50_ms,
                vs_nginx_cpu: cpu(&gateway) / cpu(&nginx),
                direct,
                nginx,
                gateway,
            }
        })
        .collect();
    Comparison { rounds, flows }
}
