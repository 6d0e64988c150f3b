//! Per-session state (negotiated version, client capabilities, log level,
//! server-request routing, in-flight calls, open streams) and the store of
//! live sessions.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use dashmap::DashMap;
use serde_json::Value;
use tokio::sync::{Notify, oneshot};
use tokio_util::sync::CancellationToken;

use super::config::ServerRequestIds;
use super::jsonrpc::{RpcError, id_key};
use super::sse_writer::OutboundStream;

/// The answer the client POSTed to one of our requests.
pub(crate) type ClientAnswer = Result<Value, RpcError>;

/// MCP logging levels, least severe first.
const LOG_LEVELS: [&str; 8] = [
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
];
const NO_LEVEL: u8 = u8::MAX;

pub(crate) fn log_level_rank(level: &str) -> Option<u8> {
    LOG_LEVELS
        .iter()
        .position(|l| *l == level)
        .and_then(|p| u8::try_from(p).ok())
}

/// Keep at most this many streams per session before pruning finished ones.
const STREAM_REGISTRY_SOFT_LIMIT: usize = 256;

/// A snapshot of a live session (see `LegacyServer::session`).
#[derive(Clone, Debug)]
pub struct SessionInfo {
    pub id: String,
    pub protocol_version: String,
    /// The `capabilities` from the client's `initialize`.
    pub client_capabilities: Value,
    pub client_info: Value,
    /// `notifications/initialized` was received.
    pub initialized: bool,
    /// Set by `logging/setLevel`.
    pub log_level: Option<String>,
    /// Resource URIs subscribed to, sorted.
    pub subscriptions: Vec<String>,
    /// A client is connected to the standalone GET stream.
    pub get_stream_open: bool,
    /// The `Authorization` the session was opened with (when the server requires one).
    pub authorization: Option<String>,
}

pub(crate) struct Session {
    /// `None` for the throw-away session of a stateless request.
    pub(crate) id: Option<String>,
    pub(crate) protocol_version: String,
    pub(crate) client_capabilities: Value,
    pub(crate) client_info: Value,
    /// The credential that opened the session (`LegacyServerConfig::credentials`).
    pub(crate) authorization: Option<String>,
    pub(crate) token: CancellationToken,
    initialized: AtomicBool,
    log_level: AtomicU8,
    subscriptions: Mutex<HashSet<String>>,
    next_request_id: AtomicI64,
    mirror_call_ids: bool,
    pub(crate) event_seq: Arc<AtomicU64>,
    next_stream_no: AtomicU64,
    pending: Mutex<HashMap<String, oneshot::Sender<ClientAnswer>>>,
    in_flight: Mutex<HashMap<String, (u64, CancellationToken)>>,
    call_generation: AtomicU64,
    streams: Mutex<HashMap<u64, Arc<OutboundStream>>>,
    get_stream: Mutex<Option<Arc<OutboundStream>>>,
    get_stream_changed: Notify,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A random, visible-ASCII session id.
pub(crate) fn mint_session_id() -> String {
    let mut raw = [0u8; 16];
    if getrandom::fill(&mut raw).is_err() {
        // Practically unreachable; fall back to something still unique.
        static FALLBACK: AtomicU64 = AtomicU64::new(1);
        let n = FALLBACK.fetch_add(1, Ordering::Relaxed);
        raw[..8].copy_from_slice(&n.to_le_bytes());
    }
    raw.iter().map(|b| format!("{b:02x}")).collect()
}

impl Session {
    pub(crate) fn new(
        id: Option<String>,
        protocol_version: String,
        client_capabilities: Value,
        client_info: Value,
        ids: ServerRequestIds,
        parent: &CancellationToken,
    ) -> Session {
        let (start, mirror_call_ids) = match ids {
            ServerRequestIds::Sequential { start } => (start, false),
            ServerRequestIds::MirrorCallId { start } => (start, true),
        };
        Session {
            id,
            protocol_version,
            client_capabilities,
            client_info,
            authorization: None,
            token: parent.child_token(),
            initialized: AtomicBool::new(false),
            log_level: AtomicU8::new(NO_LEVEL),
            subscriptions: Mutex::new(HashSet::new()),
            next_request_id: AtomicI64::new(start),
            mirror_call_ids,
            event_seq: Arc::new(AtomicU64::new(0)),
            next_stream_no: AtomicU64::new(1),
            pending: Mutex::new(HashMap::new()),
            in_flight: Mutex::new(HashMap::new()),
            call_generation: AtomicU64::new(0),
            streams: Mutex::new(HashMap::new()),
            get_stream: Mutex::new(None),
            get_stream_changed: Notify::new(),
        }
    }

    pub(crate) fn is_stateless(&self) -> bool {
        self.id.is_none()
    }

    pub(crate) fn mark_initialized(&self) {
        self.initialized.store(true, Ordering::Relaxed);
    }

    pub(crate) fn is_initialized(&self) -> bool {
        self.initialized.load(Ordering::Relaxed)
    }

    pub(crate) fn set_log_level(&self, level: &str) -> bool {
        match log_level_rank(level) {
            Some(rank) => {
                self.log_level.store(rank, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    /// Whether a `notifications/message` at `level` passes the session's filter.
    pub(crate) fn log_passes(&self, level: &str) -> bool {
        let min = self.log_level.load(Ordering::Relaxed);
        min == NO_LEVEL || log_level_rank(level).is_none_or(|rank| rank >= min)
    }

    pub(crate) fn subscribe(&self, uri: &str, on: bool) {
        let mut subs = lock(&self.subscriptions);
        if on {
            subs.insert(uri.to_owned());
        } else {
            subs.remove(uri);
        }
    }

    /// A snapshot for assertions.
    pub(crate) fn info(&self) -> SessionInfo {
        let level = self.log_level.load(Ordering::Relaxed);
        let mut subscriptions: Vec<String> = lock(&self.subscriptions).iter().cloned().collect();
        subscriptions.sort_unstable();
        SessionInfo {
            id: self.id.clone().unwrap_or_default(),
            protocol_version: self.protocol_version.clone(),
            client_capabilities: self.client_capabilities.clone(),
            client_info: self.client_info.clone(),
            initialized: self.is_initialized(),
            log_level: LOG_LEVELS.get(usize::from(level)).map(|l| (*l).to_owned()),
            subscriptions,
            get_stream_open: self.live_get_stream().is_some(),
            authorization: self.authorization.clone(),
        }
    }

    pub(crate) fn next_stream_number(&self) -> u64 {
        self.next_stream_no.fetch_add(1, Ordering::Relaxed)
    }

    // ----- server→client requests -------------------------------------

    /// Pick the id of a new server request and register a waiter for its
    /// answer. `mirror` is the id of the call issuing the request when it
    /// may be reused (first request of that call).
    pub(crate) fn register_server_request(
        &self,
        mirror: Option<&Value>,
    ) -> (Value, oneshot::Receiver<ClientAnswer>) {
        let (tx, rx) = oneshot::channel();
        let mut pending = lock(&self.pending);
        let mirrored = mirror
            .filter(|_| self.mirror_call_ids)
            .filter(|id| !pending.contains_key(&id_key(id)))
            .cloned();
        let id = mirrored.unwrap_or_else(|| {
            loop {
                let n = Value::from(self.next_request_id.fetch_add(1, Ordering::Relaxed));
                if !pending.contains_key(&id_key(&n)) {
                    break n;
                }
            }
        });
        pending.insert(id_key(&id), tx);
        (id, rx)
    }

    pub(crate) fn forget_server_request(&self, id: &Value) {
        lock(&self.pending).remove(&id_key(id));
    }

    /// Hand the client's answer to whoever waits for it; false when nobody does.
    pub(crate) fn resolve_server_request(&self, id: &Value, answer: ClientAnswer) -> bool {
        match lock(&self.pending).remove(&id_key(id)) {
            Some(tx) => tx.send(answer).is_ok(),
            None => false,
        }
    }

    // ----- in-flight client calls --------------------------------------

    /// Register a client call as in flight until the returned guard drops.
    pub(crate) fn begin_call(self: &Arc<Self>, id: &Value) -> InFlightCall {
        let token = self.token.child_token();
        let generation = self.call_generation.fetch_add(1, Ordering::Relaxed);
        let key = id_key(id);
        lock(&self.in_flight).insert(key.clone(), (generation, token.clone()));
        InFlightCall {
            session: self.clone(),
            key,
            generation,
            token,
        }
    }

    pub(crate) fn cancel_call(&self, id: &Value) -> bool {
        match lock(&self.in_flight).remove(&id_key(id)) {
            Some((_, token)) => {
                token.cancel();
                true
            }
            None => false,
        }
    }

    // ----- streams -----------------------------------------------------

    pub(crate) fn register_stream(&self, stream: Arc<OutboundStream>) {
        let mut streams = lock(&self.streams);
        if streams.len() >= STREAM_REGISTRY_SOFT_LIMIT {
            streams.retain(|_, s| !s.is_finished());
        }
        streams.insert(stream.number, stream);
    }

    pub(crate) fn unregister_stream(&self, number: u64) {
        lock(&self.streams).remove(&number);
    }

    pub(crate) fn stream(&self, number: u64) -> Option<Arc<OutboundStream>> {
        lock(&self.streams).get(&number).cloned()
    }

    /// The standalone GET stream if a client is connected to it.
    pub(crate) fn live_get_stream(&self) -> Option<Arc<OutboundStream>> {
        lock(&self.get_stream)
            .as_ref()
            .filter(|s| s.is_attached())
            .cloned()
    }

    /// Takes the GET stream out of the session, open: ending the session then leaves it be.
    pub(crate) fn detach_get_stream(&self) -> Option<Arc<OutboundStream>> {
        let stream = lock(&self.get_stream).take()?;
        self.unregister_stream(stream.number);
        Some(stream)
    }

    /// Install a new GET stream unless a live one exists (then `false`).
    pub(crate) fn install_get_stream(&self, stream: Arc<OutboundStream>) -> bool {
        {
            let mut slot = lock(&self.get_stream);
            if slot.as_ref().is_some_and(|s| s.is_attached()) {
                return false;
            }
            if let Some(old) = slot.replace(stream.clone()) {
                self.unregister_stream(old.number);
            }
        }
        self.register_stream(stream);
        self.get_stream_changed.notify_waiters();
        true
    }

    /// Tell waiters a GET stream was re-attached by a resuming client.
    pub(crate) fn get_stream_reattached(&self) {
        self.get_stream_changed.notify_waiters();
    }

    pub(crate) fn close_get_stream(&self) -> bool {
        let stream = lock(&self.get_stream).take();
        match stream {
            Some(s) => {
                let was_live = s.is_attached();
                s.close();
                self.unregister_stream(s.number);
                was_live
            }
            None => false,
        }
    }

    /// Wait up to `timeout` for a live GET stream.
    pub(crate) async fn wait_get_stream(&self, timeout: Duration) -> Option<Arc<OutboundStream>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.get_stream_changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(s) = self.live_get_stream() {
                return Some(s);
            }
            // The client may also drop and reopen; poll now and then in case
            // a drop was not signalled.
            let step = deadline
                .saturating_duration_since(tokio::time::Instant::now())
                .min(Duration::from_millis(50));
            if step.is_zero() {
                return None;
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep(step) => {}
                _ = self.token.cancelled() => return None,
            }
        }
    }

    /// End the session: cancel every in-flight handler, fail every pending
    /// server request, close every stream.
    pub(crate) fn end(&self) {
        self.token.cancel();
        lock(&self.pending).clear();
        lock(&self.in_flight).clear();
        lock(&self.get_stream).take();
        let streams: Vec<_> = lock(&self.streams).drain().map(|(_, s)| s).collect();
        for s in streams {
            s.close();
        }
        self.get_stream_changed.notify_waiters();
    }
}

/// A client call registered for `notifications/cancelled`; unregisters
/// itself when dropped.
pub(crate) struct InFlightCall {
    session: Arc<Session>,
    key: String,
    generation: u64,
    pub(crate) token: CancellationToken,
}

impl Drop for InFlightCall {
    fn drop(&mut self) {
        let mut in_flight = lock(&self.session.in_flight);
        if in_flight
            .get(&self.key)
            .is_some_and(|(generation, _)| *generation == self.generation)
        {
            in_flight.remove(&self.key);
        }
    }
}

/// Live sessions by id.
#[derive(Default)]
pub(crate) struct SessionStore {
    sessions: DashMap<String, Arc<Session>>,
}

impl SessionStore {
    pub(crate) fn insert(&self, session: Arc<Session>) {
        if let Some(id) = &session.id {
            self.sessions.insert(id.clone(), session);
        }
    }

    pub(crate) fn get(&self, id: &str) -> Option<Arc<Session>> {
        self.sessions.get(id).map(|s| s.clone())
    }

    /// Remove and end a session; false if it was not live.
    pub(crate) fn end(&self, id: &str) -> bool {
        match self.sessions.remove(id) {
            Some((_, s)) => {
                s.end();
                true
            }
            None => false,
        }
    }

    /// End every session, returning how many there were.
    pub(crate) fn end_all(&self) -> usize {
        let ids = self.ids();
        ids.iter().filter(|id| self.end(id)).count()
    }

    pub(crate) fn ids(&self) -> Vec<String> {
        self.sessions.iter().map(|e| e.key().clone()).collect()
    }

    pub(crate) fn len(&self) -> usize {
        self.sessions.len()
    }

    pub(crate) fn all(&self) -> Vec<Arc<Session>> {
        self.sessions.iter().map(|e| e.value().clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn session(ids: ServerRequestIds) -> Arc<Session> {
        Arc::new(Session::new(
            Some(mint_session_id()),
            "2025-11-25".into(),
            json!({}),
            json!({}),
            ids,
            &CancellationToken::new(),
        ))
    }

    #[test]
    fn session_ids_are_visible_ascii_and_distinct() {
        let a = mint_session_id();
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|b| (0x21..=0x7e).contains(&b)));
        assert_ne!(a, mint_session_id());
    }

    #[tokio::test]
    async fn server_requests_route_answers_by_id() {
        let s = session(ServerRequestIds::Sequential { start: 5 });
        let (id_a, rx_a) = s.register_server_request(None);
        let (id_b, rx_b) = s.register_server_request(None);
        assert_eq!((id_a.clone(), id_b.clone()), (json!(5), json!(6)));
        assert!(!s.resolve_server_request(&json!("5"), Ok(json!(0))));
        assert!(s.resolve_server_request(&id_b, Ok(json!("b"))));
        assert!(s.resolve_server_request(&id_a, Err(RpcError::internal("a"))));
        assert_eq!(rx_b.await.unwrap(), Ok(json!("b")));
        assert!(rx_a.await.unwrap().is_err());
    }

    #[test]
    fn mirrored_ids_reuse_call_id_once() {
        let s = session(ServerRequestIds::MirrorCallId { start: 100 });
        let (first, _a) = s.register_server_request(Some(&json!(1)));
        let (second, _b) = s.register_server_request(Some(&json!(1)));
        assert_eq!(first, json!(1));
        assert_eq!(second, json!(100));
    }

    #[test]
    fn log_filter_respects_level() {
        let s = session(ServerRequestIds::default());
        assert!(s.log_passes("debug"));
        assert!(s.set_log_level("warning"));
        assert!(!s.log_passes("info"));
        assert!(s.log_passes("error"));
        assert!(!s.set_log_level("loud"));
    }

    #[test]
    fn ending_cancels_calls() {
        let s = session(ServerRequestIds::default());
        let call = s.begin_call(&json!(1));
        assert!(!call.token.is_cancelled());
        s.end();
        assert!(call.token.is_cancelled());
        let again = s.begin_call(&json!(2));
        drop(again);
        assert!(!s.cancel_call(&json!(2)), "dropped calls are unregistered");
    }
}
