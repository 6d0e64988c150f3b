//! An in-process *legacy* MCP server (protocol 2025-11-25, also
//! 2025-06-18 and 2025-03-26) speaking Streamable HTTP, used by the `demo`
//! command, by the gateway's integration tests (it records everything it
//! receives and misbehaves on demand) and by the load harness.
//!
//! ```no_run
//! use std::time::Duration;
//! use mrtr_testkit::legacy_server::{Handlers, LegacyServer, LegacyServerConfig};
//! use serde_json::json;
//!
//! # async fn example() -> std::io::Result<()> {
//! let handlers = Handlers::new().tool(
//!     "greet",
//!     "Greets whoever answers",
//!     json!({"type": "object"}),
//!     |ctx, _args| async move {
//!         let answer = ctx
//!             .elicit_form("Your name?", json!({"type": "object",
//!                 "properties": {"name": {"type": "string"}}}))
//!             .await?;
//!         let name = answer["content"]["name"].as_str().unwrap_or("?").to_owned();
//!         Ok(json!({"content": [{"type": "text", "text": format!("Hello {name}")}]}))
//!     },
//! );
//! let server = LegacyServer::start(LegacyServerConfig::default(), handlers).await?;
//! // ... point a client at server.url(), then e.g.:
//! server
//!     .stats()
//!     .wait_until(|s| s.tool_starts("greet") == 1, Duration::from_secs(1))
//!     .await;
//! server.faults().expire_all_sessions();
//! server.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! Files: `config` (options), `handlers` (registry), `context` (what a
//! handler can do), `dispatch` (method routing), `transport` (HTTP routing, checks,
//! DELETE), `post` and `get_stream` (the POST and GET halves),
//! `session` (per-session state), `sse_writer` (SSE framing and streams),
//! `stats` (what was received), `faults` (fault injection), `demo` (the
//! demo tool set).

mod config;
mod context;
mod demo;
mod dispatch;
mod faults;
mod get_stream;
mod handlers;
mod jsonrpc;
mod post;
mod session;
mod sse_writer;
mod stats;
mod transport;

#[cfg(test)]
mod test_client;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use config::{
    CredentialView, DEFAULT_PROTOCOL_VERSIONS, LegacyServerConfig, ServerInfo, ServerRequestIds,
    SseFraming,
};
pub use context::ToolContext;
pub use demo::demo_handlers;
pub use faults::{CallStreamFault, Faults};
pub use handlers::{Handler, HandlerFuture, HandlerResult, Handlers};
pub use jsonrpc::RpcError;
pub use session::SessionInfo;
pub use stats::{MessageKind, ReceivedMessage, SentRequest, ServerStats};

use session::SessionStore;

/// State shared by the listener, every connection and every handler.
pub(crate) struct Shared {
    pub(crate) config: LegacyServerConfig,
    handlers: RwLock<Arc<Handlers>>,
    pub(crate) sessions: Arc<SessionStore>,
    pub(crate) stats: Arc<ServerStats>,
    pub(crate) faults: Faults,
    /// Cancelled at shutdown; parent of every session's token.
    pub(crate) shutdown: CancellationToken,
    /// Connection and handler tasks.
    pub(crate) tasks: TaskTracker,
}

impl Shared {
    pub(crate) fn handlers(&self) -> Arc<Handlers> {
        self.handlers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// A running legacy server. Dropping it stops it too (without waiting).
pub struct LegacyServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    accept_task: Option<JoinHandle<()>>,
}

impl LegacyServer {
    /// Bind `config.bind` (loopback, ephemeral port by default) and serve.
    pub async fn start(config: LegacyServerConfig, handlers: Handlers) -> std::io::Result<Self> {
        let listener = TcpListener::bind(config.bind).await?;
        let addr = listener.local_addr()?;
        let sessions = Arc::new(SessionStore::default());
        let stats = Arc::new(ServerStats::default());
        let shared = Arc::new(Shared {
            config,
            handlers: RwLock::new(Arc::new(handlers)),
            faults: Faults::new(sessions.clone(), stats.clone()),
            sessions,
            stats,
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
        });
        let accept_task = tokio::spawn(accept_loop(listener, shared.clone()));
        tracing::debug!(%addr, "legacy MCP server listening");
        Ok(LegacyServer {
            shared,
            addr,
            accept_task: Some(accept_task),
        })
    }

    /// The endpoint URL, e.g. `http://127.0.0.1:PORT/mcp`.
    pub fn url(&self) -> String {
        format!("http://{}{}", self.addr, self.shared.config.path)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn config(&self) -> &LegacyServerConfig {
        &self.shared.config
    }

    pub fn stats(&self) -> &ServerStats {
        &self.shared.stats
    }

    /// A shared handle on the stats that outlives `&self` borrows.
    pub fn stats_handle(&self) -> Arc<ServerStats> {
        self.shared.stats.clone()
    }

    pub fn faults(&self) -> &Faults {
        &self.shared.faults
    }

    /// Swap the handler set (e.g. before sending `tools/list_changed`).
    pub fn set_handlers(&self, handlers: Handlers) {
        *self
            .shared
            .handlers
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Arc::new(handlers);
    }

    /// Ids of the live sessions.
    pub fn session_ids(&self) -> Vec<String> {
        self.shared.sessions.ids()
    }

    pub fn live_sessions(&self) -> usize {
        self.shared.sessions.len()
    }

    /// A snapshot of a live session (`None` if unknown, deleted or expired).
    pub fn session(&self, session_id: &str) -> Option<SessionInfo> {
        self.shared.sessions.get(session_id).map(|s| s.info())
    }

    /// Send a notification on every live GET stream; returns how many got it.
    pub fn notify_all_get_streams(&self, method: &str, params: Value) -> usize {
        let message = jsonrpc::outgoing(None, method, params);
        self.shared
            .sessions
            .all()
            .iter()
            .filter_map(|s| s.live_get_stream())
            .filter(|stream| stream.send(&message) == sse_writer::Delivery::Delivered)
            .count()
    }

    /// Send a request to a session's client on its GET stream, outside any
    /// call (waits for the stream like `ToolContext::request_on_get_stream`).
    pub async fn request_on_get_stream(
        &self,
        session_id: &str,
        method: &str,
        params: Value,
    ) -> Result<Value, RpcError> {
        let Some(session) = self.shared.sessions.get(session_id) else {
            return Err(RpcError::server_request_failed("no such session"));
        };
        let token = session.token.child_token();
        let ctx = ToolContext::new(
            self.shared.clone(),
            session,
            Value::Null,
            None,
            None,
            Err(token),
        );
        ctx.request_on_get_stream(method, params).await
    }

    /// Stop accepting, end every session (cancelling handlers, closing
    /// streams) and wait briefly for connections to wind down.
    pub async fn shutdown(mut self) {
        self.stop();
        self.shared.tasks.close();
        let _ = tokio::time::timeout(Duration::from_secs(2), self.shared.tasks.wait()).await;
        if let Some(task) = self.accept_task.take() {
            let _ = task.await;
        }
    }

    fn stop(&self) {
        self.shared.shutdown.cancel();
        self.shared.sessions.end_all();
    }
}

impl Drop for LegacyServer {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let accepted = tokio::select! {
            _ = shared.shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let tcp = match accepted {
            Ok((tcp, _peer)) => tcp,
            Err(e) => {
                // E.g. out of file descriptors: back off instead of spinning.
                tracing::warn!(error = %e, "legacy server accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let conn_shared = shared.clone();
        shared.tasks.spawn(async move {
            let token = conn_shared.shutdown.clone();
            let service_shared = conn_shared.clone();
            let service = service_fn(move |req| transport::serve(service_shared.clone(), req));
            let builder = auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection(TokioIo::new(tcp), service);
            tokio::pin!(conn);
            tokio::select! {
                result = conn.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "legacy server connection ended with error");
                    }
                }
                _ = token.cancelled() => {}
            }
        });
    }
}
