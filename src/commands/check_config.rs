//! `mrtr-gateway check-config`: validate a file, report the first problem by key.

use std::path::Path;

use crate::config::{Config, UpstreamTransport};
use crate::descriptor_budget;

/// Validates `path`; on success returns a one-line summary, and a warning line when the caps
/// may need more open files than this machine's hard limit (which `serve` raises to).
pub fn check(path: &Path) -> Result<String, crate::config::ConfigError> {
    let c = Config::load(path)?;
    let upstream = match c.upstream.transport {
        UpstreamTransport::StreamableHttp => c.upstream.url.to_string(),
        UpstreamTransport::Sse => format!("{} (HTTP+SSE)", c.upstream.url),
        UpstreamTransport::Stdio => format!("stdio: {}", c.upstream.stdio.command.join(" ")),
    };
    let mut summary = format!(
        "config OK: listen {}{}, upstream {}, {} state key(s) (sealing with {:?}), state ttl {:?}",
        c.listen.addr,
        c.listen.path,
        upstream,
        c.state.keys.len(),
        c.state.keys[0].id,
        c.state.ttl
    );
    let (_, hard) = descriptor_budget::limits();
    if let Some(warning) = descriptor_budget::shortfall(&descriptor_budget::need(&c), hard) {
        summary.push_str("\nwarning: ");
        summary.push_str(&warning);
    }
    Ok(summary)
}

/// Validates `path` and renders the effective configuration with secrets redacted.
pub fn print(path: &Path) -> Result<String, crate::config::ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        crate::config::ConfigError::new("(file)", format!("cannot read {}: {e}", path.display()))
    })?;
    let vars: Vec<(String, String)> = std::env::vars().collect();
    Config::effective_toml(&text, &vars, path.parent())
}
