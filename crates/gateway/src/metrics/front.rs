//! What the MCP front records: requests and how they were answered, connections, bodies on
//! their way in, accept errors, listen streams, and what legacy clients pass through.

use prometheus::{IntCounter, IntCounterVec, IntGauge};

use super::{Held, Registrar, method_label};
use crate::error::{Rejection, RejectionKind};

/// How a modern request was answered (`requests_total{outcome}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Complete,
    InputRequired,
    /// A tool call that became a task (`resultType: "task"`).
    Task,
    Error,
}

impl Outcome {
    /// The `outcome` label value (also written to the access log).
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Complete => "complete",
            Outcome::InputRequired => "input_required",
            Outcome::Task => "task",
            Outcome::Error => "error",
        }
    }
}

/// The front's families, held by [`crate::front::deps::Front`] (and the admin listener, for
/// its accept errors).
pub struct FrontMetrics {
    requests: IntCounterVec,
    rejections: IntCounterVec,
    active_requests: IntGauge,
    active_connections: IntGauge,
    connections_at_rest: IntGauge,
    requests_reading_body: IntGauge,
    accept_errors: IntCounterVec,
    listen_streams: IntGauge,
    legacy_passthrough: IntCounterVec,
    legacy_get_streams: IntGauge,
}

impl FrontMetrics {
    /// A modern request was answered (`method` is bounded to the names the gateway routes).
    pub fn answered(&self, method: &str, outcome: Outcome) {
        self.requests
            .with_label_values(&[method_label(method), outcome.label()])
            .inc();
    }

    /// A request was answered with a JSON-RPC error: counted by reason and whose fault it was.
    pub fn rejected(&self, rejection: &Rejection) {
        self.rejections
            .with_label_values(&[rejection.reason(), rejection.fault().as_str()])
            .inc();
    }

    /// A request holds a request slot until the returned guard is dropped.
    pub fn slot_taken(&self) -> Held {
        Held::new(self.active_requests.clone())
    }

    /// A client connection is open until the returned guard is dropped.
    pub fn connection_opened(&self) -> Held {
        Held::new(self.active_connections.clone())
    }

    /// The gauge of client connections at rest (`listen.idle_release_after`).
    pub fn connections_at_rest(&self) -> IntGauge {
        self.connections_at_rest.clone()
    }

    /// A request's body is arriving until the returned guard is dropped.
    pub fn reading_body(&self) -> Held {
        Held::new(self.requests_reading_body.clone())
    }

    /// The accept-error counter of the listener called `listener` (`mcp`, `admin`). Asking
    /// creates its series, so a listener that never failed shows 0.
    pub fn accept_errors(&self, listener: &str) -> IntCounter {
        self.accept_errors.with_label_values(&[listener])
    }

    /// A request of a legacy client was passed through (`initialize`, `post`, `get`,
    /// `delete`).
    pub fn passed_through(&self, kind: &str) {
        self.legacy_passthrough.with_label_values(&[kind]).inc();
    }

    /// The gauges the long-lived responses keep equal to their counts: listen streams, then
    /// passed-through legacy GET streams.
    pub fn stream_gauges(&self) -> (IntGauge, IntGauge) {
        (self.listen_streams.clone(), self.legacy_get_streams.clone())
    }

    pub(super) fn register(r: &Registrar) -> Self {
        let requests = r.counter_vec_from_start(
            "requests_total",
            "Modern requests answered, by method and outcome (complete, input_required, task, error).",
            &["method", "outcome"],
            &[
                super::KNOWN_METHODS,
                &["complete", "input_required", "task", "error"],
            ],
        );
        let rejections = r.counter_vec(
            "rejections_total",
            "Requests answered with a JSON-RPC error, by reason and by whose fault it was.",
            &["reason", "fault"],
        );
        for kind in RejectionKind::catalogue() {
            rejections.with_label_values(&[kind.reason(), kind.fault().as_str()]);
        }
        let active_requests = r.gauge(
            "active_requests",
            "Requests holding a request slot now (listen.max_concurrent_requests).",
        );
        let active_connections = r.gauge("active_connections", "Client connections open now.");
        let connections_at_rest = r.gauge(
            "connections_at_rest",
            "Client HTTP/1 connections at rest now: quiet for listen.idle_release_after, holding their socket and no HTTP buffers.",
        );
        let requests_reading_body = r.gauge(
            "requests_reading_body",
            "Requests whose body is still arriving (bounded by listen.body_read_timeout; no request slot yet).",
        );
        let accept_errors = r.counter_vec_from_start(
            "accept_errors_total",
            "Accept errors other than a connection lost before it was accepted (e.g. out of descriptors), by listener (mcp, admin).",
            &["listener"],
            &[&["mcp", "admin"]],
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
        FrontMetrics {
            requests,
            rejections,
            active_requests,
            active_connections,
            connections_at_rest,
            requests_reading_body,
            accept_errors,
            listen_streams,
            legacy_passthrough,
            legacy_get_streams,
        }
    }
}
