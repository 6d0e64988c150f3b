//! Prometheus metrics, owned by the gateway (no process-global registry).
//!
//! Every metric is listed, with its labels, in `docs/metrics.md`. Label values are bounded:
//! methods are the modern method names the gateway routes (anything else is counted as
//! `other`), reasons are the fixed `RejectionKind::reason` labels.

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};

pub struct Metrics {
    pub registry: Registry,
    pub requests: IntCounterVec,
    pub rejections: IntCounterVec,
    pub input_required: IntCounterVec,
    pub retries: IntCounterVec,
    pub state_seals: IntCounterVec,
    pub state_opens: IntCounterVec,
    pub state_bytes: Histogram,
    pub legacy_sessions_opened: IntCounter,
    pub legacy_sessions_failed: IntCounterVec,
    pub legacy_sessions_active: IntGauge,
    /// `/readyz` upstream checks sent (each opens and closes a legacy session), by result.
    pub upstream_checks: IntCounterVec,
    pub upstream_duration: HistogramVec,
    pub active_requests: IntGauge,
    pub active_connections: IntGauge,
    pub config_reloads: IntCounterVec,
    pub draining: IntGauge,
    pub key_ring_keys: IntGauge,
    pub parked_calls: IntGauge,
    pub pool_idle: IntGauge,
    pub jwks_fetches: IntCounterVec,
    pub pool_checkouts: IntCounterVec,
    pub pool_discards: IntCounterVec,
    /// Pooled sessions told their client's roots may have changed, by what the server did.
    pub roots_refreshes: IntCounterVec,
    pub parked_evictions: IntCounterVec,
    pub max_rounds_exceeded: IntCounterVec,
    pub volatile_questions: IntCounterVec,
    pub limit_hits: IntCounterVec,
    /// `subscriptions/listen` streams open now.
    pub listen_streams: IntGauge,
    /// Requests of legacy clients passed through to the legacy server (dual-era front).
    pub legacy_passthrough: IntCounterVec,
    /// The policy stage's refusals and rewrites (`crate::policy`).
    pub policy: crate::policy::PolicyMetrics,
    /// Requests whose body is still arriving (they hold no request slot yet).
    pub requests_reading_body: IntGauge,
    /// Passed-through standalone GET streams of legacy clients open now.
    pub legacy_get_streams: IntGauge,
    /// Accept errors other than a connection lost before it was accepted, by listener.
    pub accept_errors: IntCounterVec,
}

/// Bounds a method label to the names the gateway knows.
pub fn method_label(method: &str) -> &'static str {
    const KNOWN: &[&str] = &[
        "server/discover",
        "tools/call",
        "tools/list",
        "prompts/get",
        "prompts/list",
        "resources/read",
        "resources/list",
        "resources/templates/list",
        "completion/complete",
        "subscriptions/listen",
        "initialize",
    ];
    KNOWN
        .iter()
        .find(|m| **m == method)
        .copied()
        .unwrap_or("other")
}

impl Metrics {
    pub fn new(instance: &str) -> Metrics {
        let mut labels = std::collections::HashMap::new();
        labels.insert("instance_id".to_string(), instance.to_string());
        let registry = Registry::new_custom(Some("mrtr_gateway".into()), Some(labels))
            .expect("registry prefix is valid");
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
            registry
                .register(Box::new(c.clone()))
                .expect("unique metric");
            c
        };
        let requests = counter_vec(
            "requests_total",
            "Modern requests answered, by method and outcome (complete, input_required, error).",
            &["method", "outcome"],
        );
        let rejections = counter_vec(
            "rejections_total",
            "Requests answered with a JSON-RPC error, by reason and by whose fault it was.",
            &["reason", "fault"],
        );
        let input_required = counter_vec(
            "input_required_total",
            "input_required results returned, by method.",
            &["method"],
        );
        let retries = counter_vec(
            "retries_total",
            "Retries carrying a requestState, by how they were served (replayed, parked).",
            &["path"],
        );
        let state_seals = counter_vec(
            "state_seals_total",
            "requestState tokens sealed, by key id.",
            &["key_id"],
        );
        let state_opens = counter_vec(
            "state_opens_total",
            "requestState tokens presented, by result (ok, or the rejection reason).",
            &["result"],
        );
        let legacy_sessions_failed = counter_vec(
            "legacy_sessions_failed_total",
            "Legacy sessions that could not be opened or died, by reason.",
            &["reason"],
        );
        let upstream_checks = counter_vec(
            "upstream_checks_total",
            "Readiness checks of the legacy server sent (an initialize, or a stdio start), by result.",
            &["result"],
        );
        let max_rounds_exceeded = counter_vec(
            "max_rounds_exceeded_total",
            "Calls ended because the legacy server kept asking past state.max_rounds, by method.",
            &["method"],
        );
        let volatile_questions = counter_vec(
            "volatile_questions_total",
            "Replays where a question differed from the previous round's only in volatile content.",
            &["method"],
        );
        let limit_hits = counter_vec(
            "limit_hits_total",
            "Configured limits that were hit, by limit name.",
            &["limit"],
        );
        let state_bytes = Histogram::with_opts(
            HistogramOpts::new(
                "state_bytes",
                "Size of sealed requestState tokens in bytes.",
            )
            .buckets(vec![
                256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0, 65536.0,
            ]),
        )
        .expect("valid metric");
        registry
            .register(Box::new(state_bytes.clone()))
            .expect("unique metric");
        let upstream_duration = HistogramVec::new(
            HistogramOpts::new(
                "upstream_duration_seconds",
                "Time spent on the legacy server per modern request, by method.",
            )
            .buckets(vec![
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            ]),
            &["method"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(upstream_duration.clone()))
            .expect("unique metric");
        let gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help).expect("valid metric");
            registry
                .register(Box::new(g.clone()))
                .expect("unique metric");
            g
        };
        let legacy_sessions_active = gauge("legacy_sessions_active", "Legacy sessions open now.");
        let active_requests = gauge(
            "active_requests",
            "Requests holding a request slot now (listen.max_concurrent_requests).",
        );
        let active_connections = gauge("active_connections", "Client connections open now.");
        let draining = gauge(
            "draining",
            "1 while the gateway drains before exiting, else 0.",
        );
        let key_ring_keys = gauge("key_ring_keys", "State keys in the ring (the first seals).");
        let parked_calls = gauge(
            "parked_calls",
            "Legacy calls parked now, waiting for their retry.",
        );
        let jwks_fetches = counter_vec(
            "jwks_fetches_total",
            "JWKS URL fetches, by outcome (ok, timeout, too_large, bad_status, transport, invalid) and unknown-kid lookups held back by the refresh rate limit (rate_limited).",
            &["outcome"],
        );
        let pool_idle = gauge(
            "pool_idle_sessions",
            "Warm legacy sessions idle in the pool now.",
        );
        let pool_checkouts = counter_vec(
            "pool_checkouts_total",
            "Session checkouts from the pool, by result (hit: a warm session; miss: a new one).",
            &["result"],
        );
        let pool_discards = counter_vec(
            "pool_discards_total",
            "Pooled sessions closed instead of reused, by reason.",
            &["reason"],
        );
        let roots_refreshes = counter_vec(
            "roots_refreshes_total",
            "Pooled sessions reused for a request declaring roots after the server had asked an earlier client's roots: notifications/roots/list_changed sent, then the server re-asked within pool.roots_refresh_wait (reasked), did not (timeout), or was not waited for because this upstream was learned to ignore the notification (not_waited).",
            &["outcome"],
        );
        let parked_evictions = counter_vec(
            "parked_evictions_total",
            "Parked calls cancelled without being resumed, by reason (expired, overflow, stream_ended, shutdown).",
            &["reason"],
        );
        let config_reloads = counter_vec(
            "config_reloads_total",
            "Configuration and key reloads, by result (ok, error).",
            &["result"],
        );
        let listen_streams = gauge(
            "listen_streams",
            "subscriptions/listen streams open now (bounded by subscriptions.max_streams).",
        );
        let requests_reading_body = gauge(
            "requests_reading_body",
            "Requests whose body is still arriving (bounded by listen.body_read_timeout; no request slot yet).",
        );
        let legacy_get_streams = gauge(
            "legacy_get_streams",
            "Passed-through standalone GET streams of legacy clients open now (bounded by legacy_clients.max_get_streams).",
        );
        let accept_errors = counter_vec(
            "accept_errors_total",
            "Accept errors other than a connection lost before it was accepted (e.g. out of descriptors), by listener (mcp, admin).",
            &["listener"],
        );
        let legacy_passthrough = counter_vec(
            "legacy_passthrough_total",
            "Requests of legacy clients passed through to the legacy server, by kind (initialize, post, get, delete).",
            &["kind"],
        );
        let legacy_sessions_opened = IntCounter::new(
            "legacy_sessions_opened_total",
            "Legacy sessions opened (initialize succeeded).",
        )
        .expect("valid metric");
        registry
            .register(Box::new(legacy_sessions_opened.clone()))
            .expect("unique metric");
        let policy =
            crate::policy::PolicyMetrics::register(&registry).expect("unique policy metrics");
        Metrics {
            policy,
            registry,
            requests,
            rejections,
            input_required,
            retries,
            state_seals,
            state_opens,
            state_bytes,
            legacy_sessions_opened,
            legacy_sessions_failed,
            legacy_sessions_active,
            upstream_checks,
            upstream_duration,
            active_requests,
            active_connections,
            config_reloads,
            draining,
            key_ring_keys,
            parked_calls,
            pool_idle,
            jwks_fetches,
            pool_checkouts,
            pool_discards,
            roots_refreshes,
            parked_evictions,
            max_rounds_exceeded,
            volatile_questions,
            limit_hits,
            listen_streams,
            legacy_passthrough,
            requests_reading_body,
            legacy_get_streams,
            accept_errors,
        }
    }

    /// Brings the JWKS fetch counters (kept as plain atomics by the authenticator, which is
    /// rebuilt on reload) into the registry.
    pub fn sync_jwks(&self, snap: &crate::auth::JwksCountersSnapshot) {
        for (outcome, value) in [
            ("ok", snap.fetch_ok),
            ("timeout", snap.fetch_timeout),
            ("too_large", snap.fetch_too_large),
            ("bad_status", snap.fetch_bad_status),
            ("transport", snap.fetch_transport),
            ("invalid", snap.fetch_invalid),
            ("rate_limited", snap.unknown_kid_rate_limited),
        ] {
            let c = self.jwks_fetches.with_label_values(&[outcome]);
            let have = c.get();
            if value > have {
                c.inc_by(value - have);
            }
        }
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding cannot fail");
        String::from_utf8(buf).expect("exposition format is UTF-8")
    }
}
