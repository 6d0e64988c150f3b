//! `[long_calls]`: when a call that is still running ends its HTTP request with a state-only
//! `input_required` round, so that no front timeout (ingress, mesh, client library) cuts it.

use std::time::Duration;

use super::check::{duration, in_range, positive_size};
use super::{ConfigError, raw::RawLongCalls};
use crate::setting::call_rule::{self, CallRule, check_rule_target};

/// One `[[long_calls.rules]]` entry: `round_after` for the calls it matches.
#[derive(Debug, Clone)]
pub struct LongCallRule {
    pub method: String,
    /// Tool or prompt name, or resource URI; `None` matches every call of `method`.
    pub name: Option<String>,
    /// Zero: never a state-only round for these calls.
    pub round_after: Duration,
}

impl CallRule for LongCallRule {
    fn method(&self) -> &str {
        &self.method
    }
    fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }
}

#[derive(Debug, Clone)]
pub struct LongCallsConfig {
    /// How long a call may go without a legacy response (or a question) before its request
    /// ends with a state-only round; zero turns state-only rounds off.
    pub round_after: Duration,
    pub rules: Vec<LongCallRule>,
    /// Detached calls this replica runs at once; past it a long call keeps its request.
    pub max_running: usize,
    /// Detached calls one caller may have running on this replica.
    pub max_running_per_principal: usize,
}

impl LongCallsConfig {
    /// `round_after` for a call, `None` when state-only rounds are off for it.
    pub fn round_after_for(&self, method: &str, name: Option<&str>) -> Option<Duration> {
        let after = call_rule::first_match(&self.rules, method, name)
            .map_or(self.round_after, |r| r.round_after);
        (!after.is_zero()).then_some(after)
    }
}

pub(super) fn long_calls_config(raw: &RawLongCalls) -> Result<LongCallsConfig, ConfigError> {
    let mut rules = Vec::with_capacity(raw.rules.len());
    for (i, r) in raw.rules.iter().enumerate() {
        let key = format!("long_calls.rules[{i}]");
        check_rule_target(&key, &r.method, r.name.as_deref())?;
        rules.push(LongCallRule {
            method: r.method.clone(),
            name: r.name.clone(),
            round_after: duration(&format!("{key}.round_after"), &r.round_after)?,
        });
    }
    let max_running = positive_size("long_calls.max_running", raw.max_running)?;
    // Unset: a quarter of the replica's, at least one.
    let max_running_per_principal = match raw.max_running_per_principal {
        None => (max_running / 4).max(1),
        Some(n) => in_range(
            "long_calls.max_running_per_principal",
            n,
            1,
            max_running as u64,
        )?,
    };
    Ok(LongCallsConfig {
        round_after: duration("long_calls.round_after", &raw.round_after)?,
        rules,
        max_running,
        max_running_per_principal,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::raw::RawLongCallRule;

    fn rule(name: Option<&str>, after: &str) -> RawLongCallRule {
        RawLongCallRule {
            method: "tools/call".into(),
            name: name.map(str::to_owned),
            round_after: after.into(),
        }
    }

    #[test]
    fn the_first_matching_rule_decides_and_zero_is_off() {
        let raw = RawLongCalls {
            round_after: "20s".into(),
            rules: vec![rule(Some("quick"), "0s"), rule(Some("build"), "5s")],
            ..Default::default()
        };
        let c = long_calls_config(&raw).unwrap();
        assert_eq!(c.round_after_for("tools/call", Some("quick")), None);
        assert_eq!(
            c.round_after_for("tools/call", Some("build")),
            Some(Duration::from_secs(5))
        );
        assert_eq!(
            c.round_after_for("prompts/get", Some("build")),
            Some(Duration::from_secs(20))
        );
        let off = long_calls_config(&RawLongCalls {
            round_after: "0s".into(),
            rules: vec![rule(Some("build"), "1s")],
            ..Default::default()
        })
        .unwrap();
        assert_eq!(off.round_after_for("tools/call", Some("x")), None);
        assert_eq!(
            off.round_after_for("tools/call", Some("build")),
            Some(Duration::from_secs(1))
        );
    }

    #[test]
    fn bad_values_name_their_key() {
        let bad = |raw: RawLongCalls| long_calls_config(&raw).unwrap_err().key;
        assert_eq!(
            bad(RawLongCalls {
                round_after: "soon".into(),
                ..Default::default()
            }),
            "long_calls.round_after"
        );
        assert_eq!(
            bad(RawLongCalls {
                rules: vec![rule(Some("x"), "later")],
                ..Default::default()
            }),
            "long_calls.rules[0].round_after"
        );
        let mut wrong = rule(None, "1s");
        wrong.method = "tools/list".into();
        assert_eq!(
            bad(RawLongCalls {
                rules: vec![wrong],
                ..Default::default()
            }),
            "long_calls.rules[0].method"
        );
        assert_eq!(
            bad(RawLongCalls {
                max_running: 4,
                max_running_per_principal: Some(5),
                ..Default::default()
            }),
            "long_calls.max_running_per_principal"
        );
        assert_eq!(
            bad(RawLongCalls {
                max_running: 0,
                ..Default::default()
            }),
            "long_calls.max_running"
        );
        let shares = long_calls_config(&RawLongCalls {
            max_running: 10,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(shares.max_running_per_principal, 2, "a quarter by default");
    }
}
