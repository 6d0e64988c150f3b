//! What the legacy side records: sessions opened, failed and open, readiness checks of the
//! upstream (both held by [`crate::sessions::Sessions`]), the HTTP connections to the legacy
//! server (counted by [`crate::legacy::http_conns`]), and the pool of warm sessions (held by
//! [`crate::legacy::pool::SessionPool`]).

use std::sync::Arc;

use prometheus::{IntCounter, IntCounterVec, IntGauge};

use super::Registrar;
use crate::error::RejectionKind;

/// Legacy sessions and checks of the upstream in force.
pub struct SessionMetrics {
    opened: IntCounter,
    failed: IntCounterVec,
    active: IntGauge,
    checks: IntCounterVec,
    connections: ConnMetrics,
}

impl SessionMetrics {
    /// A legacy session was opened (`initialize` succeeded).
    pub fn opened(&self) {
        self.opened.inc();
    }

    /// A legacy session could not be opened, for `reason` (an `upstream_*` reason).
    pub fn failed(&self, reason: &str) {
        self.failed.with_label_values(&[reason]).inc();
    }

    /// The gauge an open session keeps itself counted in until it closes.
    pub fn open_sessions(&self) -> IntGauge {
        self.active.clone()
    }

    /// The counter of readiness checks sent, by result (`ok`, `error`), for
    /// [`crate::upstream_check::UpstreamCheck`].
    pub fn checks(&self) -> IntCounterVec {
        self.checks.clone()
    }

    /// Where the HTTP connections to the legacy server are counted.
    pub fn connections(&self) -> ConnMetrics {
        self.connections.clone()
    }

    pub(super) fn register(r: &Registrar) -> Self {
        let opened = r.register(
            IntCounter::new(
                "legacy_sessions_opened_total",
                "Legacy sessions opened (initialize succeeded).",
            )
            .expect("valid metric"),
        );
        let failed = r.counter_vec(
            "legacy_sessions_failed_total",
            "Legacy sessions that could not be opened or died, by reason.",
            &["reason"],
        );
        for kind in RejectionKind::SESSION_FAILURES {
            failed.with_label_values(&[kind.reason()]);
        }
        let active = r.gauge("legacy_sessions_active", "Legacy sessions open now.");
        let checks = r.counter_vec_from_start(
            "upstream_checks_total",
            "Readiness checks of the legacy server sent (an initialize, or a stdio start), by result.",
            &["result"],
            &[&["ok", "error"]],
        );
        SessionMetrics {
            opened,
            failed,
            active,
            checks,
            connections: ConnMetrics::register(r),
        }
    }
}

/// Why the gateway closed an HTTP connection to the legacy server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnClose {
    /// Its response was dropped before its end (a GET stream given up, a call abandoned, a
    /// response that did not end within the moment it was given): HTTP/1 cannot reuse it.
    Unfinished,
    /// The server closed it (found so when taken, looked over, or read), or said it would.
    ServerClosed,
    /// It waited idle longer than the idle limit.
    IdleTimeout,
    /// It was given back when the idle set was full.
    IdleFull,
    /// The exchange on it failed.
    Failed,
    /// It was idle when its client was let go (a reload changed the upstream, or the gateway
    /// stopped).
    Released,
}

impl ConnClose {
    pub const ALL: [ConnClose; 6] = [
        ConnClose::Unfinished,
        ConnClose::ServerClosed,
        ConnClose::IdleTimeout,
        ConnClose::IdleFull,
        ConnClose::Failed,
        ConnClose::Released,
    ];

    pub fn label(self) -> &'static str {
        match self {
            ConnClose::Unfinished => "unfinished",
            ConnClose::ServerClosed => "server_closed",
            ConnClose::IdleTimeout => "idle_timeout",
            ConnClose::IdleFull => "idle_full",
            ConnClose::Failed => "failed",
            ConnClose::Released => "released",
        }
    }
}

/// The `method` label values of connections opened: the method of the request that found no
/// idle connection.
const OPENED_FOR: [&str; 4] = ["GET", "POST", "DELETE", "other"];

/// HTTP connections to the legacy server: opened, closed, open now. A cheap handle; one that
/// counts nothing stands in where there are no metrics (tools, tests).
#[derive(Clone, Default)]
pub struct ConnMetrics(Option<Arc<ConnCounters>>);

/// The series resolved once, so that counting takes no label lookup.
struct ConnCounters {
    opened: [IntCounter; OPENED_FOR.len()],
    closed: [IntCounter; ConnClose::ALL.len()],
    active: IntGauge,
}

impl ConnMetrics {
    /// A handle that counts nothing.
    pub fn none() -> ConnMetrics {
        ConnMetrics(None)
    }

    /// A connection was opened for a request with `method`.
    pub fn opened(&self, method: &http::Method) {
        if let Some(c) = &self.0 {
            let i = match *method {
                http::Method::GET => 0,
                http::Method::POST => 1,
                http::Method::DELETE => 2,
                _ => 3,
            };
            c.opened[i].inc();
            c.active.inc();
        }
    }

    /// A connection was closed, for `why`.
    pub fn closed(&self, why: ConnClose) {
        if let Some(c) = &self.0 {
            let i = ConnClose::ALL
                .iter()
                .position(|w| *w == why)
                .expect("every reason is listed");
            c.closed[i].inc();
            c.active.dec();
        }
    }

    /// A handle counting into a registry of its own, for tests that read it back.
    #[cfg(test)]
    pub fn counting() -> ConnMetrics {
        ConnMetrics::register(&Registrar(&prometheus::Registry::new()))
    }

    /// Connections opened for requests with `method` (a label value), closed for `why`,
    /// and open now.
    #[cfg(test)]
    pub fn counts(&self, method: &str, why: ConnClose) -> (u64, u64, i64) {
        let c = self.0.as_ref().expect("a counting handle");
        let m = OPENED_FOR
            .iter()
            .position(|m| *m == method)
            .expect("a label");
        let w = ConnClose::ALL
            .iter()
            .position(|w| *w == why)
            .expect("listed");
        (c.opened[m].get(), c.closed[w].get(), c.active.get())
    }

    pub(super) fn register(r: &Registrar) -> ConnMetrics {
        let opened = r.counter_vec_from_start(
            "upstream_connections_opened_total",
            "HTTP connections opened to the legacy server, by the method of the request that \
             found no idle one.",
            &["method"],
            &[&OPENED_FOR],
        );
        let reasons = ConnClose::ALL.map(ConnClose::label);
        let closed = r.counter_vec_from_start(
            "upstream_connections_closed_total",
            "HTTP connections to the legacy server closed, by reason.",
            &["reason"],
            &[&reasons],
        );
        let active = r.gauge(
            "upstream_connections_active",
            "HTTP connections to the legacy server open now (in use or idle).",
        );
        ConnMetrics(Some(Arc::new(ConnCounters {
            opened: OPENED_FOR.map(|m| opened.with_label_values(&[m])),
            closed: reasons.map(|r| closed.with_label_values(&[r])),
            active,
        })))
    }
}

/// The pool of warm legacy sessions.
pub struct PoolMetrics {
    idle: IntGauge,
    checkouts: IntCounterVec,
    discards: IntCounterVec,
}

impl PoolMetrics {
    /// `n` sessions are idle in the pool now.
    pub fn idle_now(&self, n: usize) {
        self.idle.set(n as i64);
    }

    /// A checkout found a warm session.
    pub fn checkout_hit(&self) {
        self.checkouts.with_label_values(&["hit"]).inc();
    }

    /// A checkout found none: a new session is opened.
    pub fn checkout_miss(&self) {
        self.checkouts.with_label_values(&["miss"]).inc();
    }

    /// A pooled session was closed instead of reused, for `reason`.
    pub fn discarded(&self, reason: &str) {
        self.discards.with_label_values(&[reason]).inc();
    }

    pub(super) fn register(r: &Registrar) -> Self {
        let idle = r.gauge(
            "pool_idle_sessions",
            "Warm legacy sessions idle in the pool now.",
        );
        let checkouts = r.counter_vec_from_start(
            "pool_checkouts_total",
            "Session checkouts from the pool, by result (hit: a warm session; miss: a new one).",
            &["result"],
            &[&["hit", "miss"]],
        );
        let discards = r.counter_vec_from_start(
            "pool_discards_total",
            "Pooled sessions closed instead of reused, by reason.",
            &["reason"],
            &[&[
                "idle_timeout",
                "unhealthy",
                "unattributed_request",
                "stream_ended",
                "pool_full",
                "evicted",
                "caller_share",
                "lru",
            ]],
        );
        PoolMetrics {
            idle,
            checkouts,
            discards,
        }
    }
}
