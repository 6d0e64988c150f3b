//! What the process as a whole records, from the composition root, reload and the admin
//! listener: reloads, the drain, the key ring's size and JWKS fetches.

use prometheus::{IntCounterVec, IntGauge};

use super::Registrar;
use crate::auth::JwksCountersSnapshot;
use crate::telemetry::TraceCounters;

pub struct ProcessMetrics {
    config_reloads: IntCounterVec,
    draining: IntGauge,
    key_ring_keys: IntGauge,
    jwks_fetches: IntCounterVec,
    trace_spans: IntCounterVec,
    trace_queued_spans: IntGauge,
    runtime_worker_threads: IntGauge,
}

impl ProcessMetrics {
    /// A reload ended, applied (`ok`) or refused (`error`).
    pub fn reloaded(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.config_reloads.with_label_values(&[result]).inc();
    }

    /// The drain began.
    pub fn draining(&self) {
        self.draining.set(1);
    }

    /// The runtime runs the gateway's tasks on `n` worker threads (`[runtime]`).
    pub fn worker_threads(&self, n: usize) {
        self.runtime_worker_threads
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// The key ring in force holds `keys` keys.
    pub fn key_ring(&self, keys: usize) {
        self.key_ring_keys.set(keys as i64);
    }

    /// Brings the JWKS fetch counters into the registry. The authenticator keeps them as plain
    /// atomics (it is rebuilt on reload, the registry is not), so each series is advanced to
    /// the snapshot's value.
    pub fn sync_jwks(&self, snap: &JwksCountersSnapshot) {
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

    /// Brings the trace exporter's counters into the registry (the exporter belongs to the
    /// process and outlives reloads; it keeps plain atomics, advanced to here on scrape).
    pub fn sync_traces(&self, snap: &TraceCounters) {
        for (result, value) in [
            ("exported", snap.exported),
            ("dropped", snap.dropped),
            ("failed", snap.failed),
        ] {
            let c = self.trace_spans.with_label_values(&[result]);
            let have = c.get();
            if value > have {
                c.inc_by(value - have);
            }
        }
        self.trace_queued_spans
            .set(i64::try_from(snap.queued).unwrap_or(i64::MAX));
    }

    pub(super) fn register(r: &Registrar) -> Self {
        let config_reloads = r.counter_vec_from_start(
            "config_reloads_total",
            "Configuration and key reloads, by result (ok, error).",
            &["result"],
            &[&["ok", "error"]],
        );
        let draining = r.gauge(
            "draining",
            "1 while the gateway drains before exiting, else 0.",
        );
        let key_ring_keys = r.gauge("key_ring_keys", "State keys in the ring (the first seals).");
        let jwks_fetches = r.counter_vec_from_start(
            "jwks_fetches_total",
            "JWKS URL fetches, by outcome (ok, timeout, too_large, bad_status, transport, invalid) and unknown-kid lookups held back by the refresh rate limit (rate_limited).",
            &["outcome"],
            &[&[
                "ok",
                "timeout",
                "too_large",
                "bad_status",
                "transport",
                "invalid",
                "rate_limited",
            ]],
        );
        let trace_spans = r.counter_vec(
            "trace_spans_total",
            "Spans handed to trace export ([tracing]), by result: exported (the collector took them), dropped (tracing.max_queue_spans were already waiting), failed (the collector did not take their batch).",
            &["result"],
        );
        for result in ["exported", "dropped", "failed"] {
            trace_spans.with_label_values(&[result]);
        }
        let trace_queued_spans = r.gauge(
            "trace_queued_spans",
            "Spans waiting for export now (at most tracing.max_queue_spans).",
        );
        let runtime_worker_threads = r.gauge(
            "runtime_worker_threads",
            "Threads that run the gateway's tasks (runtime.worker_threads, or one per CPU the process may use).",
        );
        ProcessMetrics {
            runtime_worker_threads,
            config_reloads,
            draining,
            key_ring_keys,
            jwks_fetches,
            trace_spans,
            trace_queued_spans,
        }
    }
}
