//! `[legacy_clients]`: whether the dual-era front passes legacy clients through, and limits on
//! what they may hold open.

use super::check::in_range;
use super::{ConfigError, raw::RawLegacyClients};
use crate::fair_share::{FairShare, Fractions};

#[derive(Debug, Clone)]
pub struct LegacyClientsConfig {
    /// Whether legacy clients are passed through at all; off, a legacy `initialize` is
    /// answered as a 2026-07-28-only server answers it.
    pub enabled: bool,
    /// Passed-through standalone GET streams open at once on this replica.
    pub max_get_streams: usize,
    /// How `max_get_streams` is divided between callers (`max_get_streams_per_principal`,
    /// unset: `quotas.caller_share` of them; `quotas.newcomer_reserve`).
    pub get_stream_share: FairShare,
}

pub(super) fn legacy_clients_config(
    raw: &RawLegacyClients,
    fractions: Fractions,
) -> Result<LegacyClientsConfig, ConfigError> {
    let max_get_streams = in_range(
        "legacy_clients.max_get_streams",
        raw.max_get_streams,
        1,
        1_000_000,
    )?;
    let per_principal = raw
        .max_get_streams_per_principal
        .map(|n| {
            in_range(
                "legacy_clients.max_get_streams_per_principal",
                n,
                1,
                1_000_000,
            )
        })
        .transpose()?;
    Ok(LegacyClientsConfig {
        enabled: raw.enabled,
        max_get_streams,
        get_stream_share: FairShare::of(max_get_streams, per_principal, fractions),
    })
}
