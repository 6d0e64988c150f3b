//! Server-sent-event output: frame encoding in the Python or TypeScript SDK
//! layout, and `OutboundStream`, one SSE response stream (a call's stream or
//! the standalone GET stream) with its per-stream event log for
//! `Last-Event-ID` resumption and the hooks stream faults use.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body::Frame;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use serde_json::Value;
use tokio::sync::mpsc;

use super::config::SseFraming;

/// Response body type of every reply the server sends.
pub(crate) type Body = UnsyncBoxBody<Bytes, Infallible>;

pub(crate) fn empty_body() -> Body {
    Empty::new().boxed_unsync()
}

pub(crate) fn full_body(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed_unsync()
}

/// Runs a closure when the SSE body is dropped (the client went away or the
/// stream ended), e.g. to keep "GET streams open" statistics right.
pub(crate) struct OnDrop(Option<Box<dyn FnOnce() + Send>>);

impl OnDrop {
    pub(crate) fn new(f: impl FnOnce() + Send + 'static) -> Self {
        OnDrop(Some(Box::new(f)))
    }
}

impl Drop for OnDrop {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

/// An SSE body that yields frames as they are pushed into the channel and
/// ends when every sender is gone.
pub(crate) fn channel_body(
    mut rx: mpsc::UnboundedReceiver<Bytes>,
    on_drop: Option<OnDrop>,
) -> Body {
    let stream = futures_util::stream::poll_fn(move |cx| {
        let _keep = &on_drop;
        rx.poll_recv(cx)
            .map(|item| item.map(|bytes| Ok::<_, Infallible>(Frame::data(bytes))))
    });
    StreamBody::new(stream).boxed_unsync()
}

fn line_end(framing: SseFraming) -> &'static str {
    match framing {
        SseFraming::Python => "\r\n",
        SseFraming::TypeScript => "\n",
    }
}

/// One `message` event carrying `data`, with an optional id.
pub(crate) fn encode_event(framing: SseFraming, id: Option<&str>, data: &str) -> Bytes {
    let nl = line_end(framing);
    let mut out = String::with_capacity(data.len() + 48);
    match framing {
        SseFraming::Python => {
            if let Some(id) = id {
                out.push_str("id: ");
                out.push_str(id);
                out.push_str(nl);
            }
            out.push_str("event: message");
            out.push_str(nl);
        }
        SseFraming::TypeScript => {
            out.push_str("event: message");
            out.push_str(nl);
            if let Some(id) = id {
                out.push_str("id: ");
                out.push_str(id);
                out.push_str(nl);
            }
        }
    }
    out.push_str("data: ");
    out.push_str(data);
    out.push_str(nl);
    out.push_str(nl);
    Bytes::from(out)
}

/// The priming event: an id, an optional reconnection delay, empty data.
pub(crate) fn encode_priming(framing: SseFraming, id: &str, retry_ms: Option<u64>) -> Bytes {
    let nl = line_end(framing);
    let mut out = format!("id: {id}{nl}");
    if let Some(ms) = retry_ms {
        out.push_str(&format!("retry: {ms}{nl}"));
    }
    out.push_str(&format!("data: {nl}{nl}"));
    Bytes::from(out)
}

/// Event ids look like `<stream number>_<session event sequence>`.
pub(crate) fn parse_event_id(id: &str) -> Option<(u64, u64)> {
    let (stream, seq) = id.trim().split_once('_')?;
    Some((stream.parse().ok()?, seq.parse().ok()?))
}

/// What became of an event handed to a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Delivery {
    /// Written to the live connection.
    Delivered,
    /// No live connection, but kept in the event log for a resuming client.
    Logged,
    /// Nowhere to go.
    Dropped,
}

/// Which role a stream plays in its session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StreamKind {
    Call,
    Standalone,
}

pub(crate) struct StreamOptions {
    pub(crate) framing: SseFraming,
    /// Give every event an id and keep it in the log.
    pub(crate) with_ids: bool,
    pub(crate) log_limit: usize,
    /// How many final responses must be sent before the stream completes
    /// (1 for a call, the number of requests for a batch, 0 for GET).
    pub(crate) outstanding: usize,
}

pub(crate) struct OutboundStream {
    pub(crate) number: u64,
    pub(crate) kind: StreamKind,
    framing: SseFraming,
    event_seq: Arc<AtomicU64>,
    log_limit: usize,
    inner: Mutex<Inner>,
}

struct Inner {
    sink: Option<mpsc::UnboundedSender<Bytes>>,
    with_ids: bool,
    /// Hang fault: keep the connection open but write nothing, ever.
    muted: bool,
    /// Cut fault: events still allowed before the connection is dropped;
    /// while set, final responses are never delivered.
    budget: Option<usize>,
    log: VecDeque<(u64, Bytes)>,
    outstanding: usize,
    finished: bool,
}

impl OutboundStream {
    /// A new stream and the HTTP body that carries it.
    pub(crate) fn open(
        number: u64,
        kind: StreamKind,
        options: StreamOptions,
        event_seq: Arc<AtomicU64>,
        on_drop: Option<OnDrop>,
    ) -> (Arc<OutboundStream>, Body) {
        let (tx, rx) = mpsc::unbounded_channel();
        let stream = Arc::new(OutboundStream {
            number,
            kind,
            framing: options.framing,
            event_seq,
            log_limit: options.log_limit,
            inner: Mutex::new(Inner {
                sink: Some(tx),
                with_ids: options.with_ids,
                muted: false,
                budget: None,
                log: VecDeque::new(),
                outstanding: options.outstanding,
                finished: false,
            }),
        });
        (stream, channel_body(rx, on_drop))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn next_id(&self, inner: &Inner) -> Option<(u64, String)> {
        inner.with_ids.then(|| {
            let seq = self.event_seq.fetch_add(1, Ordering::Relaxed);
            (seq, format!("{}_{}", self.number, seq))
        })
    }

    pub(crate) fn framing(&self) -> SseFraming {
        self.framing
    }

    /// Send the priming event (id, optional `retry:`, empty data). Only
    /// meaningful on streams with ids.
    pub(crate) fn prime(&self, retry_ms: Option<u64>) -> Delivery {
        let mut inner = self.lock();
        if inner.muted {
            return Delivery::Dropped;
        }
        let Some((_, id)) = self.next_id(&inner) else {
            return Delivery::Dropped;
        };
        let frame = encode_priming(self.framing, &id, retry_ms);
        Self::write(&mut inner, frame)
    }

    /// Send a request or notification.
    pub(crate) fn send(&self, message: &Value) -> Delivery {
        self.deliver(message, false)
    }

    /// Send a final response; the stream completes once all owed responses
    /// have been sent.
    pub(crate) fn send_final(&self, message: &Value) -> Delivery {
        let delivery = self.deliver(message, true);
        self.settle_one();
        delivery
    }

    /// Account for a call that ends without a response (e.g. cancelled).
    pub(crate) fn finish_without_response(&self) {
        self.settle_one();
    }

    fn settle_one(&self) {
        let mut inner = self.lock();
        inner.outstanding = inner.outstanding.saturating_sub(1);
        if inner.outstanding == 0 && self.kind == StreamKind::Call {
            inner.finished = true;
            if !inner.muted {
                inner.sink = None;
            }
        }
    }

    fn deliver(&self, message: &Value, is_final: bool) -> Delivery {
        let mut inner = self.lock();
        if inner.muted {
            return Delivery::Dropped;
        }
        if is_final && inner.budget.is_some() {
            inner.sink = None;
            return Delivery::Dropped;
        }
        let data = message.to_string();
        let id = self.next_id(&inner);
        let frame = encode_event(self.framing, id.as_ref().map(|(_, s)| s.as_str()), &data);
        if let Some((seq, _)) = id {
            inner.log.push_back((seq, frame.clone()));
            while inner.log.len() > self.log_limit {
                inner.log.pop_front();
            }
        }
        match Self::write(&mut inner, frame) {
            // A resuming client will still get it from the log.
            Delivery::Dropped if inner.with_ids => Delivery::Logged,
            delivery => delivery,
        }
    }

    fn write(inner: &mut Inner, frame: Bytes) -> Delivery {
        let delivered = match &inner.sink {
            Some(tx) => tx.send(frame).is_ok(),
            None => false,
        };
        if !delivered {
            inner.sink = None;
            return Delivery::Dropped;
        }
        if let Some(left) = inner.budget.as_mut() {
            *left = left.saturating_sub(1);
            if *left == 0 {
                inner.sink = None;
            }
        }
        Delivery::Delivered
    }

    /// Write pre-encoded bytes straight to the connection (fault injection).
    pub(crate) fn send_raw(&self, frame: Bytes) -> bool {
        let inner = self.lock();
        inner.sink.as_ref().is_some_and(|tx| tx.send(frame).is_ok())
    }

    /// Drop the connection; with ids the stream stays resumable.
    pub(crate) fn cut_connection(&self) {
        self.lock().sink = None;
    }

    /// Turn on ids (and logging) for this stream, e.g. for the polling fault.
    pub(crate) fn enable_ids(&self) {
        self.lock().with_ids = true;
    }

    /// Hang fault: keep the connection open and never write to it.
    pub(crate) fn mute(&self) {
        self.lock().muted = true;
    }

    /// Cut fault: drop the connection after `events` more events and never
    /// deliver a final response.
    pub(crate) fn cut_after(&self, events: usize) {
        let mut inner = self.lock();
        if events == 0 {
            inner.sink = None;
        }
        inner.budget = Some(events);
    }

    /// Whether a server request sent now could ever reach the client: a live
    /// connection, or a resumable stream the client may reconnect to.
    pub(crate) fn can_reach_client(&self) -> bool {
        let inner = self.lock();
        if inner.muted || inner.finished {
            return false;
        }
        inner.with_ids || inner.sink.as_ref().is_some_and(|tx| !tx.is_closed())
    }

    /// A live connection is attached.
    pub(crate) fn is_attached(&self) -> bool {
        self.lock().sink.as_ref().is_some_and(|tx| !tx.is_closed())
    }

    pub(crate) fn is_finished(&self) -> bool {
        self.lock().finished
    }

    /// Whether the stream logs its events for `Last-Event-ID` resumption.
    pub(crate) fn keeps_ids(&self) -> bool {
        self.lock().with_ids
    }

    /// Whether the session must keep this stream after its call ended: it
    /// can still be resumed, or it is deliberately hanging.
    pub(crate) fn must_outlive_call(&self) -> bool {
        let inner = self.lock();
        inner.with_ids || inner.muted
    }

    /// Resume after `after_seq`: replay the logged events that followed it
    /// into a new connection, which then stays attached unless the stream
    /// has finished. `None` when the stream keeps no ids.
    pub(crate) fn resume(&self, after_seq: u64, on_drop: Option<OnDrop>) -> Option<Body> {
        let mut inner = self.lock();
        if !inner.with_ids {
            return None;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        for (seq, frame) in &inner.log {
            if *seq > after_seq {
                let _ = tx.send(frame.clone());
            }
        }
        if inner.muted || !inner.finished {
            inner.sink = Some(tx);
        }
        Some(channel_body(rx, on_drop))
    }

    /// Close the connection for good (session end, shutdown).
    pub(crate) fn close(&self) {
        let mut inner = self.lock();
        inner.finished = true;
        inner.muted = false;
        inner.sink = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    async fn drain(body: Body) -> String {
        let bytes = body.collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    fn options(framing: SseFraming, with_ids: bool) -> StreamOptions {
        StreamOptions {
            framing,
            with_ids,
            log_limit: 16,
            outstanding: 1,
        }
    }

    #[test]
    fn python_and_typescript_layouts() {
        let py = encode_event(SseFraming::Python, None, "{}");
        assert_eq!(&py[..], b"event: message\r\ndata: {}\r\n\r\n");
        let ts = encode_event(SseFraming::TypeScript, Some("1_2"), "{}");
        assert_eq!(&ts[..], b"event: message\nid: 1_2\ndata: {}\n\n");
        let prime = encode_priming(SseFraming::TypeScript, "1_0", Some(50));
        assert_eq!(&prime[..], b"id: 1_0\nretry: 50\ndata: \n\n");
        assert_eq!(parse_event_id("3_14"), Some((3, 14)));
        assert_eq!(parse_event_id("nope"), None);
    }

    #[tokio::test]
    async fn final_response_closes_call_stream() {
        let seq = Arc::new(AtomicU64::new(0));
        let (stream, body) = OutboundStream::open(
            1,
            StreamKind::Call,
            options(SseFraming::TypeScript, true),
            seq,
            None,
        );
        stream.prime(None);
        assert_eq!(stream.send(&json!({"n":1})), Delivery::Delivered);
        assert_eq!(stream.send_final(&json!({"n":2})), Delivery::Delivered);
        assert!(stream.is_finished());
        let text = drain(body).await;
        assert_eq!(
            text,
            "id: 1_0\ndata: \n\nevent: message\nid: 1_1\ndata: {\"n\":1}\n\n\
             event: message\nid: 1_2\ndata: {\"n\":2}\n\n"
        );
    }

    #[tokio::test]
    async fn cut_stream_is_resumable_with_ids() {
        let seq = Arc::new(AtomicU64::new(0));
        let (stream, body) = OutboundStream::open(
            4,
            StreamKind::Call,
            options(SseFraming::TypeScript, true),
            seq,
            None,
        );
        stream.prime(Some(10));
        stream.cut_connection();
        assert!(drain(body).await.starts_with("id: 4_0\nretry: 10\n"));
        assert!(stream.can_reach_client());
        assert_eq!(stream.send(&json!({"a":1})), Delivery::Logged);
        let resumed = stream.resume(0, None).unwrap();
        stream.send_final(&json!({"b":2}));
        let text = drain(resumed).await;
        assert!(text.contains("id: 4_1\ndata: {\"a\":1}"), "{text}");
        assert!(text.contains("id: 4_2\ndata: {\"b\":2}"), "{text}");
    }

    #[tokio::test]
    async fn cut_after_budget_never_delivers_final() {
        let seq = Arc::new(AtomicU64::new(0));
        let (stream, body) = OutboundStream::open(
            1,
            StreamKind::Call,
            options(SseFraming::Python, false),
            seq,
            None,
        );
        stream.cut_after(1);
        assert_eq!(stream.send(&json!({"first":true})), Delivery::Delivered);
        assert_eq!(stream.send(&json!({"second":true})), Delivery::Dropped);
        assert_eq!(stream.send_final(&json!({"final":true})), Delivery::Dropped);
        let text = drain(body).await;
        assert_eq!(text, "event: message\r\ndata: {\"first\":true}\r\n\r\n");
        assert!(!stream.can_reach_client());
    }
}
