//! A legacy session, whatever the transport underneath, and what it delivers.
//!
//! The engine talks to [`LegacySession`] only: open (through [`super::upstream::Upstream`]),
//! send a request, answer server requests, notify, cancel, and end the session either cleanly
//! ([`LegacySession::close`]) or because something went wrong ([`LegacySession::discard_expired`]
//! for a session the server already forgot). Everything the server sends arrives on one
//! channel as [`Inbound`] items tagged with the stream they came on.
//!
//! Three transports sit behind it: Streamable HTTP ([`HttpSession`]), the 2024-11-05
//! HTTP+SSE transport ([`SseSession`]) and a stdio child process ([`StdioSession`]). The
//! single-channel ones (SSE, stdio) tag a response `Call(id)` and everything else `Get`.

use http::HeaderName;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::SendError;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use super::http::HttpError;
use super::http_sse::SseSession;
use super::stdio::StdioSession;
use super::streamable_http::HttpSession;
use mrtr_wire::jsonrpc::ErrorObject;

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
///
/// An item is kept to 24 bytes (a test holds it there), so a message and an end are boxed:
/// tokio allocates a channel's first block of 32 items with the channel, and a session's
/// channel lives as long as the session, a pooled or parked one included (48-byte items made
/// that block 1,568 bytes; 24-byte items make it 800).
#[derive(Debug)]
pub enum Inbound {
    Message(StreamTag, Box<Value>),
    Ended(Box<StreamEnd>),
    /// A request's response stream, still to be read: whoever reads the session reads it
    /// too (see [`super::exchange::Reader`]), so a call's answer reaches the task waiting on
    /// it without crossing a task of its own. What it reads arrives as the items above.
    Stream(CallStream),
}

/// The end of one of the server's streams.
#[derive(Debug)]
pub struct StreamEnd {
    pub stream: StreamTag,
    /// `None` for a clean end of stream.
    pub error: Option<String>,
}

impl Inbound {
    pub fn message(tag: StreamTag, msg: Value) -> Inbound {
        Inbound::Message(tag, Box::new(msg))
    }

    pub fn ended(stream: StreamTag, error: Option<String>) -> Inbound {
        Inbound::Ended(Box::new(StreamEnd { stream, error }))
    }
}

/// Puts `item` on a session's channel: at once when there is room, else (the reader is
/// behind) by waiting in a box. Readers of a session's streams live as long as the streams,
/// and what they await is part of their state for all that time; an awaited `send` would
/// keep room for the wait (about 250 bytes) in every one of them. `Err` when nobody reads the
/// channel any more.
pub fn deliver(tx: &mpsc::Sender<Inbound>, item: Inbound) -> Delivery<'_> {
    match tx.try_send(item) {
        Ok(()) => Delivery::Done(Ok(())),
        Err(mpsc::error::TrySendError::Closed(_)) => Delivery::Done(Err(())),
        Err(mpsc::error::TrySendError::Full(item)) => Delivery::Waiting(Box::pin(tx.send(item))),
    }
}

/// One item on its way to a session's channel (see [`deliver`]).
pub enum Delivery<'a> {
    Done(Result<(), ()>),
    Waiting(Pin<Box<dyn Future<Output = Result<(), SendError<Inbound>>> + Send + Sync + 'a>>),
}

impl Future for Delivery<'_> {
    type Output = Result<(), ()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), ()>> {
        match &mut *self {
            Delivery::Done(done) => Poll::Ready(*done),
            Delivery::Waiting(send) => send.as_mut().poll(cx).map(|r| r.map_err(drop)),
        }
    }
}

/// A session's closing, under way (see [`LegacySession::close`]).
pub type Closing = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The reading of one response stream: a future that delivers onto the session's channel.
pub type Reading = Pin<Box<dyn Future<Output = ()> + Send + Sync>>;

/// A response stream's reading, handed over to be polled by the session's reader.
pub struct CallStream(Reading);

impl CallStream {
    pub fn new(reading: impl Future<Output = ()> + Send + Sync + 'static) -> CallStream {
        CallStream(Box::pin(reading))
    }

    /// Reads on; `Ready` once the stream has ended (and its end been delivered).
    pub fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.0.as_mut().poll(cx)
    }

    /// The reading, to go on in a task of its own.
    pub fn into_future(self) -> Reading {
        self.0
    }
}

impl std::fmt::Debug for CallStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CallStream")
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Http(#[from] HttpError),
    #[error("the legacy server no longer knows this session (HTTP 404)")]
    Expired,
    #[error("legacy initialize failed: {0}")]
    Initialize(String),
    /// The legacy server answered `initialize` with an HTTP error status (`body` is for logs).
    #[error("legacy initialize failed: HTTP {status}: {body}")]
    InitializeStatus {
        status: http::StatusCode,
        body: String,
    },
    #[error("the legacy server broke the protocol: {0}")]
    Protocol(String),
    /// The stdio server's command could not be started.
    #[error("{0}")]
    Spawn(String),
    /// The session's process or connection has already ended (the reason says how).
    #[error("{0}")]
    Gone(String),
    /// Recent attempts to start the stdio server failed; the next is not due yet.
    #[error(
        "not starting `{command}` again for another {retry_in:?}: the last {failures} attempt(s) failed (last: {last})"
    )]
    Backoff {
        command: String,
        retry_in: Duration,
        failures: u32,
        last: String,
    },
    /// Every stdio child allowed by `upstream.stdio_max_children` stayed busy.
    #[error(
        "all {limit} legacy processes (upstream.stdio_max_children) stayed busy for {waited:?}"
    )]
    Saturated { limit: usize, waited: Duration },
}

/// One legacy session.
pub enum LegacySession {
    Http(HttpSession),
    Sse(SseSession),
    Stdio(StdioSession),
}

impl LegacySession {
    /// The legacy `InitializeResult`.
    pub fn init_result(&self) -> &Value {
        self.init_arc()
    }

    /// The legacy `InitializeResult`, shared: for a holder that outlives its borrow of the
    /// session.
    pub fn init_shared(&self) -> std::sync::Arc<Value> {
        self.init_arc().clone()
    }

    fn init_arc(&self) -> &std::sync::Arc<Value> {
        match self {
            LegacySession::Http(s) => &s.init_result,
            LegacySession::Sse(s) => &s.init_result,
            LegacySession::Stdio(s) => &s.init_result,
        }
    }

    /// The protocol version the server chose.
    pub fn negotiated_version(&self) -> &str {
        match self {
            LegacySession::Http(s) => &s.negotiated_version,
            LegacySession::Sse(s) => &s.negotiated_version,
            LegacySession::Stdio(s) => &s.negotiated_version,
        }
    }

    /// Counts this session in `gauge` until it ends.
    pub fn track_with(&mut self, gauge: prometheus::IntGauge) {
        match self {
            LegacySession::Http(s) => s.track_with(gauge),
            LegacySession::Sse(s) => s.track_with(gauge),
            LegacySession::Stdio(s) => s.track_with(gauge),
        }
    }

    /// Sends a request; returns the gateway-minted id its response will carry.
    pub async fn request<P: serde::Serialize + Sync + ?Sized>(
        &mut self,
        method: &str,
        params: Option<&P>,
    ) -> Result<i64, SessionError> {
        match self {
            LegacySession::Http(s) => s.request(method, params).await,
            LegacySession::Sse(s) => s.request(method, params).await,
            LegacySession::Stdio(s) => s.request(method, params).await,
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
            LegacySession::Sse(s) => s.respond(id, outcome).await,
            LegacySession::Stdio(s) => s.respond(id, outcome).await,
        }
    }

    pub async fn notify(&self, method: &str, params: Option<Value>) -> Result<(), SessionError> {
        match self {
            LegacySession::Http(s) => s.notify(method, params).await,
            LegacySession::Sse(s) => s.notify(method, params).await,
            LegacySession::Stdio(s) => s.notify(method, params).await,
        }
    }

    /// Asks the server to stop working on request `id`.
    pub async fn cancel(&self, id: i64, reason: &str) -> Result<(), SessionError> {
        match self {
            LegacySession::Http(s) => s.cancel(id, reason).await,
            LegacySession::Sse(s) => s.cancel(id, reason).await,
            LegacySession::Stdio(s) => s.cancel(id, reason).await,
        }
    }

    /// Ends the session cleanly. Boxed: closing is rare next to the calls that may close, and
    /// its HTTP exchange (a DELETE) would otherwise make every future that may close — the
    /// call's own, down to the pool's check-in — as large as that exchange, copied whole at
    /// every step of every call.
    pub fn close(self) -> Closing {
        Box::pin(async move {
            match self {
                LegacySession::Http(s) => s.close().await,
                LegacySession::Sse(s) => s.close(),
                LegacySession::Stdio(s) => s.close().await,
            }
        })
    }

    /// Whether the session can carry another call: its transport is still up and nothing
    /// has gone wrong on it (for a future pool of warm sessions).
    /// Whether server requests may also arrive on a second, standalone stream (Streamable
    /// HTTP's GET stream); such requests can lag behind those on the call's stream.
    pub fn has_get_stream(&self) -> bool {
        match self {
            LegacySession::Http(s) => s.has_get_stream,
            _ => false,
        }
    }

    pub fn is_healthy(&self) -> bool {
        match self {
            // Expiry only shows when the next request gets 404 (`SessionError::Expired`).
            LegacySession::Http(_) => true,
            LegacySession::Sse(s) => s.is_healthy(),
            LegacySession::Stdio(s) => s.is_healthy(),
        }
    }

    /// Drops a session the server has already forgotten.
    pub fn discard_expired(self) {
        match self {
            LegacySession::Http(s) => s.discard_expired(),
            LegacySession::Sse(s) => s.close(),
            // Dropping a stdio session kills its child (see `legacy::stdio`).
            LegacySession::Stdio(s) => drop(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A session's channel keeps a block of 32 items from its start for as long as the
    /// session lives; 48-byte items made that 1,568 bytes per pooled or parked session.
    #[test]
    fn an_inbound_item_stays_at_24_bytes() {
        assert_eq!(std::mem::size_of::<Inbound>(), 24);
    }
}
