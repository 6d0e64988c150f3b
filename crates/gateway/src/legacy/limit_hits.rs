//! Where the legacy side counts the configured limits it enforces.
//!
//! Sessions and their reader tasks hit limits (a stdout line over `upstream.max_line_bytes`,
//! a stream that cannot be resumed within `upstream.resume_attempts`, all stdio children
//! busy) far from the gateway's [`crate::metrics::Metrics`]; this handle reaches the same
//! `mrtr_gateway_limit_hits_total{limit}` counter from there.

use prometheus::IntCounterVec;

#[derive(Clone, Default)]
pub struct LimitHits(Option<IntCounterVec>);

impl LimitHits {
    /// Counts into `counter` (labelled by limit name).
    pub fn new(counter: IntCounterVec) -> LimitHits {
        LimitHits(Some(counter))
    }

    /// A handle that counts nothing (tools and tests without metrics).
    pub fn none() -> LimitHits {
        LimitHits(None)
    }

    pub fn hit(&self, limit: &str) {
        if let Some(c) = &self.0 {
            c.with_label_values(&[limit]).inc();
        }
    }

    /// Counts the SSE size limit an error reports, if it is one.
    pub fn sse(&self, e: &mrtr_wire::sse::SseError) {
        match e {
            mrtr_wire::sse::SseError::EventTooLarge { .. } => self.hit("upstream_max_event_bytes"),
            mrtr_wire::sse::SseError::StreamTooLarge { .. } => {
                self.hit("upstream_max_stream_bytes")
            }
            mrtr_wire::sse::SseError::NotUtf8 => {}
        }
    }
}

impl std::fmt::Debug for LimitHits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LimitHits")
    }
}
