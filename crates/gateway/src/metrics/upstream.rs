//! What the legacy side records: sessions opened, failed and open, readiness checks of the
//! upstream (both held by [`crate::sessions::Sessions`]), and the pool of warm sessions (held
//! by [`crate::legacy::pool::SessionPool`]).

use prometheus::{IntCounter, IntCounterVec, IntGauge};

use super::Registrar;
use crate::error::RejectionKind;

/// Legacy sessions and checks of the upstream in force.
pub struct SessionMetrics {
    opened: IntCounter,
    failed: IntCounterVec,
    active: IntGauge,
    checks: IntCounterVec,
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
        }
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
