//! Prometheus metrics, owned by the gateway (no process-global registry).
//!
//! Every metric is listed, with its labels, in `docs/metrics.md`. Label values are bounded:
//! methods are the modern method names the gateway routes (anything else is counted as
//! `other`), reasons are the fixed `RejectionKind::reason` labels.

use prometheus::core::Collector;
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};

mod limits;

pub use limits::{Limit, LimitHits};

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
    /// `limit_hits_total{limit}`, counted by typed [`Limit`].
    pub limits: LimitHits,
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
        let r = Registrar(&registry);
        let front = FrontFamilies::register(&r);
        let engine = EngineFamilies::register(&r);
        let state = StateFamilies::register(&r);
        let upstream = UpstreamFamilies::register(&r);
        let pool = PoolFamilies::register(&r);
        let process = ProcessFamilies::register(&r);
        let policy =
            crate::policy::PolicyMetrics::register(&registry).expect("unique policy metrics");
        Metrics {
            policy,
            registry,
            requests: front.requests,
            rejections: front.rejections,
            input_required: engine.input_required,
            retries: engine.retries,
            state_seals: state.state_seals,
            state_opens: state.state_opens,
            state_bytes: state.state_bytes,
            legacy_sessions_opened: upstream.legacy_sessions_opened,
            legacy_sessions_failed: upstream.legacy_sessions_failed,
            legacy_sessions_active: upstream.legacy_sessions_active,
            upstream_checks: upstream.upstream_checks,
            upstream_duration: upstream.upstream_duration,
            active_requests: front.active_requests,
            active_connections: front.active_connections,
            config_reloads: process.config_reloads,
            draining: process.draining,
            key_ring_keys: state.key_ring_keys,
            parked_calls: engine.parked_calls,
            pool_idle: pool.pool_idle,
            jwks_fetches: process.jwks_fetches,
            pool_checkouts: pool.pool_checkouts,
            pool_discards: pool.pool_discards,
            roots_refreshes: pool.roots_refreshes,
            parked_evictions: engine.parked_evictions,
            max_rounds_exceeded: engine.max_rounds_exceeded,
            volatile_questions: engine.volatile_questions,
            limits: LimitHits::new(process.limit_hits),
            listen_streams: front.listen_streams,
            legacy_passthrough: front.legacy_passthrough,
            requests_reading_body: front.requests_reading_body,
            legacy_get_streams: front.legacy_get_streams,
            accept_errors: front.accept_errors,
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

/// Registers each metric in the gateway's registry as it is created.
struct Registrar<'a>(&'a Registry);

impl Registrar<'_> {
    fn register<C: Collector + Clone + 'static>(&self, metric: C) -> C {
        self.0
            .register(Box::new(metric.clone()))
            .expect("unique metric");
        metric
    }

    fn counter_vec(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.register(IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"))
    }

    fn gauge(&self, name: &str, help: &str) -> IntGauge {
        self.register(IntGauge::new(name, help).expect("valid metric"))
    }
}

/// The MCP front: requests and how they were answered, connections and body reads, listen
/// streams, and what legacy clients pass through.
struct FrontFamilies {
    requests: IntCounterVec,
    rejections: IntCounterVec,
    active_requests: IntGauge,
    active_connections: IntGauge,
    requests_reading_body: IntGauge,
    accept_errors: IntCounterVec,
    listen_streams: IntGauge,
    legacy_passthrough: IntCounterVec,
    legacy_get_streams: IntGauge,
}

impl FrontFamilies {
    fn register(r: &Registrar) -> Self {
        let requests = r.counter_vec(
            "requests_total",
            "Modern requests answered, by method and outcome (complete, input_required, error).",
            &["method", "outcome"],
        );
        let rejections = r.counter_vec(
            "rejections_total",
            "Requests answered with a JSON-RPC error, by reason and by whose fault it was.",
            &["reason", "fault"],
        );
        let active_requests = r.gauge(
            "active_requests",
            "Requests holding a request slot now (listen.max_concurrent_requests).",
        );
        let active_connections = r.gauge("active_connections", "Client connections open now.");
        let requests_reading_body = r.gauge(
            "requests_reading_body",
            "Requests whose body is still arriving (bounded by listen.body_read_timeout; no request slot yet).",
        );
        let accept_errors = r.counter_vec(
            "accept_errors_total",
            "Accept errors other than a connection lost before it was accepted (e.g. out of descriptors), by listener (mcp, admin).",
            &["listener"],
        );
        let listen_streams = r.gauge(
            "listen_streams",
            "subscriptions/listen streams open now (bounded by subscriptions.max_streams).",
        );
        let legacy_passthrough = r.counter_vec(
            "legacy_passthrough_total",
            "Requests of legacy clients passed through to the legacy server, by kind (initialize, post, get, delete).",
            &["kind"],
        );
        let legacy_get_streams = r.gauge(
            "legacy_get_streams",
            "Passed-through standalone GET streams of legacy clients open now (bounded by legacy_clients.max_get_streams).",
        );
        FrontFamilies {
            requests,
            rejections,
            active_requests,
            active_connections,
            requests_reading_body,
            accept_errors,
            listen_streams,
            legacy_passthrough,
            legacy_get_streams,
        }
    }
}

/// The MRTR engine: `input_required` rounds, retries, and the legacy calls parked between them.
struct EngineFamilies {
    input_required: IntCounterVec,
    retries: IntCounterVec,
    max_rounds_exceeded: IntCounterVec,
    volatile_questions: IntCounterVec,
    parked_calls: IntGauge,
    parked_evictions: IntCounterVec,
}

impl EngineFamilies {
    fn register(r: &Registrar) -> Self {
        let input_required = r.counter_vec(
            "input_required_total",
            "input_required results returned, by method.",
            &["method"],
        );
        let retries = r.counter_vec(
            "retries_total",
            "Retries carrying a requestState, by how they were served (replayed, parked).",
            &["path"],
        );
        let max_rounds_exceeded = r.counter_vec(
            "max_rounds_exceeded_total",
            "Calls ended because the legacy server kept asking past state.max_rounds, by method.",
            &["method"],
        );
        let volatile_questions = r.counter_vec(
            "volatile_questions_total",
            "Replays where a question differed from the previous round's only in volatile content.",
            &["method"],
        );
        let parked_calls = r.gauge(
            "parked_calls",
            "Legacy calls parked now, waiting for their retry.",
        );
        let parked_evictions = r.counter_vec(
            "parked_evictions_total",
            "Parked calls cancelled without being resumed, by reason (expired, overflow, stream_ended, shutdown).",
            &["reason"],
        );
        EngineFamilies {
            input_required,
            retries,
            max_rounds_exceeded,
            volatile_questions,
            parked_calls,
            parked_evictions,
        }
    }
}

/// `requestState` tokens and the key ring that seals them.
struct StateFamilies {
    state_seals: IntCounterVec,
    state_opens: IntCounterVec,
    state_bytes: Histogram,
    key_ring_keys: IntGauge,
}

impl StateFamilies {
    fn register(r: &Registrar) -> Self {
        let state_seals = r.counter_vec(
            "state_seals_total",
            "requestState tokens sealed, by key id.",
            &["key_id"],
        );
        let state_opens = r.counter_vec(
            "state_opens_total",
            "requestState tokens presented, by result (ok, or the rejection reason).",
            &["result"],
        );
        let state_bytes = r.register(
            Histogram::with_opts(
                HistogramOpts::new(
                    "state_bytes",
                    "Size of sealed requestState tokens in bytes.",
                )
                .buckets(vec![
                    256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0, 65536.0,
                ]),
            )
            .expect("valid metric"),
        );
        let key_ring_keys = r.gauge("key_ring_keys", "State keys in the ring (the first seals).");
        StateFamilies {
            state_seals,
            state_opens,
            state_bytes,
            key_ring_keys,
        }
    }
}

/// The legacy server: sessions opened, failed and open, readiness checks, time spent there.
struct UpstreamFamilies {
    legacy_sessions_opened: IntCounter,
    legacy_sessions_failed: IntCounterVec,
    legacy_sessions_active: IntGauge,
    upstream_checks: IntCounterVec,
    upstream_duration: HistogramVec,
}

impl UpstreamFamilies {
    fn register(r: &Registrar) -> Self {
        let legacy_sessions_opened = r.register(
            IntCounter::new(
                "legacy_sessions_opened_total",
                "Legacy sessions opened (initialize succeeded).",
            )
            .expect("valid metric"),
        );
        let legacy_sessions_failed = r.counter_vec(
            "legacy_sessions_failed_total",
            "Legacy sessions that could not be opened or died, by reason.",
            &["reason"],
        );
        let legacy_sessions_active = r.gauge("legacy_sessions_active", "Legacy sessions open now.");
        let upstream_checks = r.counter_vec(
            "upstream_checks_total",
            "Readiness checks of the legacy server sent (an initialize, or a stdio start), by result.",
            &["result"],
        );
        let upstream_duration = r.register(
            HistogramVec::new(
                HistogramOpts::new(
                    "upstream_duration_seconds",
                    "Time spent on the legacy server per modern request, by method.",
                )
                .buckets(vec![
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                    30.0,
                ]),
                &["method"],
            )
            .expect("valid metric"),
        );
        UpstreamFamilies {
            legacy_sessions_opened,
            legacy_sessions_failed,
            legacy_sessions_active,
            upstream_checks,
            upstream_duration,
        }
    }
}

/// The pool of warm legacy sessions.
struct PoolFamilies {
    pool_idle: IntGauge,
    pool_checkouts: IntCounterVec,
    pool_discards: IntCounterVec,
    roots_refreshes: IntCounterVec,
}

impl PoolFamilies {
    fn register(r: &Registrar) -> Self {
        let pool_idle = r.gauge(
            "pool_idle_sessions",
            "Warm legacy sessions idle in the pool now.",
        );
        let pool_checkouts = r.counter_vec(
            "pool_checkouts_total",
            "Session checkouts from the pool, by result (hit: a warm session; miss: a new one).",
            &["result"],
        );
        let pool_discards = r.counter_vec(
            "pool_discards_total",
            "Pooled sessions closed instead of reused, by reason.",
            &["reason"],
        );
        let roots_refreshes = r.counter_vec(
            "roots_refreshes_total",
            "Pooled sessions reused for a request declaring roots after the server had asked an earlier client's roots: notifications/roots/list_changed sent, then the server re-asked within pool.roots_refresh_wait (reasked), did not (timeout), or was not waited for because this upstream was learned to ignore the notification (not_waited).",
            &["outcome"],
        );
        PoolFamilies {
            pool_idle,
            pool_checkouts,
            pool_discards,
            roots_refreshes,
        }
    }
}

/// The process as a whole: configured limits hit, reloads, draining, JWKS fetches.
struct ProcessFamilies {
    limit_hits: IntCounterVec,
    config_reloads: IntCounterVec,
    draining: IntGauge,
    jwks_fetches: IntCounterVec,
}

impl ProcessFamilies {
    fn register(r: &Registrar) -> Self {
        let limit_hits = r.counter_vec(
            "limit_hits_total",
            "Configured limits that were hit, by limit name.",
            &["limit"],
        );
        let config_reloads = r.counter_vec(
            "config_reloads_total",
            "Configuration and key reloads, by result (ok, error).",
            &["result"],
        );
        let draining = r.gauge(
            "draining",
            "1 while the gateway drains before exiting, else 0.",
        );
        let jwks_fetches = r.counter_vec(
            "jwks_fetches_total",
            "JWKS URL fetches, by outcome (ok, timeout, too_large, bad_status, transport, invalid) and unknown-kid lookups held back by the refresh rate limit (rate_limited).",
            &["outcome"],
        );
        ProcessFamilies {
            limit_hits,
            config_reloads,
            draining,
            jwks_fetches,
        }
    }
}
