//! `[subscriptions]`: keep-alives and limits of `subscriptions/listen` streams.

use std::time::Duration;

use super::check::duration;
use super::{ConfigError, raw::RawSubscriptions};
use crate::fair_share::{FairShare, Fractions};

/// `subscriptions/listen` streams.
#[derive(Debug, Clone)]
pub struct SubscriptionsConfig {
    /// Interval between `: keep-alive` comments on an idle listen stream.
    pub keepalive: Duration,
    /// Listen streams open at once on this replica.
    pub max_streams: usize,
    /// How `max_streams` is divided between callers: what one may hold
    /// (`max_streams_per_principal`, unset: `quotas.caller_share` of them) and what is kept
    /// for callers holding none (`quotas.newcomer_reserve`).
    pub stream_share: FairShare,
    /// URIs one listen request may subscribe to.
    pub max_resource_subscriptions: usize,
}

pub(super) fn subscriptions_config(
    raw: &RawSubscriptions,
    fractions: Fractions,
) -> Result<SubscriptionsConfig, ConfigError> {
    let keepalive = duration("subscriptions.keepalive", &raw.keepalive)?;
    if keepalive < Duration::from_millis(100) || keepalive > Duration::from_secs(600) {
        return Err(ConfigError::new(
            "subscriptions.keepalive",
            "must be between \"100ms\" and \"10m\"",
        ));
    }
    let bounded = |key: &str, n: u64, max: u64| {
        if n == 0 || n > max {
            Err(ConfigError::new(
                key,
                format!("must be between 1 and {max}"),
            ))
        } else {
            Ok(n as usize)
        }
    };
    let max_streams = bounded("subscriptions.max_streams", raw.max_streams, 1_000_000)?;
    let per_principal = raw
        .max_streams_per_principal
        .map(|n| bounded("subscriptions.max_streams_per_principal", n, 1_000_000))
        .transpose()?;
    Ok(SubscriptionsConfig {
        keepalive,
        max_streams,
        stream_share: FairShare::of(max_streams, per_principal, fractions),
        max_resource_subscriptions: bounded(
            "subscriptions.max_resource_subscriptions",
            raw.max_resource_subscriptions,
            10_000,
        )?,
    })
}
