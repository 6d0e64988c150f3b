//! The configured legacy server: how to open sessions with it.

use std::sync::Arc;

use http::HeaderMap;
use tokio::sync::mpsc;

use super::capabilities::Declared;
use super::http::UpstreamHttp;
use super::session::{Inbound, LegacySession, SessionError};
use super::streamable_http::HttpSession;
use crate::config::UpstreamConfig;

pub enum Upstream {
    /// Streamable HTTP (2025-03-26 … 2025-11-25).
    Http(Arc<UpstreamHttp>),
}

impl Upstream {
    pub fn from_config(cfg: &UpstreamConfig) -> Upstream {
        Upstream::Http(Arc::new(UpstreamHttp::new(cfg)))
    }

    /// Where the legacy server is, for logs.
    pub fn describe(&self) -> String {
        match self {
            Upstream::Http(h) => h.url.to_string(),
        }
    }

    /// Whether the legacy server accepts connections (readiness): a TCP connect within
    /// `timeout`. Cheap on purpose; a full `initialize` happens on the next call anyway.
    pub async fn probe(&self, timeout: std::time::Duration) -> Result<(), String> {
        match self {
            Upstream::Http(h) => {
                let host = h.url.host_str().unwrap_or("localhost").to_string();
                let port = h.url.port_or_known_default().unwrap_or(80);
                match tokio::time::timeout(
                    timeout,
                    tokio::net::TcpStream::connect((host.as_str(), port)),
                )
                .await
                {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(e)) => Err(format!("cannot connect to {host}:{port}: {e}")),
                    Err(_) => Err(format!("no connection to {host}:{port} within {timeout:?}")),
                }
            }
        }
    }

    /// The legacy version the next session is expected to negotiate.
    pub fn request_version(&self) -> String {
        match self {
            Upstream::Http(h) => h.request_version(),
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
        }
    }
}
