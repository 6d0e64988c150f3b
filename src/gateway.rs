//! The gateway's shared state: configuration, upstream client, state codec, caches, metrics.

use std::sync::Arc;

use arc_swap::ArcSwap;

use http::{HeaderMap, StatusCode};
use tokio::sync::mpsc;

use crate::config::Config;
use crate::discover::DiscoverCache;
use crate::error::{Fault, Rejection};
use crate::jsonrpc::codes;
use crate::legacy::capabilities::Declared;
use crate::legacy::http::HttpError;
use crate::legacy::limit_hits::LimitHits;
use crate::legacy::session::{Inbound, LegacySession, SessionError};
use crate::legacy::upstream::Upstream;
use crate::metrics::Metrics;
use crate::state::StateCodec;

pub struct Gateway {
    config: ArcSwap<Config>,
    upstream: ArcSwap<Upstream>,
    pub codec: StateCodec,
    pub discover: DiscoverCache,
    pub metrics: Metrics,
    /// This process's identity among replicas (logs, metrics, parking references).
    pub instance_id: String,
}

/// A random instance id: 8 bytes, hex.
pub fn random_instance_id() -> String {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).expect("the OS random source failed");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Gateway {
    pub fn new(config: Config) -> Arc<Gateway> {
        let instance_id = config.replica.id.clone().unwrap_or_else(random_instance_id);
        let metrics = Metrics::new(&instance_id);
        let hits = LimitHits::new(metrics.limit_hits.clone());
        Arc::new(Gateway {
            upstream: ArcSwap::from_pointee(Upstream::from_config(&config.upstream, hits)),
            codec: StateCodec::new(&config.state.keys, config.state.ttl, config.state.max_bytes)
                .with_clock_skew(config.state.clock_skew),
            discover: DiscoverCache::new(config.discover.refresh),
            metrics,
            instance_id,
            config: ArcSwap::from_pointee(config),
        })
    }

    /// The configuration in force (a snapshot: hold it for one request, not longer).
    pub fn config(&self) -> Arc<Config> {
        self.config.load_full()
    }

    /// The legacy server in force.
    pub fn upstream(&self) -> Arc<Upstream> {
        self.upstream.load_full()
    }

    /// Opens a legacy session declaring what `declared` allows, in the shape of the legacy
    /// version the server is expected to negotiate.
    pub async fn open_session(
        &self,
        declared: &Declared,
        headers: HeaderMap,
    ) -> Result<(LegacySession, mpsc::Receiver<Inbound>), Rejection> {
        match self.upstream().open(declared, headers).await {
            Ok((mut session, rx)) => {
                self.metrics.legacy_sessions_opened.inc();
                session.track_with(self.metrics.legacy_sessions_active.clone());
                self.discover.observe(session.init_result());
                Ok((session, rx))
            }
            Err(e) => {
                let rej = session_rejection(&e);
                self.metrics
                    .legacy_sessions_failed
                    .with_label_values(&[rej.reason])
                    .inc();
                Err(rej)
            }
        }
    }
}

/// How a legacy-session failure is reported to the modern client.
pub fn session_rejection(e: &SessionError) -> Rejection {
    match e {
        SessionError::Http(HttpError::Timeout(_)) => {
            Rejection::upstream_timeout(e.to_string(), "upstream_timeout")
        }
        SessionError::Http(HttpError::Connect(_)) => {
            Rejection::upstream(e.to_string(), "upstream_unreachable")
        }
        SessionError::Http(HttpError::TooLarge(_)) => {
            Rejection::upstream(e.to_string(), "upstream_too_large")
        }
        SessionError::Http(_) => Rejection::upstream(e.to_string(), "upstream_http_error"),
        SessionError::Initialize(_) => {
            Rejection::upstream(e.to_string(), "upstream_initialize_failed")
        }
        SessionError::Expired => Rejection::upstream(e.to_string(), "upstream_session_expired"),
        SessionError::Protocol(_) => Rejection::upstream(e.to_string(), "upstream_protocol_error"),
        SessionError::Spawn(_) => Rejection::upstream(e.to_string(), "upstream_spawn_failed"),
        SessionError::Gone(_) => Rejection::upstream(e.to_string(), "upstream_stream_broken"),
        SessionError::Backoff { retry_in, .. } => Rejection::new(
            StatusCode::SERVICE_UNAVAILABLE,
            codes::INTERNAL_ERROR,
            e.to_string(),
            Fault::Upstream,
            "upstream_spawn_backoff",
        )
        .with_header(http::header::RETRY_AFTER, retry_after(*retry_in)),
        SessionError::Saturated { .. } => {
            Rejection::unavailable(e.to_string(), "stdio_max_children")
                .with_header(http::header::RETRY_AFTER, "1")
        }
    }
}

/// Whole seconds for `Retry-After`, at least 1.
fn retry_after(d: std::time::Duration) -> String {
    d.as_secs_f64().ceil().max(1.0).to_string()
}
