//! The configured legacy server: how to open sessions with it, whatever its transport.

use std::sync::Arc;

use http::HeaderMap;
use tokio::sync::mpsc;

use super::http::UpstreamHttp;
use super::http_sse::SseSession;
use super::session::{Inbound, LegacySession, SessionError};
use super::stdio_upstream::StdioUpstream;
use super::streamable_http::HttpSession;
use crate::config::redact::redacted_url;
use crate::config::{UpstreamConfig, UpstreamTransport};
use crate::metrics::{ConnMetrics, LimitHits};
use mrtr_wire::capabilities::Declared;

pub enum Upstream {
    /// Streamable HTTP (2025-03-26 … 2025-11-25).
    Http(Arc<UpstreamHttp>),
    /// HTTP+SSE (2024-11-05): `url` is the SSE endpoint.
    Sse(Arc<UpstreamHttp>),
    /// A child process per session.
    Stdio(Arc<StdioUpstream>),
}

impl Upstream {
    /// The upstream `cfg` describes; limits it enforces are counted in `hits`, HTTP
    /// connections to it in `conns`.
    pub fn from_config(cfg: &UpstreamConfig, hits: LimitHits, conns: ConnMetrics) -> Upstream {
        match cfg.transport {
            UpstreamTransport::StreamableHttp => {
                Upstream::Http(Arc::new(UpstreamHttp::new(cfg, hits, conns)))
            }
            UpstreamTransport::Sse => Upstream::Sse(Arc::new(UpstreamHttp::new(cfg, hits, conns))),
            UpstreamTransport::Stdio => Upstream::Stdio(Arc::new(StdioUpstream::new(cfg, hits))),
        }
    }

    /// Where the legacy server is, for logs (URL userinfo redacted).
    pub fn describe(&self) -> String {
        match self {
            Upstream::Http(h) => redacted_url(&h.url),
            Upstream::Sse(h) => format!("{} (HTTP+SSE)", redacted_url(&h.url)),
            Upstream::Stdio(s) => format!("stdio: {}", s.describe()),
        }
    }

    /// Whether opening a session now would have to wait for a live one to end (stdio: every
    /// child slot taken).
    pub fn at_capacity(&self) -> bool {
        match self {
            Upstream::Stdio(s) => s.at_capacity(),
            _ => false,
        }
    }

    /// The legacy version the next session is expected to negotiate.
    pub fn request_version(&self) -> String {
        match self {
            Upstream::Http(h) | Upstream::Sse(h) => h.versions.request_version(),
            Upstream::Stdio(s) => s.versions.request_version(),
        }
    }

    /// Opens a session declaring what `declared` allows (in the shapes of the expected
    /// version), sending `headers` on every request where the transport has headers.
    pub async fn open(
        &self,
        declared: &Declared,
        headers: HeaderMap,
    ) -> Result<(LegacySession, mpsc::Receiver<Inbound>), SessionError> {
        let capabilities = declared.to_legacy(&self.request_version());
        match self {
            Upstream::Http(h) => {
                let (s, rx) = HttpSession::open(h.clone(), capabilities, headers).await?;
                Ok((LegacySession::Http(s), rx))
            }
            Upstream::Sse(h) => {
                let (s, rx) = SseSession::open(h.clone(), capabilities, headers).await?;
                Ok((LegacySession::Sse(s), rx))
            }
            Upstream::Stdio(u) => {
                let (s, rx) = u.open(capabilities).await?;
                Ok((LegacySession::Stdio(s), rx))
            }
        }
    }
}
