//! `[admin]`: the admin listener's address and the limits that keep it from starving the MCP
//! listener (connection cap, header and idle timeouts) or answering a page it should not
//! (the `Host` allow-list; see [`crate::admin`]).

use std::net::SocketAddr;
use std::time::Duration;

use super::check::{bounded_duration, in_range};
use super::{ConfigError, raw::RawAdmin};

#[derive(Debug, Clone)]
pub struct AdminConfig {
    /// `None` when the admin listener is disabled (`addr = ""`).
    pub addr: Option<SocketAddr>,
    /// Admin connections open at once; more are closed as soon as they are accepted.
    pub max_connections: usize,
    /// Longest time a client may take to send a request's headers (the first one included).
    pub header_read_timeout: Duration,
    /// An admin connection with no request in flight is closed after this long.
    pub idle_timeout: Duration,
    /// `Host` names accepted besides the defaults (lower case, no port).
    pub allowed_hosts: Vec<String>,
    /// How long `/readyz` reuses the result of its upstream check.
    pub upstream_check_cache: Duration,
    /// How long `/readyz` waits for a running upstream check before answering with the
    /// previous result.
    pub upstream_check_wait: Duration,
}

/// A `Host` entry: a DNS name, an IPv4 address, or an IPv6 address in brackets; no port.
fn valid_host(h: &str) -> bool {
    if let Some(inner) = h.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        return inner.parse::<std::net::Ipv6Addr>().is_ok();
    }
    !h.is_empty()
        && h.len() <= 253
        && h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
}

pub(super) fn admin_config(raw: &RawAdmin) -> Result<AdminConfig, ConfigError> {
    let addr = if raw.addr.is_empty() {
        None
    } else {
        Some(raw.addr.parse().map_err(|_| {
            ConfigError::new(
                "admin.addr",
                format!("not a socket address: {:?} (or \"\" to disable)", raw.addr),
            )
        })?)
    };
    let mut allowed_hosts = Vec::with_capacity(raw.allowed_hosts.len());
    for (i, h) in raw.allowed_hosts.iter().enumerate() {
        if !valid_host(h) {
            return Err(ConfigError::new(
                format!("admin.allowed_hosts[{i}]"),
                format!(
                    "{h:?} is not a host name (a DNS name, an IPv4 address or a bracketed IPv6 address, without scheme or port)"
                ),
            ));
        }
        allowed_hosts.push(h.to_ascii_lowercase());
    }
    Ok(AdminConfig {
        addr,
        max_connections: in_range("admin.max_connections", raw.max_connections, 1, 10_000)?,
        header_read_timeout: bounded_duration(
            "admin.header_read_timeout",
            &raw.header_read_timeout,
            Duration::from_secs(600),
        )?,
        idle_timeout: bounded_duration(
            "admin.idle_timeout",
            &raw.idle_timeout,
            Duration::from_secs(3600),
        )?,
        allowed_hosts,
        upstream_check_cache: bounded_duration(
            "admin.upstream_check_cache",
            &raw.upstream_check_cache,
            Duration::from_secs(600),
        )?,
        upstream_check_wait: bounded_duration(
            "admin.upstream_check_wait",
            &raw.upstream_check_wait,
            Duration::from_secs(60),
        )?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_names_or_addresses_without_ports() {
        for ok in [
            "localhost",
            "gw.example.com",
            "10.0.0.7",
            "[::1]",
            "[fd00::1]",
        ] {
            assert!(valid_host(ok), "{ok}");
        }
        for bad in [
            "",
            "gw.example.com:9090",
            "http://gw",
            "[::1]:9090",
            "::1",
            "a b",
            "[zz]",
        ] {
            assert!(!valid_host(bad), "{bad}");
        }
    }
}
