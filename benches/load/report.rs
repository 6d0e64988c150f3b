//! The comparison's table (for people) and JSON (for scripts), with the targets beside the
//! figures.

use serde_json::{Value, json};

use super::compare::{Comparison, Flow, FlowComparison};
use super::samples::Summary;

/// A flow's targets, as stated for this gateway: plain calls keep ≥ 0.8× the direct
/// throughput and add ≤ 0.3 ms at p50; a 2-round elicitation costs at most 2× the direct
/// legacy flow (read here as both p50 latency ≤ 2× and throughput ≥ 0.5×).
fn target(c: &FlowComparison) -> (String, bool) {
    match c.flow {
        Flow::Plain => (
            "throughput ≥ 0.8× direct, added p50 ≤ 0.3 ms".into(),
            c.throughput_ratio >= 0.8 && c.added_p50_ms <= 0.3,
        ),
        Flow::Elicit => (
            "p50 ≤ 2× direct, throughput ≥ 0.5× direct".into(),
            c.p50_ratio <= 2.0 && c.throughput_ratio >= 0.5,
        ),
    }
}

fn row(path: &str, s: &Summary) -> String {
    format!(
        "  {path:<8} {:>10.0} {:>9.3} {:>9.3} {:>9.3} {:>9} {:>7}",
        s.throughput, s.p50_ms, s.p99_ms, s.mean_ms, s.calls, s.errors
    )
}

pub fn table(c: &Comparison, setup: &str) -> String {
    let mut out = String::new();
    out.push_str(setup);
    out.push('\n');
    for f in &c.flows {
        let (goal, met) = target(f);
        out.push_str(&format!("\n{}\n", f.flow.label()));
        out.push_str(&format!(
            "  {:<8} {:>10} {:>9} {:>9} {:>9} {:>9} {:>7}\n",
            "path", "calls/s", "p50 ms", "p99 ms", "mean ms", "calls", "errors"
        ));
        out.push_str(&row("direct", &f.direct));
        out.push('\n');
        out.push_str(&row("gateway", &f.gateway));
        out.push('\n');
        out.push_str(&format!(
            "  gateway/direct throughput {:.3} (median of {} rounds {:.3}); added p50 {:+.3} ms, p99 {:+.3} ms; p50 ratio {:.2}\n",
            f.throughput_ratio, c.rounds, f.throughput_ratio_median, f.added_p50_ms, f.added_p99_ms, f.p50_ratio
        ));
        let (user, sys) = f.gateway.gateway_cpu_us_per_call;
        out.push_str(&format!(
            "  gateway process CPU per call: {user:.0} µs user + {sys:.0} µs system\n"
        ));
        out.push_str(&format!(
            "  target: {goal} -> {}\n",
            if met { "met" } else { "MISSED" }
        ));
        for (path, s) in [("direct", &f.direct), ("gateway", &f.gateway)] {
            if let Some(e) = &s.first_error {
                out.push_str(&format!("  first {path} error: {e}\n"));
            }
        }
    }
    out
}

fn summary_json(s: &Summary) -> Value {
    json!({
        "calls": s.calls,
        "errors": s.errors,
        "throughput_per_s": s.throughput,
        "p50_ms": s.p50_ms,
        "p99_ms": s.p99_ms,
        "mean_ms": s.mean_ms,
        "first_error": s.first_error,
        "per_slice_throughput": s.per_slice,
        "gateway_cpu_us_per_call": {"user": s.gateway_cpu_us_per_call.0, "system": s.gateway_cpu_us_per_call.1},
    })
}

pub fn json(c: &Comparison, setup: Value) -> Value {
    let flows: Vec<Value> = c
        .flows
        .iter()
        .map(|f| {
            let (goal, met) = target(f);
            json!({
                "flow": f.flow.key(),
                "direct": summary_json(&f.direct),
                "gateway": summary_json(&f.gateway),
                "throughput_ratio": f.throughput_ratio,
                "throughput_ratio_median_of_rounds": f.throughput_ratio_median,
                "added_p50_ms": f.added_p50_ms,
                "added_p99_ms": f.added_p99_ms,
                "p50_ratio": f.p50_ratio,
                "target": goal,
                "target_met": met,
            })
        })
        .collect();
    json!({"setup": setup, "rounds": c.rounds, "flows": flows})
}
