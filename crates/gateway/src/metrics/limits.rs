//! `limit_hits_total{limit}`: the configured limits the gateway enforces, as a closed set.
//!
//! A limit is named by a [`Limit`] value, not a string, so a misspelt name is a compile error
//! rather than a new series on the dashboard. Every label is listed in `docs/metrics.md`.

use prometheus::IntCounterVec;

/// A configured limit that can be hit; [`Limit::label`] is its `limit` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    // The MCP listener and its connections.
    MaxConnections,
    MaxConnectionsPerSource,
    HeaderReadTimeout,
    IdleTimeout,
    TlsHandshakeTimeout,
    // The request path.
    MaxBodyBytes,
    BodyReadTimeout,
    MaxConcurrentRequests,
    // The admin listener.
    AdminMaxConnections,
    AdminHeaderReadTimeout,
    AdminIdleTimeout,
    AdminAllowedHosts,
    // MRTR: state, parking, single use.
    StateMaxBytes,
    ParkingFull,
    ParkingPerPrincipal,
    ParkingStdioReserve,
    ParkingNewcomerReserve,
    SingleUseMaxEntriesPerPrincipal,
    LongCallsMaxRunning,
    LongCallsPerPrincipal,
    SingleUseNewcomerReserve,
    TasksMaxRunning,
    TasksPerPrincipal,
    TasksMaxKept,
    // The legacy server.
    UpstreamMaxEventBytes,
    UpstreamMaxStreamBytes,
    UpstreamMaxLineBytes,
    UpstreamResumeAttempts,
    StdioMaxChildren,
    // Listen streams and legacy clients.
    MaxListenStreams,
    MaxListenStreamsPerPrincipal,
    ListenStreamsNewcomerReserve,
    MaxResourceSubscriptions,
    MaxLegacyGetStreams,
    MaxLegacyGetStreamsPerPrincipal,
    LegacyGetStreamsNewcomerReserve,
    LegacyPassthroughCallTimeout,
}

impl Limit {
    /// Every limit (keep in step with the enum: the documentation test walks this list).
    pub const ALL: [Limit; 37] = [
        Limit::MaxConnections,
        Limit::MaxConnectionsPerSource,
        Limit::HeaderReadTimeout,
        Limit::IdleTimeout,
        Limit::TlsHandshakeTimeout,
        Limit::MaxBodyBytes,
        Limit::BodyReadTimeout,
        Limit::MaxConcurrentRequests,
        Limit::AdminMaxConnections,
        Limit::AdminHeaderReadTimeout,
        Limit::AdminIdleTimeout,
        Limit::AdminAllowedHosts,
        Limit::StateMaxBytes,
        Limit::ParkingFull,
        Limit::ParkingPerPrincipal,
        Limit::ParkingStdioReserve,
        Limit::ParkingNewcomerReserve,
        Limit::SingleUseMaxEntriesPerPrincipal,
        Limit::LongCallsMaxRunning,
        Limit::LongCallsPerPrincipal,
        Limit::SingleUseNewcomerReserve,
        Limit::TasksMaxRunning,
        Limit::TasksPerPrincipal,
        Limit::TasksMaxKept,
        Limit::UpstreamMaxEventBytes,
        Limit::UpstreamMaxStreamBytes,
        Limit::UpstreamMaxLineBytes,
        Limit::UpstreamResumeAttempts,
        Limit::StdioMaxChildren,
        Limit::MaxListenStreams,
        Limit::MaxListenStreamsPerPrincipal,
        Limit::ListenStreamsNewcomerReserve,
        Limit::MaxResourceSubscriptions,
        Limit::MaxLegacyGetStreams,
        Limit::MaxLegacyGetStreamsPerPrincipal,
        Limit::LegacyGetStreamsNewcomerReserve,
        Limit::LegacyPassthroughCallTimeout,
    ];

    /// The `limit` label value.
    pub fn label(self) -> &'static str {
        match self {
            Limit::MaxConnections => "max_connections",
            Limit::MaxConnectionsPerSource => "max_connections_per_source",
            Limit::HeaderReadTimeout => "header_read_timeout",
            Limit::IdleTimeout => "idle_timeout",
            Limit::TlsHandshakeTimeout => "tls_handshake_timeout",
            Limit::MaxBodyBytes => "max_body_bytes",
            Limit::BodyReadTimeout => "body_read_timeout",
            Limit::MaxConcurrentRequests => "max_concurrent_requests",
            Limit::AdminMaxConnections => "admin_max_connections",
            Limit::AdminHeaderReadTimeout => "admin_header_read_timeout",
            Limit::AdminIdleTimeout => "admin_idle_timeout",
            Limit::AdminAllowedHosts => "admin_allowed_hosts",
            Limit::StateMaxBytes => "state_max_bytes",
            Limit::ParkingFull => "parking_full",
            Limit::ParkingPerPrincipal => "parking_per_principal",
            Limit::ParkingStdioReserve => "parking_stdio_reserve",
            Limit::ParkingNewcomerReserve => "parking_newcomer_reserve",
            Limit::SingleUseMaxEntriesPerPrincipal => "single_use_max_entries_per_principal",
            Limit::LongCallsMaxRunning => "long_calls_max_running",
            Limit::LongCallsPerPrincipal => "long_calls_max_running_per_principal",
            Limit::SingleUseNewcomerReserve => "single_use_newcomer_reserve",
            Limit::TasksMaxRunning => "tasks_max_running",
            Limit::TasksPerPrincipal => "tasks_max_running_per_principal",
            Limit::TasksMaxKept => "tasks_max_kept",
            Limit::UpstreamMaxEventBytes => "upstream_max_event_bytes",
            Limit::UpstreamMaxStreamBytes => "upstream_max_stream_bytes",
            Limit::UpstreamMaxLineBytes => "upstream_max_line_bytes",
            Limit::UpstreamResumeAttempts => "upstream_resume_attempts",
            Limit::StdioMaxChildren => "stdio_max_children",
            Limit::MaxListenStreams => "max_listen_streams",
            Limit::MaxListenStreamsPerPrincipal => "max_listen_streams_per_principal",
            Limit::ListenStreamsNewcomerReserve => "listen_streams_newcomer_reserve",
            Limit::MaxResourceSubscriptions => "max_resource_subscriptions",
            Limit::MaxLegacyGetStreams => "max_legacy_get_streams",
            Limit::MaxLegacyGetStreamsPerPrincipal => "max_legacy_get_streams_per_principal",
            Limit::LegacyGetStreamsNewcomerReserve => "legacy_get_streams_newcomer_reserve",
            Limit::LegacyPassthroughCallTimeout => "legacy_passthrough_call_timeout",
        }
    }
}

/// Where hit limits are counted. Cheap to clone: every layer that enforces a limit (the
/// listeners, the request path, the engine, the legacy transports far down in their reader
/// tasks) holds one.
#[derive(Clone, Default)]
pub struct LimitHits(Option<IntCounterVec>);

impl LimitHits {
    /// Counts into `counter`, a vector labelled by `limit`.
    pub fn new(counter: IntCounterVec) -> LimitHits {
        LimitHits(Some(counter))
    }

    /// A handle that counts nothing (tools and tests without metrics).
    pub fn none() -> LimitHits {
        LimitHits(None)
    }

    /// `limit` was hit once.
    pub fn hit(&self, limit: Limit) {
        if let Some(c) = &self.0 {
            c.with_label_values(&[limit.label()]).inc();
        }
    }

    /// Counts the SSE size limit an error reports, if it is one.
    pub fn sse(&self, e: &mrtr_wire::sse::SseError) {
        match e {
            mrtr_wire::sse::SseError::EventTooLarge { .. } => {
                self.hit(Limit::UpstreamMaxEventBytes)
            }
            mrtr_wire::sse::SseError::StreamTooLarge { .. } => {
                self.hit(Limit::UpstreamMaxStreamBytes)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hit_is_counted_under_its_label() {
        let c = IntCounterVec::new(prometheus::Opts::new("hits", "hits"), &["limit"]).unwrap();
        let hits = LimitHits::new(c.clone());
        hits.hit(Limit::MaxListenStreams);
        hits.hit(Limit::MaxListenStreams);
        LimitHits::none().hit(Limit::MaxListenStreams);
        assert_eq!(c.with_label_values(&["max_listen_streams"]).get(), 2);
    }

    #[test]
    fn every_limit_is_documented_once_under_its_own_label() {
        let doc = include_str!("../../../../docs/metrics.md");
        let table = doc
            .split("## `limit_hits_total{limit}`")
            .nth(1)
            .expect("docs/metrics.md has the limit table");
        let mut seen = std::collections::HashSet::new();
        for limit in Limit::ALL {
            assert!(seen.insert(limit.label()), "{limit:?}: label used twice");
            assert!(
                table.contains(&format!("`{}`", limit.label())),
                "{limit:?} ({}) is missing from docs/metrics.md",
                limit.label()
            );
        }
    }
}
