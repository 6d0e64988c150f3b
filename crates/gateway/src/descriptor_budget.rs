//! The descriptor budget: whether the configured caps fit in the process's open-file limit
//! (`RLIMIT_NOFILE`).
//!
//! Every client connection, upstream socket and stdio pipe is a descriptor. When the process
//! runs out, `accept` fails on *every* listener: without caps that fit, one listener's
//! clients (say, idle admin sockets) can leave the other unable to accept. So:
//! - at start (`serve`) the soft limit is raised to the hard limit, as most servers do (the
//!   soft limit is often 1024, far below what the default caps may use; the gateway uses
//!   epoll, never `select`, so a high limit costs nothing);
//! - the worst case the configuration allows is estimated ([`need`]) and, when it exceeds the
//!   limit, `serve` logs a warning naming the keys and `check-config` prints it (a warning, not
//!   an error: the limit belongs to the machine that runs the gateway, not to the file);
//! - each listener has its own cap, so neither can take the descriptors the other needs, and
//!   accept errors back off ([`crate::front::accept`]).
//!
//! The estimate, per key: one descriptor per client connection (`listen.max_connections`,
//! `admin.max_connections`); with an HTTP upstream two sockets (call and GET stream) per
//! request slot, parked call, idle pooled session and listen stream, and one per legacy GET
//! stream; with a stdio upstream three pipes per child; plus 64 for everything else (logs,
//! watchers, Redis, the runtime).

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

use crate::config::{Config, UpstreamTransport};

/// Descriptors kept for what no key bounds: logs, file watchers, Redis, the runtime.
const RESERVE: u64 = 64;
/// The soft limit tried when the hard limit is unlimited (Linux's default `nr_open`).
const UNLIMITED_TARGET: u64 = 1 << 20;

/// The worst case a configuration allows, by the key that bounds each part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Need {
    pub parts: Vec<(&'static str, u64)>,
}

impl Need {
    pub fn total(&self) -> u64 {
        self.parts.iter().map(|(_, n)| n).sum::<u64>() + RESERVE
    }
}

impl std::fmt::Display for Need {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (key, n) in &self.parts {
            write!(f, "{key}: {n}, ")?;
        }
        write!(f, "other: {RESERVE}")
    }
}

/// The descriptors `cfg` may use at worst.
pub fn need(cfg: &Config) -> Need {
    let n = |v: usize| v as u64;
    let mut parts = vec![("listen.max_connections", n(cfg.listen.max_connections))];
    if cfg.admin.addr.is_some() {
        parts.push(("admin.max_connections", n(cfg.admin.max_connections)));
    }
    match cfg.upstream.transport {
        UpstreamTransport::Stdio => {
            parts.push((
                "upstream.stdio_max_children",
                3 * n(cfg.upstream.stdio.max_children),
            ));
        }
        UpstreamTransport::StreamableHttp | UpstreamTransport::Sse => {
            parts.push((
                "listen.max_concurrent_requests",
                2 * n(cfg.listen.max_concurrent_requests),
            ));
            parts.push(("parking.max_calls", 2 * n(cfg.parking.max_calls)));
            parts.push(("pool.max_idle", 2 * n(cfg.pool.max_idle)));
            parts.push((
                "subscriptions.max_streams",
                2 * n(cfg.subscriptions.max_streams),
            ));
            parts.push((
                "legacy_clients.max_get_streams",
                n(cfg.legacy_clients.max_get_streams),
            ));
        }
    }
    Need { parts }
}

/// The open-file limit: (soft, hard); `None` stands for unlimited.
pub fn limits() -> (Option<u64>, Option<u64>) {
    let r = getrlimit(Resource::Nofile);
    (r.current, r.maximum)
}

/// The soft open-file limit before and after [`raise_soft_limit`] (`None`: unlimited).
#[derive(Debug, Clone, Copy)]
pub struct Raised {
    pub before: Option<u64>,
    pub after: Option<u64>,
}

/// Raises the soft open-file limit to the hard one (or to 2^20 when the hard one is
/// unlimited); leaves it as it is when that fails.
pub fn raise_soft_limit() -> Raised {
    let (soft, hard) = limits();
    let target = hard.unwrap_or(UNLIMITED_TARGET);
    let raised = soft.is_some_and(|s| s < target)
        && setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(target),
                maximum: hard,
            },
        )
        .is_ok();
    Raised {
        before: soft,
        after: if raised { Some(target) } else { soft },
    }
}

/// A warning when `need` exceeds `limit` (`None`: unlimited), naming the keys.
pub fn shortfall(need: &Need, limit: Option<u64>) -> Option<String> {
    let limit = limit?;
    (need.total() > limit).then(|| {
        format!(
            "the configured caps may need up to {} open files ({need}) but the limit (RLIMIT_NOFILE) is {limit}: \
             raise it (ulimit -n, systemd LimitNOFILE, the container's nofile ulimit) or lower those keys; \
             otherwise accepting may fail under load",
            need.total()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(extra: &str) -> Config {
        let text = format!(
            "{extra}\n[[state.keys]]\nid = \"k1\"\nsecret = \"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\"\n"
        );
        Config::from_toml_str(&text, &[], None).unwrap()
    }

    #[test]
    fn the_estimate_counts_every_cap_by_transport() {
        let http = need(&cfg(
            "[listen]\nmax_connections = 100\nmax_connections_per_source = 10\nmax_concurrent_requests = 10\n\
             [admin]\nmax_connections = 5\n[parking]\nmax_calls = 7\n[pool]\nmax_idle = 3\n\
             [subscriptions]\nmax_streams = 2\nmax_streams_per_principal = 1\n\
             [legacy_clients]\nmax_get_streams = 4\nmax_get_streams_per_principal = 1",
        ));
        assert_eq!(http.total(), 100 + 5 + 20 + 14 + 6 + 4 + 4 + RESERVE);
        let stdio = need(&cfg(
            "[listen]\nmax_connections = 100\nmax_connections_per_source = 10\n[admin]\naddr = \"\"\n\
             [upstream]\ntransport = \"stdio\"\ncommand = [\"x\"]\nstdio_max_children = 4",
        ));
        assert_eq!(stdio.total(), 100 + 12 + RESERVE);
        assert!(shortfall(&stdio, Some(176)).is_none());
        let warning = shortfall(&stdio, Some(175)).unwrap();
        assert!(warning.contains("listen.max_connections: 100"), "{warning}");
        assert!(
            warning.contains("upstream.stdio_max_children: 12"),
            "{warning}"
        );
        assert!(shortfall(&stdio, None).is_none());
    }
}
