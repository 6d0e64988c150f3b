//! Reading one Streamable HTTP response stream (a call's POST response, or the standalone GET
//! stream) to its end, reconnecting when the server only closed the *connection*.
//!
//! **SSE polling (2025-11-25).** A server may start a stream with a priming event (an `id`,
//! empty `data`, maybe `retry: <ms>`), then close the connection while the stream goes on.
//! The client waits `retry` (1 s when the server named none; never more than
//! `upstream.resume_max_delay`) and sends `GET` with `Last-Event-ID` to pick the stream up
//! where it stopped. The reader does exactly that whenever a stream ends without the
//! response it carries and an event id has been seen; without an id a call stream cannot be
//! resumed and ends with an error, as before. The standalone GET stream is reopened after
//! any end: resumed from its last id when it had one, fresh otherwise (a plain GET stream
//! has no position to lose beyond what was in flight).
//!
//! **Bounds.** `upstream.resume_attempts` reconnects in a row that fail or bring nothing (not
//! even a keep-alive comment) end the stream, counted as
//! `limit_hits_total{limit="upstream_resume_attempts"}`; a call stream also ends when no
//! message has arrived for `upstream.idle_timeout`, across reconnects.
//!
//! **Stateless servers.** A server that issued no `Mcp-Session-Id` cannot tie the answer to
//! a server request back to the call waiting for it: the answer arrives as an unrelated POST
//! (the Python and TypeScript SDKs build a fresh transport per stateless POST). So a server
//! request on such a stream ends the call at once with an error saying so, instead of a call
//! that hangs until a timeout.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::legacy::http::UpstreamBody;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::http::{UpstreamHttp, post_headers, read_body};
use super::session::{Inbound, SESSION_HEADER, StreamTag, VERSION_HEADER, deliver};
use super::wire::{excerpt, is_request, is_response_to, messages_of, method_of};
use mrtr_wire::sse::SseDecoder;

/// Reconnect delay when the server named none.
pub const DEFAULT_RETRY: Duration = Duration::from_secs(1);

const LAST_EVENT_ID: HeaderName = HeaderName::from_static("last-event-id");

/// What every reader of one session shares.
#[derive(Clone)]
pub struct StreamContext {
    pub http: Arc<UpstreamHttp>,
    /// The session's id, protocol version and forwarded headers, for a reconnecting GET.
    pub headers: Arc<SessionHeaders>,
    pub tx: mpsc::Sender<Inbound>,
    /// The server issued no session id.
    pub stateless: bool,
    /// Cancelled when the session is being closed: a stream that ends then is not reopened.
    pub closing: tokio_util::sync::CancellationToken,
}

/// What every request of a session carries besides its own headers, kept once and shared
/// by the session and its streams: a stream builds its reconnecting GET's headers from it
/// only when it reconnects, rather than keeping a header map ready for as long as it lives.
#[derive(Clone)]
pub struct SessionHeaders {
    pub session_id: Option<HeaderValue>,
    /// `MCP-Protocol-Version`, for a server of 2025-06-18 or later.
    pub version: Option<HeaderValue>,
    /// Forwarded credentials, trace context.
    pub extra: HeaderMap,
}

impl SessionHeaders {
    /// Headers for a POST of one JSON-RPC message.
    pub fn post(&self) -> HeaderMap {
        let mut h = post_headers();
        if let Some(sid) = &self.session_id {
            h.insert(SESSION_HEADER, sid.clone());
        }
        if let Some(v) = &self.version {
            h.insert(VERSION_HEADER, v.clone());
        }
        for (k, v) in &self.extra {
            h.insert(k.clone(), v.clone());
        }
        h
    }

    /// Headers for a GET on the endpoint (the standalone stream, or a resumption).
    pub fn get(&self) -> HeaderMap {
        let mut h = self.post();
        h.remove(header::CONTENT_TYPE);
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static("text/event-stream"),
        );
        h
    }
}

/// How one connection of a stream ended.
enum ConnectionEnd {
    /// Nothing more to do: the call's response came, or nobody listens any more.
    Finished,
    /// The connection closed (cleanly, or with this transport error) before the stream did.
    Dropped(Option<String>),
    /// A protocol error or a limit: the stream cannot go on.
    Fatal(String),
}

/// Where a stream stands across its connections.
struct Cursor {
    last_id: Option<String>,
    retry: Option<Duration>,
    /// The call's response has been forwarded.
    answered: bool,
    /// The current connection brought some bytes.
    progressed: bool,
    /// When the last message arrived (the call stream's idle clock).
    last_message: Instant,
}

/// Why a reconnect did not give a stream.
enum ReconnectError {
    /// Worth another attempt.
    Retry(String),
    /// The server refused the event id; a fresh GET stream may still be had.
    StaleId(String),
    Fatal(String),
}

impl StreamContext {
    /// Forwards every message of `resp` (and of its resumptions) tagged `tag`, then its end.
    ///
    /// The returned future lives for as long as its stream: a session's GET stream for the
    /// session's life, a parked call's stream while the call waits (two per parked call). So
    /// its state is kept small, and a test holds it to a budget: what the stream keeps
    /// between reads is one [`StreamReader`] that the steps borrow (an `async fn` keeps two
    /// copies of what it is given), a reconnect, the step with the largest state and a rare
    /// one, is boxed where it is awaited, and a delivery waits in a box only when the
    /// channel is full (see [`deliver`]).
    pub fn run(
        self,
        tag: StreamTag,
        resp: hyper::Response<UpstreamBody>,
        sse: bool,
    ) -> impl Future<Output = ()> + Send + Sync + 'static {
        let limits = &self.http.limits;
        let mut reader = StreamReader {
            dec: SseDecoder::new(limits.max_event_bytes, limits.max_stream_bytes),
            ctx: self,
            tag,
            body: Some(resp.into_body()),
            cursor: Cursor {
                last_id: None,
                retry: None,
                answered: false,
                progressed: false,
                last_message: Instant::now(),
            },
        };
        async move {
            let error = if sse {
                reader.follow().await.err()
            } else {
                // A JSON answer is read in one go, soon after it starts: boxed, so that its
                // state is no part of the long-lived streams' (it would be the largest).
                Box::pin(reader.read_json()).await.err()
            };
            let end = Inbound::ended(tag, error);
            let _ = deliver(&reader.ctx.tx, end).await;
        }
    }
}

/// What one stream keeps between reads.
struct StreamReader {
    ctx: StreamContext,
    tag: StreamTag,
    /// The current connection's body; `None` between connections.
    body: Option<UpstreamBody>,
    /// The current connection's decoder (each connection is an SSE stream of its own).
    dec: SseDecoder,
    cursor: Cursor,
}

impl StreamReader {
    async fn read_json(&mut self) -> Result<(), String> {
        let limits = &self.ctx.http.limits;
        let Some(body) = self.body.take() else {
            return Ok(());
        };
        let bytes = read_body(body, limits.max_event_bytes, limits.idle_timeout)
            .await
            .map_err(|e| e.to_string())?;
        for m in messages_of(&String::from_utf8_lossy(&bytes))? {
            if deliver(&self.ctx.tx, Inbound::message(self.tag, m))
                .await
                .is_err()
            {
                break;
            }
        }
        Ok(())
    }

    async fn follow(&mut self) -> Result<(), String> {
        let mut fruitless: u32 = 0;
        loop {
            let end = self.read_connection().await;
            // The connection is done with: let it go before waiting to reconnect.
            self.body = None;
            let limits = &self.ctx.http.limits;
            let dropped = match end {
                ConnectionEnd::Finished => return Ok(()),
                ConnectionEnd::Fatal(e) => return Err(e),
                // The session is being deleted: the server ended its streams.
                ConnectionEnd::Dropped(_) if self.ctx.closing.is_cancelled() => return Ok(()),
                ConnectionEnd::Dropped(error) => error,
            };
            if let StreamTag::Call(_) = self.tag {
                if self.cursor.last_id.is_none() {
                    return Err(dropped.unwrap_or_else(|| {
                        "the stream closed before the response, and without event ids it cannot be resumed".into()
                    }));
                }
                if self.cursor.last_message.elapsed() >= limits.idle_timeout {
                    return Err(format!(
                        "the legacy server sent nothing for {:?} (upstream.idle_timeout), across reconnects",
                        limits.idle_timeout
                    ));
                }
            }
            if self.cursor.progressed {
                fruitless = 0;
            }
            let mut last_error = dropped.unwrap_or_else(|| "the connection closed".into());
            let body = loop {
                fruitless += 1;
                if fruitless > limits.resume_attempts {
                    limits
                        .hits
                        .hit(crate::metrics::Limit::UpstreamResumeAttempts);
                    return Err(format!(
                        "gave up resuming the stream after {} reconnects without progress (upstream.resume_attempts); last: {last_error}",
                        limits.resume_attempts
                    ));
                }
                let delay = self
                    .cursor
                    .retry
                    .unwrap_or(DEFAULT_RETRY)
                    .min(limits.resume_max_delay);
                tokio::time::sleep(delay).await;
                match Box::pin(self.ctx.reconnect(self.cursor.last_id.as_deref())).await {
                    Ok(b) => break b,
                    Err(ReconnectError::Fatal(e)) => return Err(e),
                    Err(ReconnectError::StaleId(e)) if self.tag == StreamTag::Get => {
                        // A fresh GET stream is still worth having.
                        self.cursor.last_id = None;
                        last_error = e;
                    }
                    Err(ReconnectError::StaleId(e)) => return Err(e),
                    Err(ReconnectError::Retry(e)) => last_error = e,
                }
            };
            self.body = Some(body);
            self.dec = SseDecoder::new(limits.max_event_bytes, limits.max_stream_bytes);
            tracing::debug!(tag = ?self.tag, last_event_id = ?self.cursor.last_id, "legacy SSE stream reconnected");
        }
    }

    /// Reads the current connection until it ends.
    async fn read_connection(&mut self) -> ConnectionEnd {
        self.cursor.progressed = false;
        loop {
            let (messages, end) = {
                let Some(body) = self.body.as_mut() else {
                    return ConnectionEnd::Dropped(None);
                };
                let idle_timeout = self.ctx.http.limits.idle_timeout;
                // The GET stream may be silent for as long as the session lives; a call
                // stream may not.
                let next = if self.tag == StreamTag::Get {
                    body.frame().await
                } else {
                    match tokio::time::timeout(idle_timeout, body.frame()).await {
                        Ok(f) => f,
                        Err(_) => {
                            return ConnectionEnd::Fatal(format!(
                                "the legacy server sent nothing for {idle_timeout:?} (upstream.idle_timeout)"
                            ));
                        }
                    }
                };
                let frame = match next {
                    None if self.cursor.answered => return ConnectionEnd::Finished,
                    None => return ConnectionEnd::Dropped(None),
                    Some(Err(_)) if self.cursor.answered => return ConnectionEnd::Finished,
                    Some(Err(e)) => {
                        return ConnectionEnd::Dropped(Some(format!(
                            "the legacy stream broke: {e}"
                        )));
                    }
                    Some(Ok(f)) => f,
                };
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                // Any bytes (keep-alive comments included) show the connection was worth
                // having.
                self.cursor.progressed |= !data.is_empty();
                self.decode(&data)
            };
            for m in messages {
                if deliver(&self.ctx.tx, Inbound::message(self.tag, m))
                    .await
                    .is_err()
                {
                    return ConnectionEnd::Finished;
                }
            }
            if let Some(end) = end {
                return end;
            }
        }
    }

    /// The messages one chunk of a stream completes, in order, and the end it forces, if any
    /// (the messages before it are still delivered). Nothing here waits, so none of it is
    /// part of the reading's state.
    fn decode(&mut self, data: &[u8]) -> (Vec<Value>, Option<ConnectionEnd>) {
        let mut events = Vec::new();
        if let Err(e) = self.dec.feed(data, &mut events) {
            self.ctx.http.limits.hits.sse(&e);
            return (Vec::new(), Some(ConnectionEnd::Fatal(e.to_string())));
        }
        let cursor = &mut self.cursor;
        let mut out = Vec::new();
        for ev in events {
            if let Some(id) = ev.id {
                cursor.last_id = (!id.is_empty()).then_some(id);
            }
            if let Some(ms) = ev.retry {
                cursor.retry = Some(Duration::from_millis(ms));
            }
            // A priming event (id, empty data) carries nothing to deliver.
            if ev.data.is_empty() || ev.event.as_deref().is_some_and(|t| t != "message") {
                continue;
            }
            let messages = match messages_of(&ev.data) {
                Ok(m) => m,
                Err(e) => return (out, Some(ConnectionEnd::Fatal(e))),
            };
            cursor.last_message = Instant::now();
            for m in messages {
                if let StreamTag::Call(id) = self.tag {
                    if self.ctx.stateless && is_request(&m) {
                        let end = ConnectionEnd::Fatal(unanswerable(method_of(&m)));
                        return (out, Some(end));
                    }
                    cursor.answered |= is_response_to(&m, id);
                }
                out.push(m);
            }
        }
        (out, None)
    }
}

impl StreamContext {
    /// `GET` to continue the stream after `last_id` (or a fresh GET stream without one).
    async fn reconnect(&self, last_id: Option<&str>) -> Result<UpstreamBody, ReconnectError> {
        let mut headers = self.headers.get();
        if let Some(id) = last_id {
            let value = HeaderValue::from_str(id).map_err(|_| {
                ReconnectError::Fatal(format!(
                    "the event id {:?} cannot be sent back as Last-Event-ID",
                    excerpt(id, 80)
                ))
            })?;
            headers.insert(LAST_EVENT_ID, value);
        }
        let resp = self
            .http
            .send(Method::GET, headers, None)
            .await
            .map_err(|e| ReconnectError::Retry(e.to_string()))?;
        let status = resp.status();
        if status == StatusCode::OK && super::http::is_sse(resp.headers()) {
            return Ok(resp.into_body());
        }
        let text = read_body(resp.into_body(), 4096, self.http.limits.response_timeout)
            .await
            .map(|b| excerpt(&String::from_utf8_lossy(&b), 200))
            .unwrap_or_default();
        let what = format!("reconnecting answered HTTP {status}: {text}");
        Err(match status {
            StatusCode::NOT_FOUND => ReconnectError::Fatal(format!(
                "the legacy server no longer knows the session ({what})"
            )),
            StatusCode::METHOD_NOT_ALLOWED => ReconnectError::Fatal(format!(
                "the legacy server offers no GET stream, so the stream cannot be resumed ({what})"
            )),
            s if s.is_client_error() && s != StatusCode::CONFLICT && last_id.is_some() => {
                ReconnectError::StaleId(format!(
                    "the legacy server would not resume after event {:?} ({what})",
                    last_id.unwrap_or_default()
                ))
            }
            _ => ReconnectError::Retry(what),
        })
    }
}

/// The error for a server request that a stateless server can never receive an answer to.
fn unanswerable(method: Option<&str>) -> String {
    let method = method.unwrap_or("?");
    format!(
        "the legacy server runs without sessions (it issued no Mcp-Session-Id), so the answer to its {method} request could never reach the call waiting for it; run the server with sessions to use tools that ask for input"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream's reading is held for as long as the stream is open: a session's GET stream
    /// for the session's life, a parked call's stream while it waits (two per parked call).
    /// Its state was 2,064 bytes with the reconnect, the JSON read and the channel's send
    /// inline, and the call's response kept whole. 640 is a jemalloc size class: one byte
    /// more is served from the 768-byte class.
    #[test]
    fn a_streams_reading_stays_small() {
        let size = crate::future_size::returned4(StreamContext::run);
        eprintln!("StreamContext::run: {size} bytes");
        assert!(size <= 640, "the reading's state grew to {size} bytes");
    }
}
