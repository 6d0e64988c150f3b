//! `[pool]`: how legacy sessions are kept warm between calls (or opened per call), how many
//! idle ones are kept, and which sessions are opened at start.

use std::time::Duration;

use super::check::{duration_up_to, in_range, nonzero_duration};
use super::{ConfigError, raw::RawPool};
use crate::fair_share::{FairShare, Fractions};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// Keep sessions warm between calls (checked out by one call at a time).
    Pooled,
    /// A fresh session per call, closed after it.
    PerCall,
}

#[derive(Debug, Clone)]
pub struct PoolConfig {
    pub mode: PoolMode,
    pub max_idle_per_key: usize,
    pub max_idle: usize,
    /// Idle sessions one caller scope (principal and forwarded credential) may hold, over all
    /// its capability sets: `pool.max_idle_per_principal`, unset `quotas.caller_share` of
    /// `max_idle`. The pool evicts rather than refuses, so the newcomers' reserve is not used.
    pub idle_share: FairShare,
    pub idle_timeout: Duration,
    /// How long a session given back may sit unread before a task reads it (answering the
    /// server's `ping`s, relaying its notifications). Zero: read at once.
    pub idle_read_after: Duration,
    /// Sessions opened into the pool at start (`pool.warm_up`), declaring `warm_up_declared`.
    pub warm_up: usize,
    pub warm_up_declared: mrtr_wire::capabilities::Declared,
    /// Longest wait, after `notifications/roots/list_changed` on a reused session, for the
    /// server's `roots/list` before the call is sent (zero: never wait).
    pub roots_refresh_wait: Duration,
    /// Waits in a row that may time out, with no re-ask ever seen, before the gateway stops
    /// waiting on this upstream (until the next reload).
    pub roots_refresh_probes: u32,
}

pub(super) fn pool_config(raw: &RawPool, fractions: Fractions) -> Result<PoolConfig, ConfigError> {
    let max_idle = usize::try_from(raw.max_idle).unwrap_or(usize::MAX);
    let per_principal = raw
        .max_idle_per_principal
        .map(|n| in_range("pool.max_idle_per_principal", n, 1, u64::MAX))
        .transpose()?;
    let idle_share = FairShare::of(
        max_idle,
        per_principal,
        Fractions {
            newcomer_reserve: 0.0,
            ..fractions
        },
    );
    Ok(PoolConfig {
        mode: match raw.mode.as_str() {
            "pooled" => PoolMode::Pooled,
            "per-call" => PoolMode::PerCall,
            other => {
                return Err(ConfigError::new(
                    "pool.mode",
                    format!("must be \"pooled\" or \"per-call\", not {other:?}"),
                ));
            }
        },
        max_idle_per_key: usize::try_from(raw.max_idle_per_key).unwrap_or(usize::MAX),
        max_idle,
        idle_share,
        idle_timeout: nonzero_duration("pool.idle_timeout", &raw.idle_timeout)?,
        idle_read_after: duration_up_to(
            "pool.idle_read_after",
            &raw.idle_read_after,
            Duration::from_secs(1),
        )?,
        warm_up: usize::try_from(raw.warm_up).unwrap_or(usize::MAX),
        warm_up_declared: warm_up_declared(&raw.warm_up_capabilities)?,
        roots_refresh_wait: duration_up_to(
            "pool.roots_refresh_wait",
            &raw.roots_refresh_wait,
            Duration::from_secs(60),
        )?,
        roots_refresh_probes: match raw.roots_refresh_probes {
            n @ 1..=1000 => n as u32,
            _ => {
                return Err(ConfigError::new(
                    "pool.roots_refresh_probes",
                    "must be between 1 and 1000",
                ));
            }
        },
    })
}

/// The capability set warm sessions declare: names of what a modern client declares.
fn warm_up_declared(names: &[String]) -> Result<mrtr_wire::capabilities::Declared, ConfigError> {
    let mut d = mrtr_wire::capabilities::Declared::default();
    for name in names {
        match name.as_str() {
            "roots" => d.roots = true,
            "sampling" => d.sampling = true,
            "sampling.tools" => {
                d.sampling = true;
                d.sampling_tools = true;
            }
            "sampling.context" => {
                d.sampling = true;
                d.sampling_context = true;
            }
            "elicitation" | "elicitation.form" => d.elicit_form = true,
            "elicitation.url" => d.elicit_url = true,
            other => {
                return Err(ConfigError::new(
                    "pool.warm_up_capabilities",
                    format!(
                        "unknown capability {other:?}; use roots, sampling, sampling.tools, \
                         sampling.context, elicitation (or elicitation.form), elicitation.url"
                    ),
                ));
            }
        }
    }
    Ok(d)
}

/// Warm sessions are keyed like any pooled session (principal, capabilities, forwarded
/// credential), so they are only useful where the key is known before any request arrives.
pub(super) fn check_warm_up(
    pool: &PoolConfig,
    auth: &crate::auth::config::AuthConfig,
) -> Result<(), ConfigError> {
    use crate::auth::config::ModeConfig;
    use crate::auth::upstream_credentials::UpstreamCredentials;
    if pool.warm_up == 0 {
        return Ok(());
    }
    let why = if pool.mode == PoolMode::PerCall {
        Some("needs pool.mode = \"pooled\"".to_string())
    } else if pool.warm_up > pool.max_idle_per_key.min(pool.max_idle) {
        Some(format!(
            "must not exceed pool.max_idle_per_key ({}) or pool.max_idle ({})",
            pool.max_idle_per_key, pool.max_idle
        ))
    } else if !matches!(auth.mode, ModeConfig::None) {
        Some(
            "needs auth.mode = \"none\": sessions are pooled per principal, unknown before a \
             request arrives"
                .to_string(),
        )
    } else if matches!(auth.upstream, UpstreamCredentials::Forward) {
        Some(
            "cannot be used with auth.upstream_credentials = \"forward\": sessions are pooled \
             per forwarded credential"
                .to_string(),
        )
    } else {
        None
    };
    match why {
        Some(message) => Err(ConfigError::new("pool.warm_up", message)),
        None => Ok(()),
    }
}
