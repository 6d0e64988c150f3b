//! Prometheus metrics, owned by the gateway (no process-global registry).
//!
//! Every metric is listed, with its labels, in `docs/metrics.md`. Label values are bounded:
//! methods are the modern method names the gateway routes (anything else is counted as
//! `other`), reasons are the fixed `RejectionKind::reason` labels, limits are [`Limit`]s.
//!
//! The families are grouped by the layer that records them, each group a small handle with
//! private families and one method per thing that happened: [`FrontMetrics`] (the MCP front),
//! [`EngineMetrics`] (the MRTR engine, with the policy stage's [`PolicyMetrics`]),
//! [`ParkingMetrics`] (the parking lot), [`SessionMetrics`] (with the upstream connections'
//! [`ConnMetrics`]) and [`PoolMetrics`] (the legacy side), [`ProcessMetrics`] (reload, drain, key ring, JWKS), the single-use store's
//! [`SingleUseMetrics`], and [`LimitHits`], which every layer that enforces a limit holds.
//! [`Metrics::new`] registers them all in the one registry; the composition root hands each
//! runtime only the groups it records into.

use std::sync::Arc;

use prometheus::core::Collector;
use prometheus::{Encoder, IntCounterVec, IntGauge, Opts, Registry, TextEncoder};

use crate::policy::PolicyMetrics;
use crate::single_use::SingleUseMetrics;

mod engine;
mod front;
mod limits;
mod parking;
mod process;
mod tasks;
mod upstream;

pub use engine::{EngineMetrics, Retry, RootsRefresh, RoundClose, StateOnly};
pub use front::{FrontMetrics, Outcome};
pub use limits::{Limit, LimitHits};
pub use parking::ParkingMetrics;
pub use process::ProcessMetrics;
pub use tasks::{TaskEnd, TaskMetrics};
pub use upstream::{ConnClose, ConnMetrics, PoolMetrics, SessionMetrics};

/// The registry and the groups registered in it.
pub struct Metrics {
    registry: Registry,
    front: Arc<FrontMetrics>,
    engine: Arc<EngineMetrics>,
    parking: Arc<ParkingMetrics>,
    sessions: Arc<SessionMetrics>,
    pool: Arc<PoolMetrics>,
    process: Arc<ProcessMetrics>,
    tasks: Arc<TaskMetrics>,
    single_use: SingleUseMetrics,
    limits: LimitHits,
}

/// The `method` label values other than `other`.
pub(super) const KNOWN_METHODS: &[&str] = &[
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
    "tasks/get",
    "tasks/update",
    "tasks/cancel",
    "initialize",
];

/// Bounds a method label to the names the gateway knows.
pub fn method_label(method: &str) -> &'static str {
    KNOWN_METHODS
        .iter()
        .find(|m| **m == method)
        .copied()
        .unwrap_or("other")
}

impl Metrics {
    /// A registry labelled with this replica's `instance` id, every group registered in it.
    pub fn new(instance: &str) -> Metrics {
        let mut labels = std::collections::HashMap::new();
        labels.insert("instance_id".to_string(), instance.to_string());
        let registry = Registry::new_custom(Some("mrtr_gateway".into()), Some(labels))
            .expect("registry prefix is valid");
        let r = Registrar(&registry);
        let policy = PolicyMetrics::register(&registry).expect("unique policy metrics");
        let single_use = SingleUseMetrics::register(&registry).expect("unique single-use metrics");
        let limit_labels: Vec<&str> = Limit::ALL.iter().map(|l| l.label()).collect();
        let limits = LimitHits::new(r.counter_vec_from_start(
            "limit_hits_total",
            "Configured limits that were hit, by limit name.",
            &["limit"],
            &[&limit_labels],
        ));
        Metrics {
            front: Arc::new(FrontMetrics::register(&r)),
            engine: Arc::new(EngineMetrics::register(&r, policy)),
            parking: Arc::new(ParkingMetrics::register(&r)),
            sessions: Arc::new(SessionMetrics::register(&r)),
            pool: Arc::new(PoolMetrics::register(&r)),
            process: Arc::new(ProcessMetrics::register(&r)),
            tasks: Arc::new(TaskMetrics::register(&r)),
            single_use,
            limits,
            registry,
        }
    }

    /// The MCP front's group.
    pub fn front(&self) -> Arc<FrontMetrics> {
        self.front.clone()
    }

    /// The MRTR engine's group (with the policy stage's).
    pub fn engine(&self) -> Arc<EngineMetrics> {
        self.engine.clone()
    }

    /// The parking lot's group.
    pub fn parking(&self) -> Arc<ParkingMetrics> {
        self.parking.clone()
    }

    /// Legacy sessions and upstream checks.
    pub fn sessions(&self) -> Arc<SessionMetrics> {
        self.sessions.clone()
    }

    /// The pool of warm legacy sessions.
    pub fn pool(&self) -> Arc<PoolMetrics> {
        self.pool.clone()
    }

    /// Reloads, the drain, the key ring, JWKS fetches.
    pub fn process(&self) -> Arc<ProcessMetrics> {
        self.process.clone()
    }

    /// The single-use store's counters (kept across the stores a reload builds).
    pub fn single_use(&self) -> SingleUseMetrics {
        self.single_use.clone()
    }

    /// Tasks (the Tasks extension).
    pub fn tasks(&self) -> Arc<TaskMetrics> {
        self.tasks.clone()
    }

    /// Where hit limits are counted.
    pub fn limits(&self) -> LimitHits {
        self.limits.clone()
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

/// One unit of a gauge, held from creation until dropped (a connection, a request slot, a
/// body being read).
pub struct Held(IntGauge);

impl Held {
    pub fn new(gauge: IntGauge) -> Held {
        gauge.inc();
        Held(gauge)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Every way to pick one value from each list of `values`, in order.
fn combinations<'a>(values: &[&[&'a str]]) -> Vec<Vec<&'a str>> {
    values.iter().fold(vec![Vec::new()], |acc, choices| {
        acc.iter()
            .flat_map(|prefix| {
                choices.iter().map(move |c| {
                    let mut next = prefix.clone();
                    next.push(*c);
                    next
                })
            })
            .collect()
    })
}

/// The methods that run a legacy call able to ask the client something.
pub(super) const MRTR_METHODS: &[&str] = &["tools/call", "prompts/get", "resources/read"];

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

    /// [`Registrar::counter_vec`] with a series at 0 for every combination of `values` (one
    /// list of label values per label, in order), so that the family is in `/metrics` from
    /// the start: a dashboard or an alert on it reads 0 until its first event, not "no data".
    fn counter_vec_from_start(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
        values: &[&[&str]],
    ) -> IntCounterVec {
        let vec = self.counter_vec(name, help, labels);
        for combination in combinations(values) {
            vec.with_label_values(&combination);
        }
        vec
    }

    fn gauge(&self, name: &str, help: &str) -> IntGauge {
        self.register(IntGauge::new(name, help).expect("valid metric"))
    }
}
