//! `ToolContext`: what a running handler can do — send server→client
//! requests on its call stream or on the session's GET stream, send
//! notifications (progress, logs, list changes), read the session's
//! negotiated state, and notice cancellation.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Value, json};
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use super::Shared;
use super::jsonrpc::{RpcError, outgoing};
use super::session::{InFlightCall, Session};
use super::sse_writer::{Delivery, OutboundStream, StreamKind};
use super::stats::SentRequest;

/// Handle given to every handler invocation; cheap to clone.
#[derive(Clone)]
pub struct ToolContext {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    session: Arc<Session>,
    request_id: Value,
    call_stream: Option<Arc<OutboundStream>>,
    progress_token: Option<Value>,
    cancel: CancellationToken,
    /// Keeps the call registered for cancellation while any clone lives.
    _in_flight: Option<InFlightCall>,
    /// Whether the call's id was already reused for a server request
    /// (`ServerRequestIds::MirrorCallId`).
    mirror_used: AtomicBool,
}

/// Removes a pending server request when its waiter goes away.
struct PendingGuard<'a> {
    session: &'a Session,
    id: Value,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.session.forget_server_request(&self.id);
    }
}

impl ToolContext {
    pub(crate) fn new(
        shared: Arc<Shared>,
        session: Arc<Session>,
        request_id: Value,
        call_stream: Option<Arc<OutboundStream>>,
        progress_token: Option<Value>,
        call: Result<InFlightCall, CancellationToken>,
    ) -> Self {
        let (cancel, in_flight) = match call {
            Ok(call) => (call.token.clone(), Some(call)),
            Err(token) => (token, None),
        };
        ToolContext {
            inner: Arc::new(Inner {
                shared,
                session,
                request_id,
                call_stream,
                progress_token,
                cancel,
                _in_flight: in_flight,
                mirror_used: AtomicBool::new(false),
            }),
        }
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.inner.shared
    }

    pub(crate) fn session(&self) -> &Arc<Session> {
        &self.inner.session
    }

    pub(crate) fn cancel_token(&self) -> &CancellationToken {
        &self.inner.cancel
    }

    // ----- what the handler may read ------------------------------------

    /// The `capabilities` the client declared in `initialize` (`{}` when
    /// unknown, e.g. in stateless mode).
    pub fn client_capabilities(&self) -> &Value {
        &self.inner.session.client_capabilities
    }

    /// The `clientInfo` the client declared in `initialize`.
    pub fn client_info(&self) -> &Value {
        &self.inner.session.client_info
    }

    /// `None` in stateless mode.
    pub fn session_id(&self) -> Option<&str> {
        self.inner.session.id.as_deref()
    }

    /// The JSON-RPC id of the client request being handled.
    pub fn request_id(&self) -> &Value {
        &self.inner.request_id
    }

    pub fn protocol_version(&self) -> &str {
        &self.inner.session.protocol_version
    }

    /// `params._meta.progressToken` of the request, if any.
    pub fn progress_token(&self) -> Option<&Value> {
        self.inner.progress_token.as_ref()
    }

    /// Whether the request has an SSE stream (false in JSON response mode).
    pub fn has_call_stream(&self) -> bool {
        self.inner.call_stream.is_some()
    }

    /// Resolves when the client cancelled this request, the session ended
    /// or the server shuts down. (The handler's future is also dropped then.)
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.inner.cancel.cancelled()
    }

    pub fn is_cancelled(&self) -> bool {
        self.inner.cancel.is_cancelled()
    }

    // ----- server→client requests ---------------------------------------

    /// Send a request on this call's own SSE stream and wait for the answer
    /// the client POSTs back. Fails at once in JSON response or stateless
    /// mode, or when the stream can no longer reach the client.
    pub async fn request(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        if self.inner.session.is_stateless() {
            return Err(RpcError::server_request_failed(
                "stateless server: server-to-client requests are not possible",
            ));
        }
        let Some(stream) = self.inner.call_stream.clone() else {
            return Err(RpcError::server_request_failed(
                "JSON response mode: this call has no SSE stream for server-to-client requests",
            ));
        };
        self.send_request(&stream, method, params).await
    }

    /// Send a request on the session's standalone GET stream, waiting up to
    /// the configured `get_stream_wait` for the client to open one.
    pub async fn request_on_get_stream(
        &self,
        method: &str,
        params: Value,
    ) -> Result<Value, RpcError> {
        let config = &self.inner.shared.config;
        if self.inner.session.is_stateless() || !config.get_stream_enabled {
            return Err(RpcError::server_request_failed(
                "this server has no standalone GET stream",
            ));
        }
        let wait = config.get_stream_wait;
        let stream = tokio::select! {
            s = self.inner.session.wait_get_stream(wait) => s,
            _ = self.inner.cancel.cancelled() => None,
        };
        let Some(stream) = stream else {
            return Err(RpcError::server_request_failed(
                "no standalone GET stream is open for this session",
            ));
        };
        self.send_request(&stream, method, params).await
    }

    async fn send_request(
        &self,
        stream: &Arc<OutboundStream>,
        method: &str,
        params: Value,
    ) -> Result<Value, RpcError> {
        if !stream.can_reach_client() {
            return Err(RpcError::server_request_failed(
                "the stream to the client is closed",
            ));
        }
        let session = &*self.inner.session;
        let mirror = (!self.inner.request_id.is_null()
            && !self.inner.mirror_used.swap(true, Ordering::Relaxed))
        .then_some(&self.inner.request_id);
        let (id, answer) = session.register_server_request(mirror);
        let _pending = PendingGuard {
            session,
            id: id.clone(),
        };
        let message = outgoing(Some(&id), method, params);
        if self.inner.shared.config.record_messages {
            self.inner.shared.stats.record_sent_request(SentRequest {
                session_id: session.id.clone(),
                id: id.clone(),
                method: method.to_owned(),
                on_get_stream: stream.kind == StreamKind::Standalone,
            });
        }
        if stream.send(&message) == Delivery::Dropped {
            return Err(RpcError::server_request_failed(format!(
                "could not deliver {method} to the client"
            )));
        }
        let answer = async {
            answer.await.unwrap_or_else(|_| {
                Err(RpcError::server_request_failed(
                    "the session ended before the client answered",
                ))
            })
        };
        let timeout = self.inner.shared.config.server_request_timeout;
        tokio::select! {
            biased;
            _ = self.inner.cancel.cancelled() => Err(RpcError::new(
                RpcError::REQUEST_CANCELLED,
                "the call was cancelled while waiting for the client",
            )),
            outcome = async {
                match timeout {
                    Some(limit) => tokio::time::timeout(limit, answer).await.unwrap_or_else(|_| {
                        Err(RpcError::server_request_failed(format!(
                            "no answer to {method} within {limit:?}"
                        )))
                    }),
                    None => answer.await,
                }
            } => outcome,
        }
    }

    /// `elicitation/create` in form mode, on the call stream.
    pub async fn elicit_form(
        &self,
        message: &str,
        requested_schema: Value,
    ) -> Result<Value, RpcError> {
        let mut params = json!({"message": message, "requestedSchema": requested_schema});
        if self.protocol_version() >= "2025-11-25" {
            params["mode"] = json!("form");
        }
        self.request("elicitation/create", params).await
    }

    /// `elicitation/create` in URL mode (2025-11-25), on the call stream.
    pub async fn elicit_url(
        &self,
        message: &str,
        url: &str,
        elicitation_id: &str,
    ) -> Result<Value, RpcError> {
        let params = json!({
            "mode": "url",
            "message": message,
            "url": url,
            "elicitationId": elicitation_id,
        });
        self.request("elicitation/create", params).await
    }

    /// `sampling/createMessage` on the call stream.
    pub async fn create_message(&self, params: Value) -> Result<Value, RpcError> {
        self.request("sampling/createMessage", params).await
    }

    /// `roots/list` on the GET stream (as the Python SDK sends it).
    pub async fn list_roots(&self) -> Result<Value, RpcError> {
        self.request_on_get_stream("roots/list", Value::Null).await
    }

    /// `ping` on the call stream.
    pub async fn ping(&self) -> Result<Value, RpcError> {
        self.request("ping", Value::Null).await
    }

    // ----- notifications --------------------------------------------------

    /// Send a notification on the call stream. `notifications/message` is
    /// dropped when below the session's `logging/setLevel` level. Returns
    /// whether it was delivered (or logged for a resuming client).
    pub fn notify(&self, method: &str, params: Value) -> bool {
        if !self.passes_log_filter(method, &params) {
            return false;
        }
        match &self.inner.call_stream {
            Some(stream) => stream.send(&outgoing(None, method, params)) != Delivery::Dropped,
            None => false,
        }
    }

    /// Send a notification on the session's GET stream, if one is open.
    pub fn notify_get_stream(&self, method: &str, params: Value) -> bool {
        if !self.passes_log_filter(method, &params) {
            return false;
        }
        match self.inner.session.live_get_stream() {
            Some(stream) => stream.send(&outgoing(None, method, params)) != Delivery::Dropped,
            None => false,
        }
    }

    /// `notifications/progress` on the call stream, when the request
    /// carried a progress token (otherwise nothing is sent).
    pub fn progress(&self, progress: f64, total: Option<f64>, message: Option<&str>) -> bool {
        let Some(token) = self.inner.progress_token.clone() else {
            return false;
        };
        let mut params = json!({"progressToken": token, "progress": progress});
        if let Some(total) = total {
            params["total"] = json!(total);
        }
        if let Some(message) = message {
            params["message"] = json!(message);
        }
        self.notify("notifications/progress", params)
    }

    /// `notifications/message` (a log line) on the call stream.
    pub fn log(&self, level: &str, data: Value) -> bool {
        self.notify(
            "notifications/message",
            json!({"level": level, "data": data}),
        )
    }

    fn passes_log_filter(&self, method: &str, params: &Value) -> bool {
        method != "notifications/message"
            || params["level"]
                .as_str()
                .is_none_or(|level| self.inner.session.log_passes(level))
    }
}
