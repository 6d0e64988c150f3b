//! `[upstream]`: how the gateway reaches the legacy server (Streamable HTTP, HTTP+SSE or a
//! stdio child process), with its timeouts, size limits and upstream TLS files.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::check::{bounded_duration, in_range, nonzero_duration, positive_size, resolve};
use super::{ConfigError, raw::RawUpstream};

/// Protocol versions the gateway can speak to a legacy server, newest first.
pub const LEGACY_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// The most `upstream.max_idle_connections` may be.
pub const MAX_IDLE_CONNECTIONS: u64 = 65_536;

/// How the gateway reaches the legacy server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamTransport {
    /// Streamable HTTP (2025-03-26 … 2025-11-25) at `upstream.url`.
    StreamableHttp,
    /// The 2024-11-05 HTTP+SSE transport: `upstream.url` is the SSE endpoint.
    Sse,
    /// A child process per session, newline-delimited JSON on stdin/stdout.
    Stdio,
}

impl UpstreamTransport {
    pub fn as_str(self) -> &'static str {
        match self {
            UpstreamTransport::StreamableHttp => "streamable-http",
            UpstreamTransport::Sse => "sse",
            UpstreamTransport::Stdio => "stdio",
        }
    }
}

/// How to start (and stop) a stdio legacy server.
#[derive(Debug, Clone)]
pub struct StdioConfig {
    /// Program and arguments; empty unless the transport is stdio.
    pub command: Vec<String>,
    /// Variables set on top of the few inherited from the gateway (see `legacy::stdio`).
    pub env: Vec<(String, String)>,
    pub cwd: Option<PathBuf>,
    /// Longest line the child may write on stdout (one JSON-RPC message), bytes.
    pub max_line_bytes: usize,
    /// Child processes alive at once.
    pub max_children: usize,
    /// Longest wait before spawning again after consecutive spawn/initialize failures.
    pub spawn_backoff: Duration,
    /// How long a closing child gets after stdin closes, and again after SIGTERM.
    pub shutdown_grace: Duration,
}

#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    pub transport: UpstreamTransport,
    /// The endpoint for the HTTP transports (unused for stdio).
    pub url: url::Url,
    pub protocol_version: String,
    pub connect_timeout: Duration,
    /// Longest wait for the legacy server's response headers (and for an `initialize` answer).
    pub response_timeout: Duration,
    /// Longest silence on a legacy SSE stream while a call is running.
    pub idle_timeout: Duration,
    /// Longest a single modern request may spend upstream, all phases together.
    pub call_timeout: Duration,
    pub max_event_bytes: usize,
    pub max_stream_bytes: usize,
    pub client_name: String,
    /// Reconnects in a row that deliver nothing before a resumable SSE stream is given up.
    pub resume_attempts: u32,
    /// Upper bound on the server's `retry` delay before reconnecting an SSE stream.
    pub resume_max_delay: Duration,
    /// Idle HTTP connections to the legacy server kept for reuse (0: none).
    pub max_idle_connections: usize,
    /// How long an idle HTTP connection to the legacy server is kept.
    pub connection_idle_timeout: Duration,
    /// TLS toward an `https` URL (`None` for `http` and stdio).
    pub tls: Option<crate::tls::upstream::UpstreamTls>,
    pub stdio: StdioConfig,
}

pub(super) fn upstream_config(
    raw: &RawUpstream,
    base_dir: Option<&Path>,
) -> Result<UpstreamConfig, ConfigError> {
    let transport = match raw.transport.as_str() {
        "streamable-http" => UpstreamTransport::StreamableHttp,
        "sse" => UpstreamTransport::Sse,
        "stdio" => UpstreamTransport::Stdio,
        other => {
            return Err(ConfigError::new(
                "upstream.transport",
                format!("must be \"streamable-http\", \"sse\" or \"stdio\", not {other:?}"),
            ));
        }
    };
    let url = url::Url::parse(&raw.url)
        .map_err(|e| ConfigError::new("upstream.url", format!("not a URL: {e}")))?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(ConfigError::new(
            "upstream.url",
            "scheme must be http or https",
        ));
    }
    if !LEGACY_VERSIONS.contains(&raw.protocol_version.as_str()) {
        return Err(ConfigError::new(
            "upstream.protocol_version",
            format!("must be one of {LEGACY_VERSIONS:?}"),
        ));
    }
    let upstream_tls_url = url.clone();
    Ok(UpstreamConfig {
        transport,
        url,
        protocol_version: raw.protocol_version.clone(),
        connect_timeout: nonzero_duration("upstream.connect_timeout", &raw.connect_timeout)?,
        response_timeout: nonzero_duration("upstream.response_timeout", &raw.response_timeout)?,
        idle_timeout: nonzero_duration("upstream.idle_timeout", &raw.idle_timeout)?,
        call_timeout: nonzero_duration("upstream.call_timeout", &raw.call_timeout)?,
        max_event_bytes: positive_size("upstream.max_event_bytes", raw.max_event_bytes)?,
        max_stream_bytes: positive_size("upstream.max_stream_bytes", raw.max_stream_bytes)?,
        client_name: raw.client_name.clone(),
        resume_attempts: {
            let n = raw.resume_attempts;
            if n == 0 || n > 100 {
                return Err(ConfigError::new(
                    "upstream.resume_attempts",
                    "must be between 1 and 100",
                ));
            }
            n as u32
        },
        resume_max_delay: nonzero_duration("upstream.resume_max_delay", &raw.resume_max_delay)?,
        max_idle_connections: in_range(
            "upstream.max_idle_connections",
            raw.max_idle_connections,
            0,
            MAX_IDLE_CONNECTIONS,
        )?,
        connection_idle_timeout: bounded_duration(
            "upstream.connection_idle_timeout",
            &raw.connection_idle_timeout,
            Duration::from_secs(3600),
        )?,
        tls: upstream_tls(raw, transport, &upstream_tls_url, base_dir)?,
        stdio: stdio_config(raw, transport, base_dir)?,
    })
}

/// The stdio keys: validated whatever the transport (so a typo is caught before it matters),
/// but `command` is required with `transport = "stdio"` and refused without it.
fn stdio_config(
    raw: &RawUpstream,
    transport: UpstreamTransport,
    base_dir: Option<&Path>,
) -> Result<StdioConfig, ConfigError> {
    let is_stdio = transport == UpstreamTransport::Stdio;
    if is_stdio && raw.command.is_empty() {
        return Err(ConfigError::new(
            "upstream.command",
            "required with transport = \"stdio\": the program and its arguments, e.g. [\"python3\", \"server.py\"]",
        ));
    }
    if !is_stdio && !raw.command.is_empty() {
        return Err(ConfigError::new(
            "upstream.command",
            format!(
                "only used with transport = \"stdio\" (upstream.transport is {:?})",
                transport.as_str()
            ),
        ));
    }
    for (i, arg) in raw.command.iter().enumerate() {
        if arg.contains('\0') || (i == 0 && arg.is_empty()) {
            return Err(ConfigError::new(
                format!("upstream.command[{i}]"),
                "must be non-empty text without NUL bytes",
            ));
        }
    }
    let mut env = Vec::with_capacity(raw.env.len());
    for (k, v) in &raw.env {
        if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
            return Err(ConfigError::new(
                format!("upstream.env.{k}"),
                "names must be non-empty without '=' or NUL; values without NUL",
            ));
        }
        env.push((k.clone(), v.clone()));
    }
    let cwd = raw.cwd.as_deref().map(|d| resolve(base_dir, d));
    if is_stdio
        && let Some(dir) = &cwd
        && !dir.is_dir()
    {
        return Err(ConfigError::new(
            "upstream.cwd",
            format!("{} is not a directory", dir.display()),
        ));
    }
    Ok(StdioConfig {
        command: raw.command.clone(),
        env,
        cwd,
        max_line_bytes: positive_size("upstream.max_line_bytes", raw.max_line_bytes)?,
        max_children: positive_size("upstream.stdio_max_children", raw.stdio_max_children)?,
        spawn_backoff: nonzero_duration("upstream.stdio_spawn_backoff", &raw.stdio_spawn_backoff)?,
        shutdown_grace: nonzero_duration(
            "upstream.stdio_shutdown_grace",
            &raw.stdio_shutdown_grace,
        )?,
    })
}

/// The `https` upstream's TLS files and pins, read and checked; refused where they would be
/// unused.
fn upstream_tls(
    raw: &RawUpstream,
    transport: UpstreamTransport,
    url: &url::Url,
    base_dir: Option<&Path>,
) -> Result<Option<crate::tls::upstream::UpstreamTls>, ConfigError> {
    use crate::tls::server_verifier::SpkiPin;
    use crate::tls::upstream::{UpstreamTls, UpstreamTlsFiles};
    let files = UpstreamTlsFiles {
        ca_file: raw.ca_file.as_ref().map(|f| resolve(base_dir, f)),
        client_cert_file: raw.client_cert_file.as_ref().map(|f| resolve(base_dir, f)),
        client_key_file: raw.client_key_file.as_ref().map(|f| resolve(base_dir, f)),
    };
    let https = transport != UpstreamTransport::Stdio && url.scheme() == "https";
    if !https {
        let set = [
            ("upstream.ca_file", files.ca_file.is_some()),
            (
                "upstream.client_cert_file",
                files.client_cert_file.is_some(),
            ),
            ("upstream.client_key_file", files.client_key_file.is_some()),
            ("upstream.pin_sha256", !raw.pin_sha256.is_empty()),
        ];
        if let Some((key, _)) = set.into_iter().find(|(_, is_set)| *is_set) {
            return Err(ConfigError::new(
                key,
                "only used with an https upstream.url (and an HTTP transport)",
            ));
        }
        return Ok(None);
    }
    let pins = raw
        .pin_sha256
        .iter()
        .enumerate()
        .map(|(i, text)| {
            SpkiPin::parse(text)
                .map_err(|message| ConfigError::new(format!("upstream.pin_sha256[{i}]"), message))
        })
        .collect::<Result<Vec<_>, _>>()?;
    UpstreamTls::load(&files, &pins)
        .map(Some)
        .map_err(|e| ConfigError::new(e.key, e.message))
}
