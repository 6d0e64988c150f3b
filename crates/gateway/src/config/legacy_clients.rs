//! `[legacy_clients]`: whether the dual-era front passes legacy clients through, and limits on
//! what they may hold open.

use super::check::in_range;
use super::{ConfigError, raw::RawLegacyClients};

#[derive(Debug, Clone)]
pub struct LegacyClientsConfig {
    /// Whether legacy clients are passed through at all; off, a legacy `initialize` is
    /// answered as a 2026-07-28-only server answers it.
    pub enabled: bool,
    /// Passed-through standalone GET streams open at once on this replica.
    pub max_get_streams: usize,
    /// Of those, how many one principal may hold.
    pub max_get_streams_per_principal: usize,
}

pub(super) fn legacy_clients_config(
    raw: &RawLegacyClients,
) -> Result<LegacyClientsConfig, ConfigError> {
    let max_get_streams = in_range(
        "legacy_clients.max_get_streams",
        raw.max_get_streams,
        1,
        1_000_000,
    )?;
    Ok(LegacyClientsConfig {
        enabled: raw.enabled,
        max_get_streams,
        max_get_streams_per_principal: in_range(
            "legacy_clients.max_get_streams_per_principal",
            raw.max_get_streams_per_principal,
            1,
            1_000_000,
        )?,
    })
}
