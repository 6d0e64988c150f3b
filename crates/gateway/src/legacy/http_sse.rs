//! One legacy session over the 2024-11-05 HTTP+SSE transport, as a client.
//!
//! The session *is* one SSE connection: [`SseSession::open`] GETs `upstream.url`, waits (at
//! most `upstream.response_timeout`) for the `endpoint` event, whose data is the URI to POST
//! every message to (usually relative, e.g. `/messages/?session_id=…`; it is resolved against
//! the SSE URL and must stay on the same origin, since forwarded credentials go there), then
//! POSTs `initialize`. Every message from the server arrives as an `event: message` on the SSE
//! connection: responses to our requests as `Call(id)`, the rest as `Get`.
//!
//! When the connection ends, the session is over: every request in flight ends with an
//! error, and so does the `Get` stream. While a request is in flight, `upstream.idle_timeout`
//! of silence also ends it. The transport has no session deletion: [`SseSession::close`]
//! just drops the connection, which is how servers notice a client has gone.

use std::sync::Arc;

use crate::legacy::http::UpstreamBody;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::task::AbortOnDropHandle;

use super::handshake::{self, initialize_params};
use super::http::{HttpError, UpstreamHttp, is_sse, post_headers, read_body};
use super::pending::PendingCalls;
use super::session::{Inbound, SessionError};
use super::wire::{excerpt, messages_of, to_bytes};
use mrtr_wire::jsonrpc;
use mrtr_wire::sse::{SseDecoder, SseEvent};

const CHANNEL_DEPTH: usize = 256;

pub struct SseSession {
    http: Arc<UpstreamHttp>,
    /// Where messages are POSTed, as announced by the `endpoint` event.
    endpoint: http::Uri,
    /// The legacy `InitializeResult`, as received.
    pub init_result: std::sync::Arc<Value>,
    /// The version the server chose.
    pub negotiated_version: String,
    next_id: i64,
    extra_headers: HeaderMap,
    calls: Arc<PendingCalls>,
    reader: Option<AbortOnDropHandle<()>>,
    /// Decremented when the session ends (the gateway's "sessions open now" gauge).
    active: Option<prometheus::IntGauge>,
}

/// The POST URI an `endpoint` event announces, resolved against the SSE URL.
pub fn resolve_endpoint(sse_url: &url::Url, data: &str) -> Result<url::Url, String> {
    let data = data.trim();
    if data.is_empty() {
        return Err("the endpoint event carries no URI".into());
    }
    let joined = sse_url
        .join(data)
        .map_err(|e| format!("the endpoint event's URI {data:?} is not valid: {e}"))?;
    if joined.origin() != sse_url.origin() {
        return Err(format!(
            "the endpoint event points to {}, not the SSE stream's origin {}; messages (and forwarded credentials) are not sent elsewhere",
            joined.origin().ascii_serialization(),
            sse_url.origin().ascii_serialization()
        ));
    }
    Ok(joined)
}

impl SseSession {
    /// Connects, learns the POST endpoint and initializes, declaring `capabilities`.
    /// `extra_headers` go on every request (forwarded credentials, trace context).
    pub async fn open(
        http: Arc<UpstreamHttp>,
        capabilities: Value,
        extra_headers: HeaderMap,
    ) -> Result<(SseSession, mpsc::Receiver<Inbound>), SessionError> {
        let limits = http.limits.clone();
        let mut headers = extra_headers.clone();
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_static("text/event-stream"),
        );
        let resp = http.send(Method::GET, headers, None).await?;
        let status = resp.status();
        if !status.is_success() {
            let text = read_body(resp.into_body(), 4096, limits.response_timeout)
                .await
                .unwrap_or_default();
            return Err(SessionError::Http(HttpError::Status {
                status,
                body: excerpt(&String::from_utf8_lossy(&text), 300),
            }));
        }
        if !is_sse(resp.headers()) {
            return Err(SessionError::Protocol(format!(
                "{} answered GET with {:?}, not an SSE stream; is upstream.url the SSE endpoint (often /sse)?",
                crate::config::redact::redacted_url(&http.url),
                resp.headers().get(header::CONTENT_TYPE)
            )));
        }
        let mut body = resp.into_body();
        let mut decoder = SseDecoder::new(limits.max_event_bytes, limits.max_stream_bytes);
        let (data, early) = match timeout(
            limits.response_timeout,
            wait_for_endpoint(&mut body, &mut decoder),
        )
        .await
        {
            Err(_) => {
                return Err(SessionError::Protocol(format!(
                    "the SSE stream announced no endpoint within {:?} (upstream.response_timeout)",
                    limits.response_timeout
                )));
            }
            Ok(r) => r?,
        };
        let endpoint = resolve_endpoint(&http.url, &data).map_err(SessionError::Protocol)?;
        let endpoint: http::Uri = endpoint.as_str().parse().map_err(|e| {
            SessionError::Protocol(format!("the endpoint URI {endpoint} is not usable: {e}"))
        })?;
        tracing::debug!(%endpoint, "legacy SSE session connected");

        let (tx, rx) = mpsc::channel(CHANNEL_DEPTH);
        let calls = Arc::new(PendingCalls::default());
        let reader = Reader {
            body,
            decoder,
            calls: calls.clone(),
            tx,
            idle: limits.idle_timeout,
            hits: http.limits.hits.clone(),
        };
        let mut session = SseSession {
            http,
            endpoint,
            init_result: std::sync::Arc::new(Value::Null),
            negotiated_version: String::new(),
            next_id: 1,
            extra_headers,
            calls,
            reader: Some(AbortOnDropHandle::new(tokio::spawn(reader.run(early)))),
            active: None,
        };
        session.initialize(capabilities).await?;
        Ok((session, rx))
    }

    async fn initialize(&mut self, capabilities: Value) -> Result<(), SessionError> {
        let params = initialize_params(
            &self.http.versions.request_version(),
            capabilities,
            &self.http.client_name,
        );
        let (reply_tx, reply_rx) = oneshot::channel();
        self.calls
            .register(0, "initialize", Some(reply_tx))
            .map_err(SessionError::Gone)?;
        self.post(&jsonrpc::OutgoingRequest::new(
            0,
            "initialize",
            Some(&params),
        ))
        .await?;
        let wait = self.http.limits.response_timeout;
        let answer = match timeout(wait, reply_rx).await {
            Err(_) => {
                return Err(SessionError::Initialize(format!(
                    "no answer to initialize on the SSE stream within {wait:?} (upstream.response_timeout)"
                )));
            }
            Ok(Err(_)) => return Err(SessionError::Initialize("the SSE reader ended".into())),
            Ok(Ok(Err(what))) => return Err(SessionError::Initialize(what)),
            Ok(Ok(Ok(msg))) => msg,
        };
        let done = handshake::accept(&answer, &self.http.versions)?;
        self.negotiated_version = done.negotiated_version;
        self.init_result = done.init_result;
        self.notify("notifications/initialized", None).await
    }

    /// Counts this session in `gauge` until it ends.
    pub fn track_with(&mut self, gauge: prometheus::IntGauge) {
        gauge.inc();
        self.active = Some(gauge);
    }

    /// Whether the SSE connection is still up.
    pub fn is_healthy(&self) -> bool {
        self.calls.gone().is_none() && self.reader.as_ref().is_some_and(|r| !r.is_finished())
    }

    /// POSTs one message to the endpoint; the server acknowledges with 202.
    async fn post(&self, msg: &impl serde::Serialize) -> Result<(), SessionError> {
        if let Some(what) = self.calls.gone() {
            return Err(SessionError::Gone(what));
        }
        let mut headers = post_headers();
        for (k, v) in &self.extra_headers {
            headers.insert(k.clone(), v.clone());
        }
        let resp = self
            .http
            .send_to(&self.endpoint, Method::POST, headers, Some(to_bytes(msg)))
            .await?;
        let status = resp.status();
        // Drain the (small) acknowledgement so the connection can be reused.
        let text = read_body(
            resp.into_body(),
            64 * 1024,
            self.http.limits.response_timeout,
        )
        .await
        .unwrap_or_default();
        if status.is_success() {
            return Ok(());
        }
        if status == StatusCode::NOT_FOUND {
            return Err(SessionError::Expired);
        }
        Err(SessionError::Http(HttpError::Status {
            status,
            body: excerpt(&String::from_utf8_lossy(&text), 300),
        }))
    }

    /// POSTs a request; its response arrives tagged `Call(id)`. Returns the id.
    pub async fn request<P: serde::Serialize + Sync + ?Sized>(
        &mut self,
        method: &str,
        params: Option<&P>,
    ) -> Result<i64, SessionError> {
        let id = self.next_id;
        self.next_id += 1;
        self.calls
            .register(id, method, None)
            .map_err(SessionError::Gone)?;
        if let Err(e) = self
            .post(&jsonrpc::OutgoingRequest::new(id, method, params))
            .await
        {
            self.calls.forget(id);
            return Err(e);
        }
        Ok(id)
    }

    /// Answers a server request.
    pub async fn respond(
        &self,
        id: &Value,
        outcome: Result<Value, jsonrpc::ErrorObject>,
    ) -> Result<(), SessionError> {
        let msg = match outcome {
            Ok(result) => jsonrpc::result_response(id, result),
            Err(e) => jsonrpc::error_response(Some(id), &e),
        };
        self.post(&msg).await
    }

    pub async fn notify(&self, method: &str, params: Option<Value>) -> Result<(), SessionError> {
        self.post(&jsonrpc::notification(method, params)).await
    }

    /// Asks the server to stop working on request `id`, and forgets it.
    pub async fn cancel(&self, id: i64, reason: &str) -> Result<(), SessionError> {
        self.calls.forget(id);
        self.notify(
            "notifications/cancelled",
            Some(json!({"requestId": id, "reason": reason})),
        )
        .await
    }

    /// Ends the session by dropping the SSE connection.
    pub fn close(mut self) {
        self.end();
    }

    fn end(&mut self) {
        if let Some(g) = self.active.take() {
            g.dec();
        }
        self.reader.take();
    }
}

impl Drop for SseSession {
    fn drop(&mut self) {
        self.end();
    }
}

/// Reads the SSE stream until its `endpoint` event; returns the event's data and any events
/// that followed it in the same chunk.
async fn wait_for_endpoint(
    body: &mut UpstreamBody,
    decoder: &mut SseDecoder,
) -> Result<(String, Vec<SseEvent>), SessionError> {
    let mut events = Vec::new();
    loop {
        let frame = match body.frame().await {
            None => {
                return Err(SessionError::Protocol(
                    "the SSE stream ended before announcing its endpoint".into(),
                ));
            }
            Some(Err(e)) => return Err(HttpError::Body(e.to_string()).into()),
            Some(Ok(f)) => f,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        decoder
            .feed(&data, &mut events)
            .map_err(|e| SessionError::Protocol(e.to_string()))?;
        if let Some(i) = events
            .iter()
            .position(|e| e.event.as_deref() == Some("endpoint"))
        {
            let rest = events.split_off(i + 1);
            let endpoint = events.pop().expect("the endpoint event").data;
            if !events.is_empty() {
                tracing::debug!(
                    skipped = events.len(),
                    "legacy SSE events before the endpoint were ignored"
                );
            }
            return Ok((endpoint, rest));
        }
    }
}

/// Forwards the SSE stream's messages until it ends, then ends everything in flight.
struct Reader {
    body: UpstreamBody,
    decoder: SseDecoder,
    calls: Arc<PendingCalls>,
    tx: mpsc::Sender<Inbound>,
    idle: std::time::Duration,
    hits: crate::metrics::LimitHits,
}

impl Reader {
    /// Reads for as long as the session lives. The future captures the reader once (an
    /// `async fn` keeps a second copy of what it is given); a test holds its state to a
    /// budget.
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn would keep the reader twice"
    )]
    fn run(mut self, early: Vec<SseEvent>) -> impl Future<Output = ()> + Send + 'static {
        async move {
            let what = match self.deliver(early).await {
                Ok(()) => self.follow().await,
                Err(e) => e,
            };
            tracing::debug!(reason = %what, "legacy SSE session ended");
            self.calls.fail_all(Some(what), "", "", &self.tx).await;
        }
    }

    /// Reads until the connection ends; returns why it ended.
    async fn follow(&mut self) -> String {
        let mut last_frame = Instant::now();
        let mut events = Vec::new();
        loop {
            let deadline = self
                .calls
                .busy_since()
                .map(|sent| sent.max(last_frame) + self.idle);
            let frame = tokio::select! {
                f = self.body.frame() => f,
                _ = sleep_until(deadline.unwrap_or_else(|| Instant::now() + self.idle)), if deadline.is_some() => {
                    return format!("the legacy server sent nothing on its SSE stream for {:?} (upstream.idle_timeout)", self.idle);
                }
                _ = self.calls.sent.notified() => continue, // re-arm the idle clock
            };
            last_frame = Instant::now();
            let frame = match frame {
                None => return "the legacy server closed the SSE connection".into(),
                Some(Err(e)) => return format!("the legacy SSE connection broke: {e}"),
                Some(Ok(f)) => f,
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            if let Err(e) = self.decoder.feed(&data, &mut events) {
                self.hits.sse(&e);
                return e.to_string();
            }
            if let Err(e) = self.deliver(std::mem::take(&mut events)).await {
                return e;
            }
        }
    }

    async fn deliver(&mut self, events: Vec<SseEvent>) -> Result<(), String> {
        let (messages, error) = messages_in(events);
        for m in messages {
            let _ = self.calls.route(m, &self.tx).await;
        }
        error.map_or(Ok(()), Err)
    }
}

/// The messages `events` carry, in order, and the error that stops them, if any (the
/// messages before it are still delivered). Nothing here waits, so none of it is part of the
/// reader's state.
fn messages_in(events: Vec<SseEvent>) -> (Vec<Value>, Option<String>) {
    let mut out = Vec::new();
    for ev in events {
        match ev.event.as_deref() {
            None | Some("message") if !ev.data.is_empty() => match messages_of(&ev.data) {
                Ok(messages) => out.extend(messages),
                Err(e) => return (out, Some(e)),
            },
            Some("endpoint") => tracing::debug!("ignoring a second legacy SSE endpoint event"),
            _ => {}
        }
    }
    (out, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An SSE session's reader lives as long as the session (a parked call's too). It was
    /// 1,520 bytes: itself kept twice, and each message routed with an awaited channel send
    /// inline. 768 is a jemalloc size class.
    #[test]
    fn an_sse_sessions_reader_stays_small() {
        let size = crate::future_size::returned2(Reader::run);
        eprintln!("http_sse::Reader::run: {size} bytes");
        assert!(size <= 768, "the reader's state grew to {size} bytes");
    }

    #[test]
    fn endpoints_resolve_against_the_sse_url_and_stay_on_its_origin() {
        let sse = url::Url::parse("http://127.0.0.1:8000/mcp/sse").unwrap();
        let at = |d: &str| resolve_endpoint(&sse, d).map(|u| u.to_string());
        assert_eq!(
            at("/messages/?session_id=ab12").unwrap(),
            "http://127.0.0.1:8000/messages/?session_id=ab12"
        );
        // Relative to the SSE URL's directory, as a browser would.
        assert_eq!(
            at("messages?session_id=1").unwrap(),
            "http://127.0.0.1:8000/mcp/messages?session_id=1"
        );
        assert_eq!(
            at(" http://127.0.0.1:8000/m?s=2 ").unwrap(),
            "http://127.0.0.1:8000/m?s=2"
        );
        for foreign in [
            "http://127.0.0.1:9000/m",
            "https://127.0.0.1:8000/m",
            "//evil.example/m",
            "http://evil.example/m",
        ] {
            let e = at(foreign).unwrap_err();
            assert!(e.contains("not the SSE stream's origin"), "{foreign}: {e}");
        }
        assert!(at("").is_err());
    }
}
