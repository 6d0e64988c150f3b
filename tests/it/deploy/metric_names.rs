//! The gateway's metric names (the fixed list the operator artifacts may rely on, matching
//! `docs/metrics.md`), and finding the names a text refers to.

/// Every metric, without the `mrtr_gateway_` prefix.
pub const METRICS: &[&str] = &[
    "requests_total",
    "rejections_total",
    "input_required_total",
    "retries_total",
    "state_seals_total",
    "state_opens_total",
    "state_bytes",
    "legacy_sessions_opened_total",
    "legacy_sessions_failed_total",
    "legacy_sessions_active",
    "upstream_checks_total",
    "upstream_duration_seconds",
    "upstream_connections_opened_total",
    "upstream_connections_closed_total",
    "upstream_connections_active",
    "active_requests",
    "active_connections",
    "connections_at_rest",
    "max_rounds_exceeded_total",
    "limit_hits_total",
    "single_use_claims_total",
    "single_use_errors_total",
    "single_use_entries",
    "single_use_pending_writes",
    "single_use_writes_retried_total",
    "single_use_detached_runs_total",
    "single_use_lost_at_drain_total",
    "parked_calls",
    "config_reloads_total",
    "draining",
    "listen_streams",
    "legacy_passthrough_total",
    "policy_refusals_total",
    "policy_max_tokens_clamped_total",
    "legacy_result_fields_dropped_total",
    "requests_reading_body",
    "legacy_get_streams",
    "accept_errors_total",
    "roots_refreshes_total",
    "pool_discards_total",
    "state_only_rounds_total",
    "trace_spans_total",
    "trace_queued_spans",
    "tasks_created_total",
    "tasks_finished_total",
    "tasks_running",
    "task_input_rounds_total",
    "runtime_worker_threads",
];

/// The histograms, whose series also appear as `_bucket`, `_sum` and `_count`.
const HISTOGRAMS: &[&str] = &["state_bytes", "upstream_duration_seconds"];

pub const PREFIX: &str = "mrtr_gateway_";

/// Every `mrtr_gateway_…` name in `text`, prefix stripped, in order of appearance.
pub fn referenced(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(PREFIX) {
        let tail = &rest[at + PREFIX.len()..];
        let len = tail
            .bytes()
            .take_while(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_')
            .count();
        out.push(tail[..len].to_owned());
        rest = &tail[len..];
    }
    out
}

/// The metric a series name belongs to (`state_bytes_bucket` -> `state_bytes`), if known.
pub fn metric_of(series: &str) -> Option<&'static str> {
    if let Some(m) = METRICS.iter().find(|m| **m == series) {
        return Some(m);
    }
    HISTOGRAMS.iter().copied().find(|h| {
        ["_bucket", "_sum", "_count"]
            .iter()
            .any(|suffix| series.strip_prefix(h) == Some(suffix))
    })
}
