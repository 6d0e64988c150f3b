//! `[parking]`: which blocked legacy calls may be kept alive on this replica while the client
//! answers, how many and for how long, and the per-call rules that override the default.

use std::time::Duration;

use super::call_rule;
use super::check::{in_range, nonzero_duration, positive_size};
use super::{ConfigError, raw::RawParking};
use crate::fair_share::{FairShare, Fractions};

/// What happens to a blocked legacy call when the gateway returns `input_required`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParkPolicy {
    /// Keep it alive on this replica; a retry elsewhere (or after expiry) replays.
    ParkThenReplay,
    /// Never park: every retry replays.
    Replay,
    /// Park, and never re-execute: if the parked call is gone, the retry fails.
    ParkOnly,
}

#[derive(Debug, Clone)]
pub struct ParkingRule {
    pub method: String,
    /// Tool or prompt name, or resource URI; `None` matches every call of `method`.
    pub name: Option<String>,
    pub policy: ParkPolicy,
}

#[derive(Debug, Clone)]
pub struct ParkingConfig {
    pub default_policy: ParkPolicy,
    pub max_calls: usize,
    /// How `max_calls` is divided between callers (`max_per_principal`, unset:
    /// `quotas.caller_share` of them; `quotas.newcomer_reserve`).
    pub call_share: FairShare,
    pub ttl: Duration,
    pub max_buffered_bytes: usize,
    /// Stdio children parking never takes: calls may park only while at least this many of
    /// `upstream.stdio_max_children` stay out of the parking lot, for fresh calls.
    pub stdio_reserved_children: usize,
    pub rules: Vec<ParkingRule>,
}

impl ParkingConfig {
    /// The policy for a call (`name` is the tool / prompt name or the resource URI).
    pub fn policy_for(&self, method: &str, name: Option<&str>) -> ParkPolicy {
        call_rule::first_match(&self.rules, method, name).map_or(self.default_policy, |r| r.policy)
    }
}

impl call_rule::CallRule for ParkingRule {
    fn method(&self) -> &str {
        &self.method
    }
    fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }
}

fn park_policy(key: &str, text: &str) -> Result<ParkPolicy, ConfigError> {
    match text {
        "park-then-replay" => Ok(ParkPolicy::ParkThenReplay),
        "replay" => Ok(ParkPolicy::Replay),
        "park-only" => Ok(ParkPolicy::ParkOnly),
        other => Err(ConfigError::new(
            key,
            format!("must be \"park-then-replay\", \"replay\" or \"park-only\", not {other:?}"),
        )),
    }
}

pub(super) fn parking_config(
    raw: &RawParking,
    state_ttl: Duration,
    stdio_max_children: usize,
    fractions: Fractions,
) -> Result<ParkingConfig, ConfigError> {
    // Unset: two minutes, or the state TTL if that is shorter.
    let ttl = if raw.ttl.is_empty() {
        state_ttl.min(Duration::from_secs(120))
    } else {
        nonzero_duration("parking.ttl", &raw.ttl)?
    };
    if ttl > state_ttl {
        return Err(ConfigError::new(
            "parking.ttl",
            "must not exceed state.ttl (a parked call cannot outlive the state that refers to it)",
        ));
    }
    let mut rules = Vec::with_capacity(raw.rules.len());
    for (i, r) in raw.rules.iter().enumerate() {
        if !matches!(
            r.method.as_str(),
            "tools/call" | "prompts/get" | "resources/read"
        ) {
            return Err(ConfigError::new(
                format!("parking.rules[{i}].method"),
                "must be tools/call, prompts/get or resources/read",
            ));
        }
        rules.push(ParkingRule {
            method: r.method.clone(),
            name: r.name.clone(),
            policy: park_policy(&format!("parking.rules[{i}].policy"), &r.policy)?,
        });
    }
    let max_calls = usize::try_from(raw.max_calls).unwrap_or(usize::MAX);
    let per_principal = raw
        .max_per_principal
        .map(|n| in_range("parking.max_per_principal", n, 1, u64::MAX))
        .transpose()?;
    Ok(ParkingConfig {
        default_policy: park_policy("parking.default_policy", &raw.default_policy)?,
        max_calls,
        call_share: FairShare::of(max_calls, per_principal, fractions),
        ttl,
        max_buffered_bytes: positive_size("parking.max_buffered_bytes", raw.max_buffered_bytes)?,
        // Unset: a quarter of the children, at least one.
        stdio_reserved_children: match raw.stdio_reserved_children {
            None => (stdio_max_children / 4).max(1).min(stdio_max_children),
            Some(n) => in_range(
                "parking.stdio_reserved_children",
                n,
                0,
                stdio_max_children as u64,
            )?,
        },
        rules,
    })
}
