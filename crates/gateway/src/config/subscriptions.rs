//! `[subscriptions]`: keep-alives and limits of `subscriptions/listen` streams.

use std::time::Duration;

use super::check::duration;
use super::{ConfigError, raw::RawSubscriptions};

/// `subscriptions/listen` streams.
#[derive(Debug, Clone)]
pub struct SubscriptionsConfig {
    /// Interval between `: keep-alive` comments on an idle listen stream.
    pub keepalive: Duration,
    /// Listen streams open at once on this replica.
    pub max_streams: usize,
    /// Listen streams one principal may hold open at once.
    pub max_streams_per_principal: usize,
    /// URIs one listen request may subscribe to.
    pub max_resource_subscriptions: usize,
}

pub(super) fn subscriptions_config(
    raw: &RawSubscriptions,
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
    Ok(SubscriptionsConfig {
        keepalive,
        max_streams: bounded("subscriptions.max_streams", raw.max_streams, 1_000_000)?,
        max_streams_per_principal: bounded(
            "subscriptions.max_streams_per_principal",
            raw.max_streams_per_principal,
            1_000_000,
        )?,
        max_resource_subscriptions: bounded(
            "subscriptions.max_resource_subscriptions",
            raw.max_resource_subscriptions,
            10_000,
        )?,
    })
}
