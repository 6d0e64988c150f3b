//! `[discover]`: a deprecated section, still checked so that old files keep loading.

use std::time::Duration;

use super::check::nonzero_duration;
use super::{ConfigError, raw::RawDiscover};

/// `[discover]`. Deprecated: `refresh` is still validated (so an old file keeps loading, and
/// a bad value is still named) but has no effect since `server/discover` is answered from the
/// caller's own legacy session (`crate::discover`) instead of a gateway-wide cache.
#[derive(Debug, Clone)]
pub struct DiscoverConfig {
    pub refresh: Duration,
}

pub(super) fn discover_config(raw: &RawDiscover) -> Result<DiscoverConfig, ConfigError> {
    Ok(DiscoverConfig {
        refresh: nonzero_duration("discover.refresh", &raw.refresh)?,
    })
}
