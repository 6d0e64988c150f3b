//! The policy stage's metrics (names without the registry's `mrtr_gateway_` prefix; every
//! label value is one of the fixed strings of [`super::RefusalReason`], [`super::kind_label`]
//! and [`crate::translate::GATEWAY_RESULT_FIELDS`]).

use prometheus::{IntCounter, IntCounterVec, Opts, Registry};

#[derive(Clone)]
pub struct PolicyMetrics {
    /// `policy_refusals_total{kind, reason}`: questions held back from the client.
    refusals: IntCounterVec,
    /// `policy_max_tokens_clamped_total`: sampling requests whose `maxTokens` was lowered.
    max_tokens_clamped: IntCounter,
    /// `legacy_result_fields_dropped_total{field}`: members of a legacy result that only the
    /// gateway may set, dropped.
    result_fields_dropped: IntCounterVec,
}

impl PolicyMetrics {
    /// A question of `kind` was held back from the client for `reason`.
    pub fn refused(&self, kind: &str, reason: &str) {
        self.refusals.with_label_values(&[kind, reason]).inc();
    }

    /// A legacy error's `data` was dropped: it carries a URL the policy refuses.
    pub fn error_data_refused(&self) {
        self.refused(super::ERROR_DATA_KIND, "url_in_text");
    }

    /// A sampling request's `maxTokens` was lowered.
    pub fn max_tokens_clamped(&self) {
        self.max_tokens_clamped.inc();
    }

    /// A member of a legacy result that only the gateway may set was dropped.
    pub fn field_dropped(&self, field: &str) {
        self.result_fields_dropped.with_label_values(&[field]).inc();
    }

    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<PolicyMetrics> {
        let refusals = IntCounterVec::new(
            Opts::new(
                "policy_refusals_total",
                "Questions of the legacy server held back from the client by the policy stage, \
                 by kind (elicitation_form, elicitation_url, sampling, roots, error_data) and reason.",
            ),
            &["kind", "reason"],
        )?;
        let max_tokens_clamped = IntCounter::new(
            "policy_max_tokens_clamped_total",
            "Sampling requests whose maxTokens was lowered to policy.sampling.max_tokens.",
        )?;
        let result_fields_dropped = IntCounterVec::new(
            Opts::new(
                "legacy_result_fields_dropped_total",
                "Members of legacy results that only the gateway may set (resultType, \
                 inputRequests, requestState, ttlMs, cacheScope), dropped, by field.",
            ),
            &["field"],
        )?;
        registry.register(Box::new(refusals.clone()))?;
        registry.register(Box::new(max_tokens_clamped.clone()))?;
        registry.register(Box::new(result_fields_dropped.clone()))?;
        // In /metrics from the start (at 0), not only after a first refusal or drop.
        for (kind, reason) in super::refusal_labels() {
            refusals.with_label_values(&[kind, reason]);
        }
        for field in [
            "resultType",
            "inputRequests",
            "requestState",
            "ttlMs",
            "cacheScope",
        ] {
            result_fields_dropped.with_label_values(&[field]);
        }
        Ok(PolicyMetrics {
            refusals,
            max_tokens_clamped,
            result_fields_dropped,
        })
    }
}
