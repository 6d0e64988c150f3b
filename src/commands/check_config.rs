//! `mrtr-gateway check-config`: validate a file, report the first problem by key.

use std::path::Path;

use crate::config::Config;

/// Validates `path`; on success returns a one-line summary.
pub fn check(path: &Path) -> Result<String, crate::config::ConfigError> {
    let c = Config::load(path)?;
    Ok(format!(
        "config OK: listen {}{}, upstream {}, {} state key(s) (sealing with {:?}), state ttl {:?}",
        c.listen.addr,
        c.listen.path,
        c.upstream.url,
        c.state.keys.len(),
        c.state.keys[0].id,
        c.state.ttl
    ))
}
