//! The comparison's table (for people) and JSON (for scripts), with the targets beside the
//! figures.

use serde_json::{Value, json};

use super::compare::{Comparison, Flow, FlowComparison};
use super::samples::Summary;

/// A flow's targets, against the cheapest hop measured in the same run (nginx as a plain
/// reverse proxy in front of the same legacy server): a plain call keeps ≥ 0.7× nginx's
/// throughput at ≤ 2× its CPU per call; a 2-round elicitation keeps ≥ 0.5× the throughput
/// of the legacy client doing its rounds through nginx, with p50 within 2× of it.
fn target(c: &FlowComparison) -> (String, bool) {
    match c.flow {
        Flow::Plain => (
            "throughput ≥ 0.7× nginx, CPU per call ≤ 2× nginx".into(),
            c.vs_nginx_throughput >= 0.7 && c.vs_nginx_cpu <= 2.0,
        ),
        Flow::Elicit => (
            "throughput ≥ 0.5× nginx, p50 ≤ 2× nginx".into(),
            c.vs_nginx_throughput >= 0.5 && c.vs_nginx_p50 <= 2.0,
        ),
    }
}

fn row(path: &str, s: &Summary) -> String {
    let (user, sys) = s.hop_cpu_us_per_call;
    let cpu = if path == "direct" {
        "—".to_string()
    } else {
        format!("{:.1}", user + sys)
    };
    format!(
        "  {path:<8} {:>10.0} {:>9.3} {:>9.3} {:>9.3} {:>9} {:>7} {:>11}",
        s.throughput, s.p50_ms, s.p99_ms, s.mean_ms, s.calls, s.errors, cpu
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
            "  {:<8} {:>10} {:>9} {:>9} {:>9} {:>9} {:>7} {:>11}\n",
            "path", "calls/s", "p50 ms", "p99 ms", "mean ms", "calls", "errors", "hop µs/call"
        ));
        for (path, s) in [
            ("direct", &f.direct),
            ("nginx", &f.nginx),
            ("gateway", &f.gateway),
        ] {
            out.push_str(&row(path, s));
            out.push('\n');
        }
        out.push_str(&format!(
            "  gateway/nginx: throughput {:.3} (median of {} rounds {:.3}), p50 {:.2}×, CPU per call {:.2}×\n",
            f.vs_nginx_throughput, c.rounds, f.vs_nginx_throughput_median, f.vs_nginx_p50, f.vs_nginx_cpu
        ));
        out.push_str(&format!(
            "  gateway/direct: throughput {:.3} (median {:.3}); added p50 {:+.3} ms, p99 {:+.3} ms; p50 {:.2}×\n",
            f.throughput_ratio, f.throughput_ratio_median, f.added_p50_ms, f.added_p99_ms, f.p50_ratio
        ));
        out.push_str(&format!(
            "  target: {goal} -> {}\n",
            if met { "met" } else { "MISSED" }
        ));
        for (path, s) in [
            ("direct", &f.direct),
            ("nginx", &f.nginx),
            ("gateway", &f.gateway),
        ] {
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
        "hop_cpu_us_per_call": {"user": s.hop_cpu_us_per_call.0, "system": s.hop_cpu_us_per_call.1},
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
                "nginx": summary_json(&f.nginx),
                "gateway": summary_json(&f.gateway),
                "gateway_vs_nginx": {
                    "throughput_ratio": f.vs_nginx_throughput,
                    "throughput_ratio_median_of_rounds": f.vs_nginx_throughput_median,
                    "p50_ratio": f.vs_nginx_p50,
                    "cpu_per_call_ratio": f.vs_nginx_cpu,
                },
                "gateway_vs_direct": {
                    "throughput_ratio": f.throughput_ratio,
                    "throughput_ratio_median_of_rounds": f.throughput_ratio_median,
                    "added_p50_ms": f.added_p50_ms,
                    "added_p99_ms": f.added_p99_ms,
                    "p50_ratio": f.p50_ratio,
                },
                "target": goal,
                "target_met": met,
            })
        })
        .collect();
    json!({"setup": setup, "rounds": c.rounds, "flows": flows})
}
