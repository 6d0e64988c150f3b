//! What the parking lot ([`crate::mrtr::parking::ParkingLot`]) records: the legacy calls parked
//! between rounds, and those cancelled without being resumed.

use prometheus::{IntCounterVec, IntGauge};

use super::Registrar;

pub struct ParkingMetrics {
    parked: IntGauge,
    evictions: IntCounterVec,
}

impl ParkingMetrics {
    /// `n` calls are parked now.
    pub fn parked_now(&self, n: usize) {
        self.parked.set(n as i64);
    }

    /// A parked call was cancelled without being resumed, for `reason` (`expired`,
    /// `overflow`, `stream_ended`, `shutdown`).
    pub fn evicted(&self, reason: &str) {
        self.evictions.with_label_values(&[reason]).inc();
    }

    pub(super) fn register(r: &Registrar) -> Self {
        let parked = r.gauge(
            "parked_calls",
            "Legacy calls parked now, waiting for their retry.",
        );
        let evictions = r.counter_vec_from_start(
            "parked_evictions_total",
            "Parked calls cancelled without being resumed, by reason (expired, overflow, stream_ended, shutdown).",
            &["reason"],
            &[&["expired", "overflow", "stream_ended", "shutdown"]],
        );
        ParkingMetrics { parked, evictions }
    }
}
