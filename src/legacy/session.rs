//! A legacy session, whatever the transport underneath, and what it delivers.
//!
//! The engine talks to [`LegacySession`] only: open (through [`super::upstream::Upstream`]),
//! send a request, answer server requests, notify, cancel, and end the session either cleanly
//! ([`LegacySession::close`]) or because something went wrong ([`LegacySession::discard_expired`]
//! for a session the server already forgot). Everything the server sends arrives on one
//! channel as [`Inbound`] items tagged with the stream they came on.

use http::HeaderName;
use serde_json::Value;

use super::http::HttpError;
use super::streamable_http::HttpSession;
use crate::jsonrpc::ErrorObject;

pub const SESSION_HEADER: HeaderName = HeaderName::from_static("mcp-session-id");
pub const VERSION_HEADER: HeaderName = HeaderName::from_static("mcp-protocol-version");

/// Which stream a message arrived on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamTag {
    /// The standalone GET stream (or, for single-channel transports, anything not tied to a
    /// request of ours).
    Get,
    /// The response stream of the request with this (gateway-minted) id.
    Call(i64),
}

/// Something the legacy server sent, or the end of one of its streams.
#[derive(Debug)]
pub enum Inbound {
    Message(StreamTag, Value),
    Ended {
        stream: StreamTag,
        /// `None` for a clean end of stream.
        error: Option<String>,
    },
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Http(#[from] HttpError),
    #[error("the legacy server no longer knows this session (HTTP 404)")]
    Expired,
    #[error("legacy initialize failed: {0}")]
    Initialize(String),
    #[error("the legacy server broke the protocol: {0}")]
    Protocol(String),
}

/// One legacy session.
pub enum LegacySession {
    Http(HttpSession),
}

impl LegacySession {
    /// The legacy `InitializeResult`.
    pub fn init_result(&self) -> &Value {
        match self {
            LegacySession::Http(s) => &s.init_result,
        }
    }

    /// The protocol version the server chose.
    pub fn negotiated_version(&self) -> &str {
        match self {
            LegacySession::Http(s) => &s.negotiated_version,
        }
    }

    /// Counts this session in `gauge` until it ends.
    pub fn track_with(&mut self, gauge: prometheus::IntGauge) {
        match self {
            LegacySession::Http(s) => s.track_with(gauge),
        }
    }

    /// Sends a request; returns the gateway-minted id its response will carry.
    pub async fn request(
        &mut self,
        method: &str,
        params: Option<Value>,
    ) -> Result<i64, SessionError> {
        match self {
            LegacySession::Http(s) => s.request(method, params).await,
        }
    }

    /// Answers a server request.
    pub async fn respond(
        &self,
        id: &Value,
        outcome: Result<Value, ErrorObject>,
    ) -> Result<(), SessionError> {
        match self {
            LegacySession::Http(s) => s.respond(id, outcome).await,
        }
    }

    pub async fn notify(&self, method: &str, params: Option<Value>) -> Result<(), SessionError> {
        match self {
            LegacySession::Http(s) => s.notify(method, params).await,
        }
    }

    /// Asks the server to stop working on request `id`.
    pub async fn cancel(&self, id: i64, reason: &str) -> Result<(), SessionError> {
        match self {
            LegacySession::Http(s) => s.cancel(id, reason).await,
        }
    }

    /// Ends the session cleanly.
    pub async fn close(self) {
        match self {
            LegacySession::Http(s) => s.close().await,
        }
    }

    /// Drops a session the server has already forgotten.
    pub fn discard_expired(self) {
        match self {
            LegacySession::Http(s) => s.discard_expired(),
        }
    }
}
