//! `[quotas]`: how every pool callers share is divided between them (see
//! [`crate::fair_share`]): the default share of one caller and the reserve kept for callers
//! holding nothing yet.

use super::{ConfigError, raw::RawQuotas};
use crate::fair_share::{FairShare, Fractions};

pub(super) fn quotas_config(raw: &RawQuotas) -> Result<Fractions, ConfigError> {
    let share = raw.caller_share;
    if !(share > 0.0 && share <= 1.0) {
        return Err(ConfigError::new(
            "quotas.caller_share",
            "must be a fraction above 0 and at most 1 (0.25: a quarter of each pool)",
        ));
    }
    let reserve = raw.newcomer_reserve;
    if !(0.0..=0.5).contains(&reserve) {
        return Err(ConfigError::new(
            "quotas.newcomer_reserve",
            "must be a fraction between 0 (no reserve) and 0.5",
        ));
    }
    Ok(Fractions {
        caller_share: share,
        newcomer_reserve: reserve,
    })
}

/// The per-caller quotas whose configured share never binds (one caller could take all but
/// the newcomers' reserve), as `check-config` warnings naming the key.
pub fn ineffective_quotas(cfg: &super::Config) -> Vec<String> {
    let pools: [(&str, &str, FairShare); 5] = [
        (
            "subscriptions.max_streams_per_principal",
            "subscriptions.max_streams",
            cfg.subscriptions.stream_share,
        ),
        (
            "legacy_clients.max_get_streams_per_principal",
            "legacy_clients.max_get_streams",
            cfg.legacy_clients.get_stream_share,
        ),
        (
            "parking.max_per_principal",
            "parking.max_calls",
            cfg.parking.call_share,
        ),
        (
            "single_use.max_entries_per_principal",
            "single_use.max_entries",
            cfg.single_use.entry_share,
        ),
        (
            "pool.max_idle_per_principal",
            "pool.max_idle",
            cfg.pool.idle_share,
        ),
    ];
    pools
        .into_iter()
        .filter(|(_, _, share)| share.ineffective())
        .map(|(key, pool, share)| {
            format!(
                "{key}: {} of {pool} = {} lets one caller take all of it but the {} kept for \
                 newcomers, so the quota has no effect; leave it unset (quotas.caller_share of \
                 the pool) or set it below {}",
                share.per_caller,
                share.size,
                share.reserve,
                share.size - share.reserve
            )
        })
        .collect()
}
