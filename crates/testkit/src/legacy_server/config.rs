//! Configuration of the legacy server: endpoint, protocol versions, SSE
//! framing, response mode and the knobs tests use to shape its behaviour.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use serde_json::Value;

/// The protocol versions the server speaks by default, newest first.
pub const DEFAULT_PROTOCOL_VERSIONS: [&str; 3] = ["2025-11-25", "2025-06-18", "2025-03-26"];

/// How SSE events are laid out on the wire, mimicking the two reference SDKs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SseFraming {
    /// Python SDK style: `\r\n` line endings, `event: message` + `data:`,
    /// no event ids and no priming event.
    #[default]
    Python,
    /// TypeScript SDK style: `\n` line endings, every event carries an `id:`
    /// and every stream opens with a priming event (`id:` + empty `data:`).
    TypeScript,
}

/// How the server numbers the requests it sends to the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerRequestIds {
    /// Integers counting up per session from the given start.
    Sequential { start: i64 },
    /// The first server request a call issues reuses the id of that client
    /// call (forcing an id collision the client must cope with); any further
    /// request of the same call, or one already pending under that id, falls
    /// back to the sequential counter, which starts at `start`.
    MirrorCallId { start: i64 },
}

impl Default for ServerRequestIds {
    fn default() -> Self {
        ServerRequestIds::Sequential { start: 0 }
    }
}

/// `serverInfo` of the `InitializeResult`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerInfo {
    pub name: String,
    pub version: String,
}

impl Default for ServerInfo {
    fn default() -> Self {
        ServerInfo {
            name: "legacy-mcp-server".to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
        }
    }
}

/// One bearer credential the server accepts, and what `initialize` answers whoever presents
/// it (`None`: the server-wide `instructions` / `capabilities`). Tests use it for a server whose
/// view depends on the caller's token.
#[derive(Clone, Debug, Default)]
pub struct CredentialView {
    /// The whole `Authorization` header value, e.g. `"Bearer alice-token"`.
    pub authorization: String,
    pub instructions: Option<String>,
    pub capabilities: Option<Value>,
}

/// Everything that shapes the server's wire behaviour. Build it with
/// struct-update syntax: `LegacyServerConfig { json_response: true, ..Default::default() }`.
#[derive(Clone, Debug)]
pub struct LegacyServerConfig {
    /// Address to bind; loopback with an ephemeral port by default.
    pub bind: SocketAddr,
    /// The single MCP endpoint path.
    pub path: String,
    /// Supported protocol versions; the first one is the server's latest and
    /// is offered when the client asks for an unsupported version.
    pub protocol_versions: Vec<String>,
    /// SSE event layout.
    pub framing: SseFraming,
    /// Answer every request with `application/json` instead of an SSE stream.
    pub json_response: bool,
    /// Issue no session ids, refuse GET/DELETE, no server→client requests.
    pub stateless: bool,
    /// Serve the standalone GET SSE stream (otherwise GET → 405).
    pub get_stream_enabled: bool,
    /// Allow DELETE to end a session (otherwise DELETE → 405).
    pub delete_enabled: bool,
    /// Hold each DELETE this long before ending its session and answering (a server slow to
    /// tear a session down).
    pub delete_delay: Duration,
    /// Keep a session's GET stream open after a DELETE ends the session, until the client
    /// closes it or the server stops (a server that never ends it).
    pub get_stream_outlives_delete: bool,
    /// Reject POSTs whose `Accept` lacks `application/json` /
    /// `text/event-stream`, and GETs lacking `text/event-stream`, with 406.
    pub require_accept: bool,
    pub server_info: ServerInfo,
    /// `capabilities` of the `InitializeResult`; `None` derives them from
    /// the registered handlers.
    pub capabilities: Option<Value>,
    pub instructions: Option<String>,
    pub server_request_ids: ServerRequestIds,
    /// How long `ToolContext::request_on_get_stream` waits for a GET stream
    /// to be opened before failing.
    pub get_stream_wait: Duration,
    /// Give up waiting for the client's answer to a server request after
    /// this long (`None`: wait until cancelled).
    pub server_request_timeout: Option<Duration>,
    /// When a call is cancelled by `notifications/cancelled`, still send a
    /// JSON-RPC error response on its SSE stream (the spec says SHOULD NOT;
    /// the stream is just closed by default). JSON-mode calls always get an
    /// error response, since the HTTP exchange needs a body.
    pub respond_to_cancelled: bool,
    /// Keep the raw JSON of every received message in `ServerStats`
    /// (turn off for load runs).
    pub record_messages: bool,
    /// Largest accepted POST body.
    pub max_body_bytes: usize,
    /// Events kept per session for `Last-Event-ID` replay (only streams
    /// whose events carry ids are logged).
    pub event_log_limit: usize,
    /// Credentials the server knows (empty: none). With any listed, every request must carry
    /// one of them as `Authorization` (else 401 with `WWW-Authenticate: Bearer`), unless
    /// `credentials_optional`, and a session answers only the credential that opened it
    /// (another gets 403).
    pub credentials: Vec<CredentialView>,
    /// Serve a request carrying none of `credentials` with the server-wide view instead of
    /// refusing it.
    pub credentials_optional: bool,
}

impl Default for LegacyServerConfig {
    fn default() -> Self {
        LegacyServerConfig {
            bind: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            path: "/mcp".to_owned(),
            protocol_versions: DEFAULT_PROTOCOL_VERSIONS
                .iter()
                .map(|v| (*v).to_owned())
                .collect(),
            framing: SseFraming::default(),
            json_response: false,
            stateless: false,
            get_stream_enabled: true,
            delete_enabled: true,
            delete_delay: Duration::ZERO,
            get_stream_outlives_delete: false,
            require_accept: true,
            server_info: ServerInfo::default(),
            capabilities: None,
            instructions: None,
            server_request_ids: ServerRequestIds::default(),
            get_stream_wait: Duration::from_secs(2),
            server_request_timeout: Some(Duration::from_secs(60)),
            respond_to_cancelled: false,
            record_messages: true,
            max_body_bytes: 4 * 1024 * 1024,
            event_log_limit: 1024,
            credentials: Vec::new(),
            credentials_optional: false,
        }
    }
}

impl LegacyServerConfig {
    /// The version to answer `initialize` with: the requested one when
    /// supported, else the server's latest.
    pub fn negotiate(&self, requested: Option<&str>) -> String {
        match requested {
            Some(v) if self.protocol_versions.iter().any(|s| s == v) => v.to_owned(),
            _ => self
                .protocol_versions
                .first()
                .cloned()
                .unwrap_or_else(|| DEFAULT_PROTOCOL_VERSIONS[0].to_owned()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_prefers_requested_supported_version() {
        let cfg = LegacyServerConfig::default();
        assert_eq!(cfg.negotiate(Some("2025-06-18")), "2025-06-18");
        assert_eq!(cfg.negotiate(Some("2024-11-05")), "2025-11-25");
        assert_eq!(cfg.negotiate(None), "2025-11-25");
        let narrow = LegacyServerConfig {
            protocol_versions: vec!["2025-03-26".into()],
            ..Default::default()
        };
        assert_eq!(narrow.negotiate(Some("2025-11-25")), "2025-03-26");
    }
}
