//! `[listen]`: the MCP listener's address and path, and the limits it enforces on
//! connections, request bodies and accepted origins.

use std::net::SocketAddr;
use std::time::Duration;

use super::check::{bounded_duration, duration_up_to, in_range, nonzero_duration, positive_size};
use super::{ConfigError, raw::RawListen};

#[derive(Debug, Clone)]
pub struct ListenConfig {
    pub addr: SocketAddr,
    pub path: String,
    pub max_body_bytes: usize,
    /// `Origin` values accepted (exact match, e.g. `"https://app.example"`); empty: only requests
    /// without an `Origin` header, or whose `Origin` is a loopback origin, are accepted.
    pub allowed_origins: Vec<String>,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    /// How long an HTTP/1 connection stays quiet before the gateway frees its HTTP buffers
    /// and state, keeping only the socket (`None`: never).
    pub idle_release_after: Option<Duration>,
    pub max_concurrent_requests: usize,
    /// Longest time a request body may take to arrive, from its headers to its last byte.
    pub body_read_timeout: Duration,
    /// Client connections open at once, and from one source address.
    pub max_connections: usize,
    pub max_connections_per_source: usize,
    /// How many leading bits of an IPv6 source address make one source, for the per-source
    /// connection cap and the quotas of anonymous callers (1 to 128; 64 by default).
    pub ipv6_source_prefix: u8,
    /// HTTP/2 streams one connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS).
    pub http2_max_concurrent_streams: u32,
}

pub(super) fn listen_config(raw: &RawListen) -> Result<ListenConfig, ConfigError> {
    Ok(ListenConfig {
        addr: raw.addr.parse().map_err(|_| {
            ConfigError::new(
                "listen.addr",
                format!(
                    "not a socket address: {:?} (expected e.g. \"127.0.0.1:8080\")",
                    raw.addr
                ),
            )
        })?,
        path: {
            if !raw.path.starts_with('/') {
                return Err(ConfigError::new("listen.path", "must start with '/'"));
            }
            raw.path.clone()
        },
        max_body_bytes: positive_size("listen.max_body_bytes", raw.max_body_bytes)?,
        allowed_origins: {
            for (i, o) in raw.allowed_origins.iter().enumerate() {
                let ok = url::Url::parse(o).is_ok_and(|u| u.origin().ascii_serialization() == *o);
                if !ok {
                    return Err(ConfigError::new(
                        format!("listen.allowed_origins[{i}]"),
                        format!("{o:?} is not an origin (scheme://host[:port], no path)"),
                    ));
                }
            }
            raw.allowed_origins.clone()
        },
        header_read_timeout: nonzero_duration(
            "listen.header_read_timeout",
            &raw.header_read_timeout,
        )?,
        idle_timeout: nonzero_duration("listen.idle_timeout", &raw.idle_timeout)?,
        idle_release_after: Some(duration_up_to(
            "listen.idle_release_after",
            &raw.idle_release_after,
            Duration::from_secs(3600),
        )?)
        .filter(|d| !d.is_zero()),
        max_concurrent_requests: positive_size(
            "listen.max_concurrent_requests",
            raw.max_concurrent_requests,
        )?,
        body_read_timeout: bounded_duration(
            "listen.body_read_timeout",
            &raw.body_read_timeout,
            Duration::from_secs(600),
        )?,
        max_connections: in_range("listen.max_connections", raw.max_connections, 1, 1_000_000)?,
        max_connections_per_source: in_range(
            "listen.max_connections_per_source",
            raw.max_connections_per_source,
            1,
            1_000_000,
        )?,
        ipv6_source_prefix: in_range("listen.ipv6_source_prefix", raw.ipv6_source_prefix, 1, 128)?
            as u8,
        http2_max_concurrent_streams: in_range(
            "listen.http2_max_concurrent_streams",
            raw.http2_max_concurrent_streams,
            1,
            10_000,
        )? as u32,
    })
}
