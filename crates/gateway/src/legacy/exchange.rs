//! The one way anything reads a legacy session.
//!
//! A transport delivers [`Inbound`] items on a channel: messages tagged with the stream they
//! came on, and stream ends. Every reader of a session (the MRTR capture loop, the roots
//! refresh before a reused session's call, a listen stream while it subscribes and while it
//! streams, the pool's watch over an idle session, the parking lot's buffer) used to take
//! those items apart itself. Here that happens once:
//!
//! - `Event::of` turns an item into what it means to a reader: the response to one of our
//!   requests, a request or a notification from the server, the end of one of our request
//!   streams, the end of the server's own stream, or the end of the session.
//! - [`Reader`] is the receiving half with its backlog (what was read and not used yet, kept
//!   in order). Pumps that only hold on to a session's traffic (the pool, the parking lot)
//!   own a reader and no session.
//! - [`Exchange`] is a session with its reader. [`Exchange::next`] yields events with `ping`
//!   already answered and messages that are not JSON-RPC dropped (and logged), so no reader
//!   handles either. [`Exchange::wait_for`] reads until one kind of event comes, keeping
//!   everything else for later, in order.
//!
//! What an event *means* for a request (a question for the client, a refusal, a notification
//! for a stream) stays with the reader that owns the session at the time: the MRTR engine,
//! the listen stream. They match on [`Event`], so none of them classifies a message again.

use std::collections::VecDeque;
use std::task::{Context, Poll, Waker};

use serde_json::Value;
use tokio::sync::mpsc;

use super::server_request::ServerRequest;
use super::session::{
    CallStream, Closing, Inbound, LegacySession, SessionError, StreamEnd, StreamTag,
};
use super::wire::response_id;
use mrtr_wire::jsonrpc::{self, ErrorObject, MessageKind};

/// One thing a legacy session delivered, classified.
#[derive(Debug)]
pub enum Event {
    /// The response (result or error) to our request `id`.
    Response { id: i64, msg: Value },
    /// A request from the server.
    Request(Value),
    /// A notification from the server.
    Notification { method: String, msg: Value },
    /// The stream of our request `id` ended without its response (`error` says why, for logs).
    CallEnded { id: i64, error: Option<String> },
    /// The stream that carries the server's own messages (the GET stream; for single-channel
    /// transports, the channel itself) ended. `None`: a clean end.
    StreamEnded { error: Option<String> },
    /// Something that is not a JSON-RPC message, or a response with an id we never minted.
    Invalid(Value),
    /// The session's channel is closed: nothing more will come.
    Closed,
}

impl Event {
    /// What `item` (as a [`Reader`] gives it; `None` once the channel is closed) means.
    fn of(item: Option<Inbound>) -> Event {
        let Some(item) = item else {
            return Event::Closed;
        };
        match item {
            Inbound::Message(_, msg) => Event::of_message(*msg),
            Inbound::Ended(end) => match *end {
                StreamEnd {
                    stream: StreamTag::Call(id),
                    error,
                } => Event::CallEnded { id, error },
                StreamEnd {
                    stream: StreamTag::Get,
                    error,
                } => Event::StreamEnded { error },
            },
            Inbound::Stream(_) => {
                unreachable!("a reader adopts response streams, never gives them")
            }
        }
    }

    fn of_message(msg: Value) -> Event {
        match jsonrpc::classify(&msg) {
            MessageKind::Request => Event::Request(msg),
            MessageKind::Notification => Event::Notification {
                method: jsonrpc_method(&msg),
                msg,
            },
            MessageKind::Response => match response_id(&msg) {
                Some(id) => Event::Response { id, msg },
                None => Event::Invalid(msg),
            },
            MessageKind::Invalid => Event::Invalid(msg),
        }
    }
}

fn jsonrpc_method(msg: &Value) -> String {
    msg.get("method")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// The receiving half of a legacy session, with what was read and not used yet, and the
/// response streams it reads itself.
///
/// A transport may hand a request's response stream over as [`Inbound::Stream`] instead of
/// reading it in a task of its own. The reader adopts it and polls it whenever it waits for
/// an item, so the stream is read in the task that reads the session: the call's own task
/// while a call runs, the parking lot's buffer while it is parked, the pool's watch while the
/// session is idle. Whoever holds the reader reads the streams; one that is dropped stops
/// them, as dropping a session stopped its reader tasks.
pub struct Reader {
    inbound: mpsc::Receiver<Inbound>,
    backlog: VecDeque<Inbound>,
    streams: Vec<CallStream>,
}

impl Reader {
    pub fn new(inbound: mpsc::Receiver<Inbound>) -> Reader {
        Reader {
            inbound,
            backlog: VecDeque::new(),
            streams: Vec::new(),
        }
    }

    /// The next item as the transport delivered it (the backlog first); `None` once the
    /// channel is closed and the backlog empty.
    async fn next_item(&mut self) -> Option<Inbound> {
        if let Some(item) = self.backlog.pop_front() {
            return Some(item);
        }
        std::future::poll_fn(|cx| self.poll_fresh(cx)).await
    }

    /// The next event (the backlog first).
    pub async fn next_event(&mut self) -> Event {
        Event::of(self.next_item().await)
    }

    /// Reads the next item not yet read and keeps it at the end of the backlog; returns it,
    /// or `None` once the channel is closed. For a pump that holds a session's traffic while
    /// nobody uses it (the parking lot). Cancel-safe: nothing is lost when the future is
    /// dropped.
    pub async fn keep_next(&mut self) -> Option<&Inbound> {
        let item = std::future::poll_fn(|cx| self.poll_fresh(cx)).await?;
        self.backlog.push_back(item);
        self.backlog.back()
    }

    /// The channel's next item, reading the adopted streams while it has none.
    fn poll_fresh(&mut self, cx: &mut Context<'_>) -> Poll<Option<Inbound>> {
        // The streams are read once per poll (once more after adopting another): the channel
        // can answer `Pending` with items in it, when the task has spent its cooperative
        // budget (it is then woken to go on), and going round again would never end.
        let mut streams_read = false;
        loop {
            match self.inbound.poll_recv(cx) {
                Poll::Ready(Some(Inbound::Stream(stream))) => {
                    self.streams.push(stream);
                    streams_read = false;
                }
                Poll::Ready(item) => return Poll::Ready(item),
                Poll::Pending if streams_read => return Poll::Pending,
                Poll::Pending => {
                    // What the streams read lands on the channel; look again if they
                    // delivered anything, otherwise each has registered to be woken.
                    streams_read = true;
                    if !self.read_streams(cx) {
                        return Poll::Pending;
                    }
                }
            }
        }
    }

    /// Polls every adopted stream once; whether the channel has something now.
    fn read_streams(&mut self, cx: &mut Context<'_>) -> bool {
        if self.streams.is_empty() {
            return false;
        }
        self.streams.retain_mut(|s| s.poll_read(cx).is_pending());
        !self.inbound.is_empty()
    }

    /// Whether an item is ready to be read without waiting (what the adopted streams have
    /// already received counts).
    ///
    /// What is ready moves to the backlog, in order, and streams waiting on the channel are
    /// adopted: so `true` means the next read returns at once. A closed channel is not ready
    /// (the reader learns it at its next read).
    pub fn has_ready(&mut self) -> bool {
        if !self.backlog.is_empty() {
            return true;
        }
        let mut streams_read = false;
        loop {
            match self.inbound.try_recv() {
                Ok(Inbound::Stream(stream)) => self.streams.push(stream),
                Ok(item) => {
                    self.backlog.push_back(item);
                    return true;
                }
                Err(_) if streams_read => return false,
                Err(_) => {
                    // A look, not a wait: the next real read registers for wake-ups again.
                    streams_read = true;
                    if !self.read_streams(&mut Context::from_waker(Waker::noop())) {
                        return false;
                    }
                }
            }
        }
    }
}

/// A legacy session and its reader.
pub struct Exchange {
    session: LegacySession,
    reader: Reader,
}

impl Exchange {
    pub fn new(session: LegacySession, reader: Reader) -> Exchange {
        Exchange { session, reader }
    }

    pub fn session(&self) -> &LegacySession {
        &self.session
    }

    pub fn session_mut(&mut self) -> &mut LegacySession {
        &mut self.session
    }

    pub fn reader_mut(&mut self) -> &mut Reader {
        &mut self.reader
    }

    pub fn into_parts(self) -> (LegacySession, Reader) {
        (self.session, self.reader)
    }

    /// Ends the session cleanly. The reader goes first: its response streams stop before
    /// the session is deleted, as a session's own reader tasks do.
    pub fn close(self) -> Closing {
        let Exchange { session, reader } = self;
        drop(reader);
        session.close()
    }

    /// The next event worth a reader's attention: `ping` is answered here (any session, any
    /// reader: nobody else needs to see it) and a message that is not JSON-RPC is logged and
    /// skipped.
    pub async fn next(&mut self) -> Event {
        loop {
            let event = self.reader.next_event().await;
            if let Some(event) = self.screened(event).await {
                return event;
            }
        }
    }

    /// Like [`Exchange::next`], without waiting: `None` once nothing more has arrived.
    pub async fn next_ready(&mut self) -> Option<Event> {
        while self.reader.has_ready() {
            let event = self.reader.next_event().await;
            if let Some(event) = self.screened(event).await {
                return Some(event);
            }
        }
        None
    }

    /// `event`, unless it is a `ping` (answered here) or not a JSON-RPC message of ours
    /// (logged and skipped).
    async fn screened(&mut self, event: Event) -> Option<Event> {
        match event {
            // Boxed: answering is a request of its own to the legacy server, the largest
            // state here and a rare one, and this is awaited by every read of the session.
            Event::Request(msg) if Box::pin(self.answered_ping(&msg)).await => None,
            Event::Invalid(msg) => {
                tracing::warn!(
                    message = %super::wire::excerpt(&msg.to_string(), 200),
                    "ignoring a message from the legacy server that is not a JSON-RPC message of ours"
                );
                None
            }
            event => Some(event),
        }
    }

    /// Reads until `wanted` accepts an event (returned) or `deadline` passes (`None`); every
    /// other event read meanwhile is kept, in order, for the next [`Exchange::next`].
    /// `Err` when the session ends first.
    pub async fn wait_for(
        &mut self,
        wanted: impl Fn(&Event) -> bool,
        deadline: tokio::time::Instant,
    ) -> Result<Option<Event>, SessionError> {
        let mut kept = VecDeque::new();
        let outcome = loop {
            let event = match tokio::time::timeout_at(deadline, self.next()).await {
                Err(_) => break Ok(None),
                Ok(event) => event,
            };
            if wanted(&event) {
                break Ok(Some(event));
            }
            match event {
                Event::Closed => {
                    break Err(SessionError::Gone(
                        "the legacy session ended while the gateway waited on it".into(),
                    ));
                }
                other => kept.push_back(other),
            }
        };
        // What was kept goes before anything still unread, as it came.
        let mut items: VecDeque<Inbound> = kept.into_iter().filter_map(into_item).collect();
        items.append(&mut self.reader.backlog);
        self.reader.backlog = items;
        outcome
    }

    /// Answers the server's request `msg` with an error (nobody can answer it here).
    pub async fn refuse(&self, msg: &Value, refusal: ErrorObject) -> Result<(), SessionError> {
        let request = ServerRequest::of(msg);
        self.session.respond(&request.id, Err(refusal)).await
    }

    async fn answered_ping(&self, msg: &Value) -> bool {
        let request = ServerRequest::of(msg);
        match request.answer_ping(&self.session).await {
            None => false,
            Some(answered) => {
                if let Err(e) = answered {
                    tracing::debug!(error = %e, "could not answer the legacy server's ping");
                }
                true
            }
        }
    }
}

/// An event back as the item it came from (to keep it for later).
fn into_item(event: Event) -> Option<Inbound> {
    // The tag of a kept message no longer matters to any reader: events are classified by
    // their content, and stream ends carry their own tag.
    Some(match event {
        Event::Response { id, msg } => Inbound::message(StreamTag::Call(id), msg),
        Event::Request(msg) | Event::Notification { msg, .. } | Event::Invalid(msg) => {
            Inbound::message(StreamTag::Get, msg)
        }
        Event::CallEnded { id, error } => Inbound::ended(StreamTag::Call(id), error),
        Event::StreamEnded { error } => Inbound::ended(StreamTag::Get, error),
        Event::Closed => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    fn message(v: Value) -> Option<Inbound> {
        Some(Inbound::message(StreamTag::Get, v))
    }

    #[test]
    fn every_item_is_classified_once_into_what_it_means() {
        assert!(matches!(
            Event::of(message(json!({"jsonrpc": "2.0", "id": 4, "result": {}}))),
            Event::Response { id: 4, .. }
        ));
        assert!(matches!(
            Event::of(message(
                json!({"jsonrpc": "2.0", "id": "s-1", "method": "roots/list"})
            )),
            Event::Request(_)
        ));
        match Event::of(message(
            json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}),
        )) {
            Event::Notification { method, .. } => {
                assert_eq!(method, "notifications/tools/list_changed")
            }
            other => panic!("{other:?}"),
        }
        // A response whose id the gateway never minted (ours are integers) is not ours.
        assert!(matches!(
            Event::of(message(json!({"jsonrpc": "2.0", "id": "x", "result": {}}))),
            Event::Invalid(_)
        ));
        assert!(matches!(
            Event::of(message(json!([1, 2]))),
            Event::Invalid(_)
        ));
        assert!(matches!(
            Event::of(Some(Inbound::ended(StreamTag::Call(9), None))),
            Event::CallEnded { id: 9, error: None }
        ));
        assert!(matches!(
            Event::of(Some(Inbound::ended(StreamTag::Get, Some("reset".into())))),
            Event::StreamEnded { error: Some(_) }
        ));
        assert!(matches!(Event::of(None), Event::Closed));
    }

    #[tokio::test]
    async fn a_reader_gives_its_backlog_before_the_channel() {
        let (tx, rx) = mpsc::channel(4);
        tx.send(Inbound::message(
            StreamTag::Get,
            json!({"id": 2, "result": {}}),
        ))
        .await
        .unwrap();
        let mut reader = Reader::new(rx);
        reader.backlog.push_back(Inbound::message(
            StreamTag::Get,
            json!({"id": 1, "result": {}}),
        ));
        assert!(reader.has_ready());
        assert!(matches!(
            reader.next_event().await,
            Event::Response { id: 1, .. }
        ));
        assert!(matches!(
            reader.next_event().await,
            Event::Response { id: 2, .. }
        ));
        assert!(!reader.has_ready());
        drop(tx);
        assert!(matches!(reader.next_event().await, Event::Closed));
    }

    /// A notification from the server, on its own stream.
    fn notice(method: &str) -> Inbound {
        Inbound::message(StreamTag::Get, json!({"jsonrpc": "2.0", "method": method}))
    }

    /// A response stream that delivers `id`'s response once `go` fires, then its end.
    fn gated_stream(
        tx: &mpsc::Sender<Inbound>,
        id: i64,
        go: tokio::sync::oneshot::Receiver<()>,
    ) -> Inbound {
        let tx = tx.clone();
        Inbound::Stream(CallStream::new(async move {
            let _ = go.await;
            let response = json!({"jsonrpc": "2.0", "id": id, "result": {}});
            let _ = tx
                .send(Inbound::message(StreamTag::Call(id), response))
                .await;
            let _ = tx.send(Inbound::ended(StreamTag::Call(id), None)).await;
        }))
    }

    #[tokio::test]
    async fn a_reader_reads_the_response_streams_handed_to_it_in_its_own_task() {
        let (tx, rx) = mpsc::channel(4);
        let mut reader = Reader::new(rx);
        let (go, gate) = tokio::sync::oneshot::channel();
        tx.send(gated_stream(&tx, 7, gate)).await.unwrap();
        tx.send(notice("notifications/x")).await.unwrap();
        // What was queued behind the stream comes first; the stream is adopted, not given.
        assert!(matches!(
            reader.next_event().await,
            Event::Notification { .. }
        ));
        assert!(!reader.has_ready(), "the stream has received nothing yet");
        go.send(()).unwrap();
        // Nothing but this reader polls the stream: no task of its own reads it.
        assert!(
            reader.has_ready(),
            "what the stream received counts as ready"
        );
        assert!(matches!(
            reader.next_event().await,
            Event::Response { id: 7, .. }
        ));
        assert!(matches!(
            reader.next_event().await,
            Event::CallEnded { id: 7, error: None }
        ));
        assert!(reader.streams.is_empty(), "an ended stream is let go");
        drop(tx);
        assert!(matches!(reader.next_event().await, Event::Closed));
    }

    /// `has_ready` promises that the next read returns at once: a stream handed over and not
    /// adopted yet is not something to read, and a closed channel is learned by reading.
    #[tokio::test]
    async fn a_look_adopts_streams_on_the_channel_and_counts_only_what_can_be_read() {
        let (tx, rx) = mpsc::channel(4);
        let mut reader = Reader::new(rx);
        let (go, gate) = tokio::sync::oneshot::channel();
        tx.send(gated_stream(&tx, 8, gate)).await.unwrap();
        assert!(
            !reader.has_ready(),
            "only a stream with nothing received waits on the channel"
        );
        assert_eq!(reader.streams.len(), 1, "the look adopted it");
        go.send(()).unwrap();
        assert!(reader.has_ready());
        let next = tokio::time::timeout(Duration::from_millis(100), reader.next_event()).await;
        assert!(
            matches!(next, Ok(Event::Response { id: 8, .. })),
            "{next:?}"
        );
        assert!(reader.has_ready(), "the stream's end came with it");
        assert!(matches!(
            reader.next_event().await,
            Event::CallEnded { id: 8, .. }
        ));
        drop(tx);
        assert!(!reader.has_ready(), "a closed channel is not an item");
        assert!(matches!(reader.next_event().await, Event::Closed));
    }

    /// With the task's cooperative budget spent, the channel answers `Pending` though it
    /// holds items; a read must then give way (the task is woken to go on), not spin.
    #[test]
    fn a_read_gives_way_when_the_tasks_budget_is_spent() {
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            rt.block_on(async {
                let (tx, rx) = mpsc::channel(4);
                let mut reader = Reader::new(rx);
                let (go, gate) = tokio::sync::oneshot::channel();
                tx.send(gated_stream(&tx, 5, gate)).await.unwrap();
                // The reader adopts the stream, which has nothing yet.
                let adopted =
                    std::future::poll_fn(|cx| Poll::Ready(reader.poll_fresh(cx).is_pending()))
                        .await;
                assert!(adopted && reader.streams.len() == 1);
                // An item waits on the channel while the stream stays open.
                tx.send(notice("notifications/x")).await.unwrap();
                // Something to spend the budget on.
                let (spend_tx, mut spend_rx) = mpsc::unbounded_channel::<u8>();
                for _ in 0..1_000 {
                    spend_tx.send(0).unwrap();
                }
                let gave_way = std::future::poll_fn(|cx| {
                    while spend_rx.poll_recv(cx).is_ready() {}
                    // Budget spent: this must return, whatever it returns.
                    Poll::Ready(reader.poll_fresh(cx).is_pending())
                })
                .await;
                assert!(gave_way, "with no budget left the channel cannot be read");
                // With a fresh budget, the item is there, then the stream's response.
                assert!(matches!(
                    reader.next_event().await,
                    Event::Notification { .. }
                ));
                go.send(()).unwrap();
                assert!(matches!(
                    reader.next_event().await,
                    Event::Response { id: 5, .. }
                ));
            });
            done_tx.send(()).unwrap();
        });
        done_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("a read with no budget left spun instead of giving way");
    }

    #[tokio::test]
    async fn a_pump_keeps_what_it_reads_for_the_next_reader_and_loses_nothing_when_stopped() {
        let (tx, rx) = mpsc::channel(4);
        let mut reader = Reader::new(rx);
        reader.backlog.push_back(notice("notifications/kept"));
        let (go, gate) = tokio::sync::oneshot::channel();
        tx.send(gated_stream(&tx, 3, gate)).await.unwrap();
        // Stopped while the stream has nothing: the pending read is dropped, nothing lost.
        let stopped = tokio::time::timeout(Duration::from_millis(20), reader.keep_next()).await;
        assert!(stopped.is_err());
        go.send(()).unwrap();
        assert!(matches!(
            reader.keep_next().await,
            Some(Inbound::Message(StreamTag::Call(3), _))
        ));
        assert!(matches!(
            reader.keep_next().await,
            Some(Inbound::Ended(end)) if end.stream == StreamTag::Call(3)
        ));
        // The next reader gets all of it, in order, the earlier backlog first.
        assert!(matches!(
            reader.next_event().await,
            Event::Notification { .. }
        ));
        assert!(matches!(
            reader.next_event().await,
            Event::Response { id: 3, .. }
        ));
        assert!(matches!(
            reader.next_event().await,
            Event::CallEnded { id: 3, .. }
        ));
    }

    #[test]
    fn a_kept_event_goes_back_as_the_item_it_was() {
        for item in [
            Inbound::message(StreamTag::Get, json!({"id": 3, "result": {}})),
            Inbound::message(StreamTag::Get, json!({"id": 3, "method": "ping"})),
            Inbound::message(StreamTag::Get, json!({"method": "notifications/x"})),
            Inbound::ended(StreamTag::Call(3), Some("gone".into())),
            Inbound::ended(StreamTag::Get, None),
        ] {
            let before = format!("{:?}", Event::of(Some(clone_item(&item))));
            let back = into_item(Event::of(Some(item))).expect("not Closed");
            assert_eq!(format!("{:?}", Event::of(Some(back))), before);
        }
        assert!(into_item(Event::Closed).is_none());
    }

    fn clone_item(item: &Inbound) -> Inbound {
        match item {
            Inbound::Message(tag, v) => Inbound::Message(*tag, v.clone()),
            Inbound::Ended(end) => Inbound::ended(end.stream, end.error.clone()),
            Inbound::Stream(_) => unreachable!("no stream among the kept items"),
        }
    }
}
