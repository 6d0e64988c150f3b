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

use std::sync::Arc;
use std::time::Duration;

use crate::legacy::http::UpstreamBody;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::http::{UpstreamHttp, read_body};
use super::session::{Inbound, StreamTag};
use super::wire::{excerpt, is_request, is_response_to, messages_of, method_of};
use mrtr_wire::sse::SseDecoder;

/// Reconnect delay when the server named none.
pub const DEFAULT_RETRY: Duration = Duration::from_secs(1);

const LAST_EVENT_ID: HeaderName = HeaderName::from_static("last-event-id");

/// What every reader of one session shares.
#[derive(Clone)]
pub struct StreamContext {
    pub http: Arc<UpstreamHttp>,
    /// Headers for a reconnecting GET: session id, protocol version, forwarded headers. One
    /// copy for all of a session's streams.
    pub get_headers: Arc<HeaderMap>,
    pub tx: mpsc::Sender<Inbound>,
    /// The server issued no session id.
    pub stateless: bool,
    /// Cancelled when the session is being closed: a stream that ends then is not reopened.
    pub closing: tokio_util::sync::CancellationToken,
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
    pub async fn run(self, tag: StreamTag, resp: hyper::Response<UpstreamBody>, sse: bool) {
        let error = if sse {
            self.follow(tag, resp.into_body()).await.err()
        } else {
            self.read_json(tag, resp.into_body()).await.err()
        };
        let _ = self.tx.send(Inbound::Ended { stream: tag, error }).await;
    }

    async fn read_json(&self, tag: StreamTag, body: UpstreamBody) -> Result<(), String> {
        let limits = &self.http.limits;
        let bytes = read_body(body, limits.max_event_bytes, limits.idle_timeout)
            .await
            .map_err(|e| e.to_string())?;
        for m in messages_of(&String::from_utf8_lossy(&bytes))? {
            if self.tx.send(Inbound::Message(tag, m)).await.is_err() {
                break;
            }
        }
        Ok(())
    }

    async fn follow(&self, tag: StreamTag, first: UpstreamBody) -> Result<(), String> {
        let limits = &self.http.limits;
        let mut cursor = Cursor {
            last_id: None,
            retry: None,
            answered: false,
            progressed: false,
            last_message: Instant::now(),
        };
        let mut body = first;
        let mut fruitless: u32 = 0;
        loop {
            let dropped = match self.read_connection(tag, body, &mut cursor).await {
                ConnectionEnd::Finished => return Ok(()),
                ConnectionEnd::Fatal(e) => return Err(e),
                // The session is being deleted: the server ended its streams.
                ConnectionEnd::Dropped(_) if self.closing.is_cancelled() => return Ok(()),
                ConnectionEnd::Dropped(error) => error,
            };
            if let StreamTag::Call(_) = tag {
                if cursor.last_id.is_none() {
                    return Err(dropped.unwrap_or_else(|| {
                        "the stream closed before the response, and without event ids it cannot be resumed".into()
                    }));
                }
                if cursor.last_message.elapsed() >= limits.idle_timeout {
                    return Err(format!(
                        "the legacy server sent nothing for {:?} (upstream.idle_timeout), across reconnects",
                        limits.idle_timeout
                    ));
                }
            }
            if cursor.progressed {
                fruitless = 0;
            }
            let mut last_error = dropped.unwrap_or_else(|| "the connection closed".into());
            body = loop {
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
                let delay = cursor
                    .retry
                    .unwrap_or(DEFAULT_RETRY)
                    .min(limits.resume_max_delay);
                tokio::time::sleep(delay).await;
                match self.reconnect(cursor.last_id.as_deref()).await {
                    Ok(b) => break b,
                    Err(ReconnectError::Fatal(e)) => return Err(e),
                    Err(ReconnectError::StaleId(e)) if tag == StreamTag::Get => {
                        // A fresh GET stream is still worth having.
                        cursor.last_id = None;
                        last_error = e;
                    }
                    Err(ReconnectError::StaleId(e)) => return Err(e),
                    Err(ReconnectError::Retry(e)) => last_error = e,
                }
            };
            tracing::debug!(?tag, last_event_id = ?cursor.last_id, "legacy SSE stream reconnected");
        }
    }

    /// Reads one connection until it ends.
    async fn read_connection(
        &self,
        tag: StreamTag,
        mut body: UpstreamBody,
        cursor: &mut Cursor,
    ) -> ConnectionEnd {
        let limits = &self.http.limits;
        let mut dec = SseDecoder::new(limits.max_event_bytes, limits.max_stream_bytes);
        let mut events = Vec::new();
        cursor.progressed = false;
        loop {
            // The GET stream may be silent for as long as the session lives; a call stream may not.
            let next = if tag == StreamTag::Get {
                body.frame().await
            } else {
                match tokio::time::timeout(limits.idle_timeout, body.frame()).await {
                    Ok(f) => f,
                    Err(_) => {
                        return ConnectionEnd::Fatal(format!(
                            "the legacy server sent nothing for {:?} (upstream.idle_timeout)",
                            limits.idle_timeout
                        ));
                    }
                }
            };
            let frame = match next {
                None if cursor.answered => return ConnectionEnd::Finished,
                None => return ConnectionEnd::Dropped(None),
                Some(Err(_)) if cursor.answered => return ConnectionEnd::Finished,
                Some(Err(e)) => {
                    return ConnectionEnd::Dropped(Some(format!("the legacy stream broke: {e}")));
                }
                Some(Ok(f)) => f,
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            // Any bytes (keep-alive comments included) show the connection was worth having.
            cursor.progressed |= !data.is_empty();
            if let Err(e) = dec.feed(&data, &mut events) {
                limits.hits.sse(&e);
                return ConnectionEnd::Fatal(e.to_string());
            }
            for ev in events.drain(..) {
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
                    Err(e) => return ConnectionEnd::Fatal(e),
                };
                cursor.last_message = Instant::now();
                for m in messages {
                    if let StreamTag::Call(id) = tag {
                        if self.stateless && is_request(&m) {
                            return ConnectionEnd::Fatal(unanswerable(method_of(&m)));
                        }
                        cursor.answered |= is_response_to(&m, id);
                    }
                    if self.tx.send(Inbound::Message(tag, m)).await.is_err() {
                        return ConnectionEnd::Finished;
                    }
                }
            }
        }
    }

    /// `GET` to continue the stream after `last_id` (or a fresh GET stream without one).
    async fn reconnect(&self, last_id: Option<&str>) -> Result<UpstreamBody, ReconnectError> {
        let mut headers = HeaderMap::clone(&self.get_headers);
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
