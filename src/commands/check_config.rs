//! `mrtr-gateway check-config`: validate a file, report the first problem by key.

use std::path::Path;

use crate::config::redact::redacted_url;
use crate::config::{Config, UpstreamTransport};

/// Validates `path`; on success returns a one-line summary (URL userinfo redacted).
pub fn check(path: &Path) -> Result<String, crate::config::ConfigError> {
    let c = Config::load(path)?;
    let upstream = match c.upstream.transport {
        UpstreamTransport::StreamableHttp => redacted_url(&c.upstream.url),
        UpstreamTransport::Sse => format!("{} (HTTP+SSE)", redacted_url(&c.upstream.url)),
        UpstreamTransport::Stdio => format!("stdio: {}", c.upstream.stdio.command.join(" ")),
    };
    Ok(format!(
        "config OK: listen {}{}, upstream {}, {} state key(s) (sealing with {:?}), state ttl {:?}",
        c.listen.addr,
        c.listen.path,
        upstream,
        c.state.keys.len(),
        c.state.keys[0].id,
        c.state.ttl
    ))
}

/// Validates `path` and renders the effective configuration with secrets redacted.
pub fn print(path: &Path) -> Result<String, crate::config::ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        crate::config::ConfigError::new("(file)", format!("cannot read {}: {e}", path.display()))
    })?;
    let vars: Vec<(String, String)> = std::env::vars().collect();
    Config::effective_toml(&text, &vars, path.parent())
}
