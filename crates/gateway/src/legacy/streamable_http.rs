//! One legacy Streamable HTTP session (2025-03-26 … 2025-11-25), as a client.
//!
//! Lifecycle: [`HttpSession::open`] POSTs `initialize` with the capabilities it is given,
//! keeps the `Mcp-Session-Id`, POSTs `notifications/initialized`, then opens the standalone
//! GET stream (some SDKs send server requests only there; Python's `list_roots()` does).
//! [`HttpSession::request`] POSTs a request and hands its response stream over on the
//! session's channel, to be read by whoever reads the session (see `exchange::Reader`);
//! [`HttpSession::respond`] answers a server request;
//! [`LegacySession::close`](super::session::LegacySession::close) DELETEs the session.
//! Dropping a session without closing it still DELETEs it, in the background.
//!
//! Everything the server sends, from any stream, arrives on one channel as [`Inbound`] items
//! tagged with the stream it came on, so the caller reads one place. Server-request ids are
//! the server's own id space: they are never compared with the ids this side mints. Each
//! stream is read by a [`StreamContext`] (the GET stream in a task of its own), which also
//! resumes streams the server only disconnected (SSE polling) and fails fast on stateless
//! servers (see `http_stream`).

use std::sync::Arc;
use std::time::Duration;

use crate::legacy::http::UpstreamBody;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::task::AbortOnDropHandle;

use super::handshake::{self, initialize_params};
use super::http::{HttpError, UpstreamHttp, UpstreamLimits, is_sse, read_body};
use super::http_stream::{SessionHeaders, StreamContext};
use super::session::{CallStream, Inbound, Reading, SESSION_HEADER, SessionError, StreamTag};
use super::wire::{excerpt, messages_of, to_bytes};
use mrtr_wire::jsonrpc;
use mrtr_wire::sse::SseDecoder;

const CHANNEL_DEPTH: usize = 256;

pub struct HttpSession {
    http: Arc<UpstreamHttp>,
    /// The session's id, version and forwarded headers: one copy, shared with its streams.
    headers: Arc<SessionHeaders>,
    /// The version the legacy server chose in its `InitializeResult`.
    pub negotiated_version: String,
    /// The legacy `InitializeResult`, as received.
    pub init_result: std::sync::Arc<Value>,
    next_id: i64,
    tx: mpsc::Sender<Inbound>,
    readers: Vec<AbortOnDropHandle<()>>,
    /// The standalone GET stream's reader, kept apart: on close it may read the stream to the
    /// end the DELETE brings, so that the stream's connection can be reused.
    get_reader: Option<AbortOnDropHandle<()>>,
    /// Cancelled when the session closes (see [`StreamContext::closing`]).
    closing: tokio_util::sync::CancellationToken,
    /// Whether the server accepted the standalone GET stream.
    pub has_get_stream: bool,
    closed: bool,
    /// Decremented when the session ends (the gateway's "sessions open now" gauge).
    active: Option<prometheus::IntGauge>,
}

impl HttpSession {
    /// Opens a session declaring `capabilities` (legacy shape). `extra_headers` go on every
    /// request (forwarded credentials, trace context).
    pub async fn open(
        http: Arc<UpstreamHttp>,
        capabilities: Value,
        extra_headers: HeaderMap,
    ) -> Result<(HttpSession, mpsc::Receiver<Inbound>), SessionError> {
        let (tx, rx) = mpsc::channel(CHANNEL_DEPTH);
        let mut s = HttpSession {
            http,
            headers: Arc::new(SessionHeaders {
                session_id: None,
                version: None,
                extra: extra_headers,
            }),
            negotiated_version: String::new(),
            init_result: std::sync::Arc::new(Value::Null),
            next_id: 1,
            tx,
            readers: Vec::new(),
            get_reader: None,
            closing: tokio_util::sync::CancellationToken::new(),
            has_get_stream: false,
            closed: false,
            active: None,
        };
        s.initialize(capabilities).await?;
        s.notify("notifications/initialized", None).await?;
        s.open_get_stream().await;
        Ok((s, rx))
    }

    /// Counts this session in `gauge` until it ends.
    pub fn track_with(&mut self, gauge: prometheus::IntGauge) {
        gauge.inc();
        self.active = Some(gauge);
    }

    pub fn session_id(&self) -> Option<&str> {
        self.headers
            .session_id
            .as_ref()
            .and_then(|v| v.to_str().ok())
    }

    fn has_session_id(&self) -> bool {
        self.headers.session_id.is_some()
    }

    fn headers(&self) -> HeaderMap {
        self.headers.post()
    }

    async fn initialize(&mut self, capabilities: Value) -> Result<(), SessionError> {
        let params = initialize_params(
            &self.http.versions.request_version(),
            capabilities,
            &self.http.client_name,
        );
        let body = jsonrpc::OutgoingRequest::new(0, "initialize", Some(&params));
        let resp = self
            .http
            .send(Method::POST, self.headers(), Some(to_bytes(&body)))
            .await?;
        let status = resp.status();
        if !status.is_success() {
            let text = read_body(resp.into_body(), 4096, self.http.limits.response_timeout)
                .await
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default();
            return Err(SessionError::InitializeStatus {
                status,
                body: excerpt(&text, 300),
            });
        }
        // Nothing shares the headers yet: the streams start after the handshake.
        Arc::make_mut(&mut self.headers).session_id = resp.headers().get(SESSION_HEADER).cloned();
        let msg = first_response(resp, &json!(0), &self.http.limits).await?;
        let done = handshake::accept(&msg, &self.http.versions)?;
        // 2025-03-26 servers predate the version header; from 2025-06-18 on it is required.
        Arc::make_mut(&mut self.headers).version = (done.negotiated_version.as_str()
            >= "2025-06-18")
            .then(|| HeaderValue::from_str(&done.negotiated_version).ok())
            .flatten();
        self.negotiated_version = done.negotiated_version;
        self.init_result = done.init_result;
        Ok(())
    }

    async fn open_get_stream(&mut self) {
        if !self.has_session_id() {
            // Without a session a GET stream cannot be tied to anything.
            return;
        }
        match self.http.send(Method::GET, self.headers.get(), None).await {
            Ok(resp) if resp.status() == StatusCode::OK && is_sse(resp.headers()) => {
                self.has_get_stream = true;
                let reading = self.stream_context().run(StreamTag::Get, resp, true);
                self.get_reader = Some(AbortOnDropHandle::new(tokio::spawn(reading)));
            }
            Ok(resp) => {
                tracing::debug!(status = %resp.status(), "legacy server offers no GET stream");
            }
            Err(e) => tracing::debug!(error = %e, "legacy GET stream failed to open"),
        }
    }

    fn stream_context(&self) -> StreamContext {
        StreamContext {
            http: self.http.clone(),
            headers: self.headers.clone(),
            tx: self.tx.clone(),
            stateless: !self.has_session_id(),
            closing: self.closing.clone(),
        }
    }

    fn spawn(&mut self, reading: Reading) {
        // Readers of finished streams have ended: keep the list as long as the live ones.
        self.readers.retain(|r| !r.is_finished());
        self.readers
            .push(AbortOnDropHandle::new(tokio::spawn(reading)));
    }

    /// Hands the response stream of request `id` to whoever reads the session, on the
    /// session's channel: it is then read in the reader's task (the call's own, while the
    /// call runs) rather than in a task of its own. When the channel is full (nobody has read
    /// it for a while), a task of its own reads it, as every stream once was.
    fn hand_over_call_stream(&mut self, id: i64, resp: hyper::Response<UpstreamBody>, sse: bool) {
        let reading = self.stream_context().run(StreamTag::Call(id), resp, sse);
        if let Err(refused) = self.tx.try_send(Inbound::Stream(CallStream::new(reading)))
            && let Inbound::Stream(stream) = refused.into_inner()
        {
            self.spawn(stream.into_future());
        }
    }

    /// POSTs a request; its response (and anything sent on its stream) arrives as [`Inbound`]
    /// items tagged `StreamTag::Call(id)`. Returns the id.
    pub async fn request<P: serde::Serialize + Sync + ?Sized>(
        &mut self,
        method: &str,
        params: Option<&P>,
    ) -> Result<i64, SessionError> {
        let id = self.next_id;
        self.next_id += 1;
        let body = jsonrpc::OutgoingRequest::new(id, method, params);
        let resp = self
            .http
            .send(Method::POST, self.headers(), Some(to_bytes(&body)))
            .await?;
        let status = resp.status();
        if status == StatusCode::NOT_FOUND && self.has_session_id() {
            return Err(SessionError::Expired);
        }
        if status == StatusCode::ACCEPTED {
            return Err(SessionError::Protocol(format!(
                "the legacy server accepted {method} with 202 and no response"
            )));
        }
        if status.is_success() {
            let sse = is_sse(resp.headers());
            self.hand_over_call_stream(id, resp, sse);
            return Ok(id);
        }
        // A JSON-RPC error body for our id is an answer; anything else is an HTTP failure.
        let text = read_body(
            resp.into_body(),
            self.http.limits.max_event_bytes,
            self.http.limits.response_timeout,
        )
        .await
        .unwrap_or_default();
        if let Ok(v) = serde_json::from_slice::<Value>(&text)
            && v.get("error").is_some()
            && v.get("id") == Some(&json!(id))
        {
            let _ = self.tx.send(Inbound::message(StreamTag::Call(id), v)).await;
            return Ok(id);
        }
        Err(SessionError::Http(HttpError::Status {
            status,
            body: excerpt(&String::from_utf8_lossy(&text), 300),
        }))
    }

    /// Answers a server request (`outcome` is its result or error).
    pub async fn respond(
        &self,
        id: &Value,
        outcome: Result<Value, jsonrpc::ErrorObject>,
    ) -> Result<(), SessionError> {
        let body = match outcome {
            Ok(result) => jsonrpc::result_response(id, result),
            Err(e) => jsonrpc::error_response(Some(id), &e),
        };
        self.post_no_answer(&body).await
    }

    /// Sends a notification.
    pub async fn notify(&self, method: &str, params: Option<Value>) -> Result<(), SessionError> {
        self.post_no_answer(&jsonrpc::notification(method, params))
            .await
    }

    /// Asks the server to stop working on request `id` (the gateway's id).
    pub async fn cancel(&self, id: i64, reason: &str) -> Result<(), SessionError> {
        self.notify(
            "notifications/cancelled",
            Some(json!({"requestId": id, "reason": reason})),
        )
        .await
    }

    async fn post_no_answer(&self, body: &Value) -> Result<(), SessionError> {
        let resp = self
            .http
            .send(Method::POST, self.headers(), Some(to_bytes(body)))
            .await?;
        let status = resp.status();
        if status == StatusCode::NOT_FOUND && self.has_session_id() {
            return Err(SessionError::Expired);
        }
        // Drain whatever came back so the connection can be reused.
        let text = read_body(
            resp.into_body(),
            64 * 1024,
            self.http.limits.response_timeout,
        )
        .await
        .unwrap_or_default();
        if status.is_success() {
            Ok(())
        } else {
            Err(SessionError::Http(HttpError::Status {
                status,
                body: excerpt(&String::from_utf8_lossy(&text), 300),
            }))
        }
    }

    /// Drops a session the server has already forgotten (no DELETE: it would only 404).
    pub fn discard_expired(mut self) {
        self.closed = true;
        if let Some(g) = self.active.take() {
            g.dec();
        }
        self.readers.clear();
        self.get_reader = None;
    }

    /// Ends the session: stops the call streams' readers and DELETEs it upstream (best
    /// effort); the GET stream's reader may read that stream's end first (see
    /// `delete_session`).
    pub async fn close(mut self) {
        self.closed = true;
        if let Some(g) = self.active.take() {
            g.dec();
        }
        self.closing.cancel();
        self.readers.clear();
        let get_reader = self.get_reader.take();
        if let Some(sid) = self.headers.session_id.clone() {
            delete_session(self.http.clone(), sid, self.headers(), get_reader).await;
        }
    }
}

impl Drop for HttpSession {
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        if let Some(g) = self.active.take() {
            g.dec();
        }
        self.closing.cancel();
        self.readers.clear();
        let get_reader = self.get_reader.take();
        if let Some(sid) = self.headers.session_id.clone() {
            let headers = self.headers();
            let http = self.http.clone();
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(delete_session(http, sid, headers, get_reader));
            }
        }
    }
}

/// How long the GET stream's reader may go on after a DELETE the server accepted, for the
/// stream's end (which the server sends when it ends the session) to arrive. Read to its end,
/// the stream's connection is reused; stopped before, it is closed. The Python SDK's server
/// (`mcp` 1.30 on uvicorn) ends the stream within tens of milliseconds (a Python probe on a
/// busy machine read the end 33–44 ms after the DELETE's answer), the in-repo test server at
/// once; the margin is for a loaded server. The wait runs in the background, off every
/// call's path; a server that never ends the stream costs the connection, as before.
pub const GET_END_WITHIN: Duration = Duration::from_millis(200);

/// DELETEs the session `sid`. `get_reader`, the GET stream's reader, goes on in the
/// background until the server ends that stream (for at most [`GET_END_WITHIN`] after the
/// DELETE was accepted): a session closed while its GET stream was open would otherwise cost
/// that stream's connection, and a new session would open another. Whoever awaits the close
/// (a call that abandons its legacy call before it answers) waits for the DELETE only. The
/// reader is stopped at once when the DELETE fails.
async fn delete_session(
    http: Arc<UpstreamHttp>,
    sid: HeaderValue,
    mut headers: HeaderMap,
    get_reader: Option<AbortOnDropHandle<()>>,
) {
    headers.insert(SESSION_HEADER, sid);
    headers.remove(header::CONTENT_TYPE);
    match http.send(Method::DELETE, headers, None).await {
        Ok(resp) => {
            let accepted = resp.status().is_success();
            let _ = resp.into_body().collect().await;
            if accepted && let Some(reader) = get_reader {
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(GET_END_WITHIN, reader).await;
                });
            }
        }
        Err(e) => tracing::debug!(error = %e, "legacy session DELETE failed"),
    }
}

/// Reads a response (JSON or SSE) until the JSON-RPC response with `id`; used for
/// `initialize`, before any reader task exists.
async fn first_response(
    resp: hyper::Response<UpstreamBody>,
    id: &Value,
    limits: &UpstreamLimits,
) -> Result<Value, SessionError> {
    let sse = is_sse(resp.headers());
    let mut body = resp.into_body();
    if !sse {
        let bytes = read_body(body, limits.max_event_bytes, limits.response_timeout).await?;
        let text = String::from_utf8_lossy(&bytes);
        return messages_of(&text)
            .map_err(SessionError::Protocol)?
            .into_iter()
            .find(|m| m.get("id") == Some(id))
            .ok_or_else(|| SessionError::Protocol("no response to initialize".into()));
    }
    let mut dec = SseDecoder::new(limits.max_event_bytes, limits.max_stream_bytes);
    let mut events = Vec::new();
    loop {
        let frame = match tokio::time::timeout(limits.response_timeout, body.frame()).await {
            Err(_) => return Err(HttpError::Timeout(limits.response_timeout).into()),
            Ok(None) => {
                return Err(SessionError::Protocol(
                    "stream ended before the initialize response".into(),
                ));
            }
            Ok(Some(Err(e))) => return Err(HttpError::Body(e.to_string()).into()),
            Ok(Some(Ok(f))) => f,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        dec.feed(&data, &mut events)
            .map_err(|e| SessionError::Protocol(e.to_string()))?;
        for ev in events.drain(..) {
            if ev.data.is_empty() {
                continue;
            }
            for m in messages_of(&ev.data).map_err(SessionError::Protocol)? {
                if m.get("id") == Some(id) && m.get("method").is_none() {
                    return Ok(m);
                }
            }
        }
    }
}
