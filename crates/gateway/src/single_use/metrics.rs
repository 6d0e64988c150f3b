//! The single-use store's metrics, registered once and shared by every store built later.
//!
//! Stores are rebuilt when the configuration is reloaded, but a metric can be registered only
//! once, so the counters live apart from the store: register them at start-up with
//! [`SingleUseMetrics::register`] and hand a clone to each store. Names below are given without
//! the registry's `mrtr_gateway_` prefix; every label value is one of the fixed strings listed.

use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};

/// `claims_total{result}` label values.
pub const CLAIM_RESULTS: &[&str] = &[
    "acquired",
    "taken_over",
    "in_progress",
    "done",
    "not_kept",
    "lost",
];
/// `outcomes_total{result}` label values.
pub const OUTCOME_RESULTS: &[&str] = &["kept", "too_large", "over_total", "none", "no_claim"];
/// `errors_total{reason}` label values.
pub const ERROR_REASONS: &[&str] = &[
    "full",
    "principal_quota",
    "newcomer_reserve",
    "unavailable",
    "timeout",
    "invalid_id",
];
/// `writes_retried_total{op}` label values.
pub const RETRIED_OPS: &[&str] = &["complete", "release"];

#[derive(Clone)]
pub struct SingleUseMetrics {
    /// `single_use_claims_total{result}`: claims by what they found.
    claims: IntCounterVec,
    /// `single_use_outcomes_total{result}`: completions, by whether the outcome was kept.
    outcomes: IntCounterVec,
    /// `single_use_errors_total{reason}`: store failures (each one refused a call).
    errors: IntCounterVec,
    /// `single_use_entries`: ids held by the memory store (0 with Redis).
    entries: IntGauge,
    /// `single_use_pending_writes`: outcomes and releases that failed once and are being
    /// retried in the background until they land or the claim expires.
    pending_writes: IntGauge,
    /// `single_use_writes_retried_total{op}`: such writes, by operation.
    writes_retried: IntCounterVec,
    /// `single_use_detached_runs_total`: claimed retries whose client went away mid-call; the
    /// call was finished anyway and its outcome kept for the next presentation.
    detached_runs: IntCounter,
    /// `single_use_lost_at_drain_total`: claimed retries still running when a drain's
    /// deadline passed: cancelled, and their outcome recorded as lost at once.
    lost_at_drain: IntCounter,
}

impl SingleUseMetrics {
    /// A claim found `result` (one of [`CLAIM_RESULTS`]).
    pub fn claimed(&self, result: &str) {
        self.claims.with_label_values(&[result]).inc();
    }

    /// A completion ended as `result` (one of [`OUTCOME_RESULTS`]).
    pub fn completed(&self, result: &str) {
        self.outcomes.with_label_values(&[result]).inc();
    }

    /// The store failed for `reason` (one of [`ERROR_REASONS`]), refusing a call.
    pub fn failed(&self, reason: &str) {
        self.errors.with_label_values(&[reason]).inc();
    }

    /// The gauge the memory store keeps equal to the ids it holds.
    pub fn entries_gauge(&self) -> IntGauge {
        self.entries.clone()
    }

    /// A write `op` (one of [`RETRIED_OPS`]) failed once and is retried in the background;
    /// [`SingleUseMetrics::retry_ended`] follows once it lands or is given up.
    pub fn retrying(&self, op: &str) {
        self.writes_retried.with_label_values(&[op]).inc();
        self.pending_writes.inc();
    }

    /// A background retry ended (landed or given up).
    pub fn retry_ended(&self) {
        self.pending_writes.dec();
    }

    /// A claimed retry's client went away; the call was finished anyway.
    pub fn detached_run(&self) {
        self.detached_runs.inc();
    }

    /// A claimed retry outlived the drain deadline and was recorded as outcome lost.
    pub fn lost_at_drain(&self) {
        self.lost_at_drain.inc();
    }

    /// Claimed retries recorded as outcome lost by drains so far.
    pub fn lost_at_drain_count(&self) -> u64 {
        self.lost_at_drain.get()
    }

    /// Claims counted so far that found `result` (tests and tools read it).
    pub fn claims(&self, result: &str) -> u64 {
        self.claims.with_label_values(&[result]).get()
    }

    /// Completions counted so far that ended as `result`.
    pub fn outcomes(&self, result: &str) -> u64 {
        self.outcomes.with_label_values(&[result]).get()
    }

    /// Store failures counted so far for `reason`.
    pub fn errors(&self, reason: &str) -> u64 {
        self.errors.with_label_values(&[reason]).get()
    }

    /// Ids the memory store holds now.
    pub fn entries(&self) -> i64 {
        self.entries.get()
    }

    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<SingleUseMetrics> {
        let m = SingleUseMetrics::unregistered();
        registry.register(Box::new(m.claims.clone()))?;
        registry.register(Box::new(m.outcomes.clone()))?;
        registry.register(Box::new(m.errors.clone()))?;
        registry.register(Box::new(m.entries.clone()))?;
        registry.register(Box::new(m.pending_writes.clone()))?;
        registry.register(Box::new(m.writes_retried.clone()))?;
        registry.register(Box::new(m.detached_runs.clone()))?;
        registry.register(Box::new(m.lost_at_drain.clone()))?;
        Ok(m)
    }

    /// Metrics that count but are exported nowhere (tests, one-shot commands).
    pub fn unregistered() -> SingleUseMetrics {
        let vec = |name: &str, help: &str, label: &str, values: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), &[label]).expect("valid metric");
            for v in values {
                c.with_label_values(&[v]);
            }
            c
        };
        SingleUseMetrics {
            claims: vec(
                "single_use_claims_total",
                "requestState claims, by result: acquired (this retry runs), taken_over (this \
                 retry runs: the previous claimant never started its call), in_progress (a \
                 duplicate while the first runs), done (a duplicate given the kept outcome), \
                 not_kept (a duplicate whose outcome was not kept), lost (a duplicate of a call \
                 that started but whose outcome was never recorded).",
                "result",
                CLAIM_RESULTS,
            ),
            outcomes: vec(
                "single_use_outcomes_total",
                "Completed claims, by result: kept, too_large (over max_outcome_bytes), \
                 over_total (over max_total_outcome_bytes), none (no outcome given), \
                 no_claim (the claim had expired or was released).",
                "result",
                OUTCOME_RESULTS,
            ),
            errors: vec(
                "single_use_errors_total",
                "Single-use store failures, each of which refused a call: full, \
                 principal_quota (the caller's own share was full), newcomer_reserve (only \
                 the entries kept for new callers were left), unavailable, timeout, \
                 invalid_id.",
                "reason",
                ERROR_REASONS,
            ),
            entries: IntGauge::new(
                "single_use_entries",
                "Ids held by the in-memory single-use store (claims in progress and kept \
                 outcomes).",
            )
            .expect("valid metric"),
            pending_writes: IntGauge::new(
                "single_use_pending_writes",
                "Single-use outcomes and releases being retried in the background after a \
                 store failure, until they land or their claim expires.",
            )
            .expect("valid metric"),
            writes_retried: vec(
                "single_use_writes_retried_total",
                "Single-use writes (complete, release) that failed once and were handed to \
                 background retries.",
                "op",
                RETRIED_OPS,
            ),
            detached_runs: IntCounter::new(
                "single_use_detached_runs_total",
                "Claimed retries whose client went away mid-call: the call was finished anyway \
                 (bounded by upstream.call_timeout) and its outcome kept for the next \
                 presentation of the same state.",
            )
            .expect("valid metric"),
            lost_at_drain: IntCounter::new(
                "single_use_lost_at_drain_total",
                "Claimed retries still running when a drain reached drain.deadline: their call \
                 was cancelled and their outcome recorded as lost at once, so duplicates are \
                 told to start over without waiting for the run lease.",
            )
            .expect("valid metric"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_under_the_gateway_prefix_once() {
        let registry = Registry::new_custom(Some("mrtr_gateway".into()), None).unwrap();
        let m = SingleUseMetrics::register(&registry).unwrap();
        m.claimed("acquired");
        let names: Vec<String> = registry
            .gather()
            .iter()
            .map(|f| f.name().to_string())
            .collect();
        for want in [
            "mrtr_gateway_single_use_claims_total",
            "mrtr_gateway_single_use_outcomes_total",
            "mrtr_gateway_single_use_errors_total",
            "mrtr_gateway_single_use_entries",
            "mrtr_gateway_single_use_pending_writes",
            "mrtr_gateway_single_use_writes_retried_total",
            "mrtr_gateway_single_use_detached_runs_total",
            "mrtr_gateway_single_use_lost_at_drain_total",
        ] {
            assert!(names.iter().any(|n| n == want), "{want} missing: {names:?}");
        }
        assert!(SingleUseMetrics::register(&registry).is_err());
    }
}
