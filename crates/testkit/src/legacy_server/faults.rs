//! Fault injection switches, flipped at run time through
//! `LegacyServer::faults()`: expiring sessions, failing `initialize`,
//! breaking the next tool-call SSE stream in various ways, closing GET
//! streams.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use super::session::SessionStore;
use super::stats::ServerStats;

/// What goes wrong on a tool call's SSE stream. Each queued fault applies
/// to one `tools/call` answered over SSE (not in JSON response mode). The
/// tool handler runs in every case; only what reaches the client changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallStreamFault {
    /// First send an event whose data is not JSON, then carry on normally.
    MalformedEvent,
    /// First send a well-formed `notifications/message` event whose `data:`
    /// payload is padded to the given number of bytes, then carry on.
    OversizeEvent(usize),
    /// Send the response headers, then end the stream at once: no priming
    /// event, no response.
    CloseAfterHeaders,
    /// Deliver exactly one event (the priming event under TypeScript
    /// framing, else the first request/notification), then end the stream;
    /// the response is never delivered.
    CloseAfterFirstEvent,
    /// Send the headers, then nothing ever; the connection stays open until
    /// the client goes away, the session ends or the server shuts down.
    HangAfterHeaders,
    /// SSE polling (2025-11-25): a priming event with an id and
    /// `retry: <retry_ms>`, then the connection is closed. Everything the
    /// call produces afterwards, its response included, is logged and
    /// replayed to a `GET` carrying `Last-Event-ID`, which then keeps
    /// streaming the rest of the call.
    Poll { retry_ms: u64 },
}

#[derive(Default)]
struct State {
    initialize_status: Option<u16>,
    post_failures: VecDeque<u16>,
    call_stream: VecDeque<CallStreamFault>,
    expire_before: VecDeque<String>,
    dropped_call_responses: usize,
}

/// The server's fault switches (see the method docs).
pub struct Faults {
    state: Mutex<State>,
    sessions: Arc<SessionStore>,
    stats: Arc<ServerStats>,
}

impl Faults {
    pub(crate) fn new(sessions: Arc<SessionStore>, stats: Arc<ServerStats>) -> Self {
        Faults {
            state: Mutex::new(State::default()),
            sessions,
            stats,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Answer every `initialize` with this HTTP status (e.g. `Some(500)`)
    /// until reset with `None`.
    pub fn fail_initialize(&self, status: Option<u16>) {
        self.lock().initialize_status = status;
    }

    /// Answer the next `count` POSTs (any message, `initialize` included)
    /// with HTTP `status` and a JSON-RPC error body, before looking at them.
    pub fn fail_next_posts(&self, status: u16, count: usize) {
        self.lock()
            .post_failures
            .extend(std::iter::repeat_n(status, count));
    }

    /// Expire the session of the next request with this method just before
    /// it is handled, so that request gets 404 (a session lost between
    /// `initialize` and the call). Queued; each entry fires once.
    pub fn expire_session_before(&self, method: &str) {
        self.lock().expire_before.push_back(method.to_owned());
    }

    pub(crate) fn take_expire_before(&self, method: &str) -> bool {
        let mut state = self.lock();
        match state.expire_before.iter().position(|m| m == method) {
            Some(i) => {
                state.expire_before.remove(i);
                true
            }
            None => false,
        }
    }

    /// Queue a fault for the next tool call answered over SSE.
    pub fn next_call_stream(&self, fault: CallStreamFault) {
        self.lock().call_stream.push_back(fault);
    }

    /// Run the next `tools/call` to its end without a stream (so it cannot ask the client
    /// anything), then close its connection instead of answering, before any response head:
    /// the tool ran, and the client never hears of it.
    pub fn drop_next_call_response(&self) {
        self.lock().dropped_call_responses += 1;
    }

    pub(crate) fn take_dropped_call_response(&self) -> bool {
        let mut state = self.lock();
        let queued = state.dropped_call_responses > 0;
        state.dropped_call_responses = state.dropped_call_responses.saturating_sub(1);
        queued
    }

    /// Expire one session now: its next request gets 404. Returns whether
    /// it was live.
    pub fn expire_session(&self, session_id: &str) -> bool {
        let ended = self.sessions.end(session_id);
        if ended {
            self.stats.record_session_expired(1);
        }
        ended
    }

    /// Expire every live session; returns how many there were.
    pub fn expire_all_sessions(&self) -> usize {
        let n = self.sessions.end_all();
        self.stats.record_session_expired(n);
        n
    }

    /// Close a session's standalone GET stream (the client may reopen it).
    pub fn close_get_stream(&self, session_id: &str) -> bool {
        self.sessions
            .get(session_id)
            .is_some_and(|s| s.close_get_stream())
    }

    /// Close every session's GET stream; returns how many were live.
    pub fn close_all_get_streams(&self) -> usize {
        self.sessions
            .all()
            .iter()
            .filter(|s| s.close_get_stream())
            .count()
    }

    /// Clear all queued faults and switches.
    pub fn reset(&self) {
        *self.lock() = State::default();
    }

    pub(crate) fn initialize_status(&self) -> Option<u16> {
        self.lock().initialize_status
    }

    pub(crate) fn take_post_failure(&self) -> Option<u16> {
        let mut state = self.lock();
        if state.post_failures.is_empty() {
            return None;
        }
        state.post_failures.pop_front()
    }

    pub(crate) fn take_call_stream_fault(&self) -> Option<CallStreamFault> {
        let mut state = self.lock();
        if state.call_stream.is_empty() {
            return None;
        }
        state.call_stream.pop_front()
    }
}
