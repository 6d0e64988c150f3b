//! `ServerStats`: thread-safe record of what the server received and did,
//! for assertions in tests (with `wait_until` for asynchronous conditions).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::Notify;

/// Shape of a received JSON-RPC message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessageKind {
    Request,
    Notification,
    /// A `result` answer to a server request.
    Response,
    /// An `error` answer to a server request.
    ErrorResponse,
    /// Not a valid JSON-RPC message.
    Invalid,
}

/// One JSON-RPC message the server received over POST.
#[derive(Clone, Debug)]
pub struct ReceivedMessage {
    /// Position in the receive order (0-based, reset by `clear`).
    pub seq: u64,
    /// The `Mcp-Session-Id` header it came with (for `initialize`: none).
    pub session_id: Option<String>,
    /// The `MCP-Protocol-Version` header it came with.
    pub protocol_version_header: Option<String>,
    /// The W3C `traceparent` header it came with.
    pub traceparent: Option<String>,
    pub kind: MessageKind,
    pub method: Option<String>,
    pub id: Option<Value>,
    /// The message itself (`Value::Null` when recording is turned off).
    pub raw: Value,
}

/// A request the server sent to the client.
#[derive(Clone, Debug, PartialEq)]
pub struct SentRequest {
    pub session_id: Option<String>,
    pub id: Value,
    pub method: String,
    /// Sent on the standalone GET stream rather than a call stream.
    pub on_get_stream: bool,
}

#[derive(Default)]
struct Inner {
    messages_received: u64,
    received: Vec<ReceivedMessage>,
    tool_starts: HashMap<String, u64>,
    tool_finishes: HashMap<String, u64>,
    sessions_opened: u64,
    sessions_deleted: u64,
    sessions_expired: u64,
    cancellations: Vec<(Option<String>, Value)>,
    get_streams_opened: u64,
    get_streams_open: i64,
    resumptions: u64,
    sent_requests: Vec<SentRequest>,
    unmatched_responses: u64,
    http_errors: HashMap<u16, u64>,
}

fn bump(counts: &mut HashMap<String, u64>, name: &str) {
    match counts.get_mut(name) {
        Some(n) => *n += 1,
        None => {
            counts.insert(name.to_owned(), 1);
        }
    }
}

/// Counters and logs of the server's activity. All methods take `&self`.
#[derive(Default)]
pub struct ServerStats {
    inner: Mutex<Inner>,
    changed: Notify,
}

impl ServerStats {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn update(&self, f: impl FnOnce(&mut Inner)) {
        f(&mut self.lock());
        self.changed.notify_waiters();
    }

    // ----- recording (crate-internal) -----------------------------------

    pub(crate) fn record_message(&self, mut message: ReceivedMessage, keep_raw: bool) {
        self.update(|s| {
            message.seq = s.messages_received;
            s.messages_received += 1;
            if keep_raw {
                s.received.push(message);
            }
        });
    }

    pub(crate) fn record_tool_start(&self, name: &str) {
        self.update(|s| bump(&mut s.tool_starts, name));
    }

    pub(crate) fn record_tool_finish(&self, name: &str) {
        self.update(|s| bump(&mut s.tool_finishes, name));
    }

    pub(crate) fn record_session_opened(&self) {
        self.update(|s| s.sessions_opened += 1);
    }

    pub(crate) fn record_session_deleted(&self) {
        self.update(|s| s.sessions_deleted += 1);
    }

    pub(crate) fn record_session_expired(&self, count: usize) {
        self.update(|s| s.sessions_expired += count as u64);
    }

    pub(crate) fn record_cancellation(&self, session: Option<String>, request_id: Value) {
        self.update(|s| s.cancellations.push((session, request_id)));
    }

    pub(crate) fn record_get_stream_opened(&self) {
        self.update(|s| {
            s.get_streams_opened += 1;
            s.get_streams_open += 1;
        });
    }

    pub(crate) fn record_get_stream_closed(&self) {
        self.update(|s| s.get_streams_open -= 1);
    }

    pub(crate) fn record_resumption(&self) {
        self.update(|s| s.resumptions += 1);
    }

    pub(crate) fn record_sent_request(&self, request: SentRequest) {
        self.update(|s| s.sent_requests.push(request));
    }

    pub(crate) fn record_unmatched_response(&self) {
        self.update(|s| s.unmatched_responses += 1);
    }

    pub(crate) fn record_http_error(&self, status: u16) {
        self.update(|s| *s.http_errors.entry(status).or_default() += 1);
    }

    // ----- queries -------------------------------------------------------

    /// How many times the named tool's handler was started.
    pub fn tool_starts(&self, name: &str) -> u64 {
        self.lock().tool_starts.get(name).copied().unwrap_or(0)
    }

    /// How many times the named tool's handler ran to completion (not cancelled).
    pub fn tool_finishes(&self, name: &str) -> u64 {
        self.lock().tool_finishes.get(name).copied().unwrap_or(0)
    }

    /// Every JSON-RPC message received (including ones later rejected).
    pub fn messages_received(&self) -> u64 {
        self.lock().messages_received
    }

    /// The received messages in order (empty if recording is off).
    pub fn received(&self) -> Vec<ReceivedMessage> {
        self.lock().received.clone()
    }

    /// Received messages with the given method, in order.
    pub fn received_with_method(&self, method: &str) -> Vec<ReceivedMessage> {
        self.lock()
            .received
            .iter()
            .filter(|m| m.method.as_deref() == Some(method))
            .cloned()
            .collect()
    }

    /// How many received messages had the given method.
    pub fn count_method(&self, method: &str) -> usize {
        self.lock()
            .received
            .iter()
            .filter(|m| m.method.as_deref() == Some(method))
            .count()
    }

    /// Received answers (result or error) to server requests.
    pub fn responses_received(&self) -> Vec<ReceivedMessage> {
        self.lock()
            .received
            .iter()
            .filter(|m| matches!(m.kind, MessageKind::Response | MessageKind::ErrorResponse))
            .cloned()
            .collect()
    }

    pub fn sessions_opened(&self) -> u64 {
        self.lock().sessions_opened
    }

    /// Sessions opened and not yet deleted or expired (shutdown not counted).
    pub fn sessions_live(&self) -> u64 {
        let s = self.lock();
        s.sessions_opened
            .saturating_sub(s.sessions_deleted + s.sessions_expired)
    }

    /// Sessions ended by the client's DELETE.
    pub fn sessions_deleted(&self) -> u64 {
        self.lock().sessions_deleted
    }

    /// Sessions ended by the expiry fault.
    pub fn sessions_expired(&self) -> u64 {
        self.lock().sessions_expired
    }

    /// Request ids named by `notifications/cancelled`, in order.
    pub fn cancellations(&self) -> Vec<Value> {
        self.lock()
            .cancellations
            .iter()
            .map(|(_, id)| id.clone())
            .collect()
    }

    /// `(session id, request id)` of every cancellation received.
    pub fn cancellations_by_session(&self) -> Vec<(Option<String>, Value)> {
        self.lock().cancellations.clone()
    }

    pub fn get_streams_opened(&self) -> u64 {
        self.lock().get_streams_opened
    }

    /// GET streams whose connection is still open.
    pub fn get_streams_open(&self) -> u64 {
        self.lock().get_streams_open.max(0) as u64
    }

    /// GET requests that resumed a stream with `Last-Event-ID`.
    pub fn resumptions(&self) -> u64 {
        self.lock().resumptions
    }

    /// Requests the server sent to clients, in order (empty if recording
    /// is off).
    pub fn sent_requests(&self) -> Vec<SentRequest> {
        self.lock().sent_requests.clone()
    }

    /// Client answers whose id matched no pending server request.
    pub fn unmatched_responses(&self) -> u64 {
        self.lock().unmatched_responses
    }

    /// How many HTTP replies had the given error status (4xx/5xx).
    pub fn http_errors(&self, status: u16) -> u64 {
        self.lock().http_errors.get(&status).copied().unwrap_or(0)
    }

    /// Forget everything recorded so far (GET streams still open stay counted).
    pub fn clear(&self) {
        self.update(|s| {
            let open = s.get_streams_open;
            *s = Inner::default();
            s.get_streams_open = open;
        });
    }

    /// Wait until `condition` holds, re-checking on every change; false on timeout.
    pub async fn wait_until(
        &self,
        condition: impl Fn(&ServerStats) -> bool,
        timeout: Duration,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if condition(self) {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return condition(self);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn wait_until_wakes_on_change() {
        let stats = Arc::new(ServerStats::default());
        let s2 = stats.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            s2.record_tool_start("greet");
        });
        assert!(
            stats
                .wait_until(|s| s.tool_starts("greet") == 1, Duration::from_secs(1))
                .await
        );
        assert!(
            !stats
                .wait_until(|s| s.tool_starts("greet") == 2, Duration::from_millis(30))
                .await
        );
        stats.clear();
        assert_eq!(stats.tool_starts("greet"), 0);
    }
}
