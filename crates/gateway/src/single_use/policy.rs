//! Which retries must claim their state: a default plus per-method / per-name exceptions.
//!
//! Claiming costs a store round trip and, with the memory store, an entry per retry. An
//! operator who knows a tool is read-only (or idempotent) can exempt it; everything else is
//! claimed. A rule naming the tool (prompt, resource URI) beats a rule for the whole method,
//! which beats the default.

/// Whether a retry claims its `requestState` id before replaying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Claim the id: at most one execution per state, duplicates get the kept outcome.
    Always,
    /// Do not claim: duplicates replay the call again (for read-only or idempotent calls).
    Never,
}

impl Policy {
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Always => "always",
            Policy::Never => "never",
        }
    }
}

/// One `[[single_use.rules]]` entry, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyRule {
    /// `tools/call`, `prompts/get` or `resources/read`.
    pub method: String,
    /// Tool name, prompt name or resource URI; `None` matches every name of the method.
    pub name: Option<String>,
    pub policy: Policy,
}

/// The default policy and its exceptions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyTable {
    default: Policy,
    rules: Vec<PolicyRule>,
}

impl PolicyTable {
    pub fn new(default: Policy, rules: Vec<PolicyRule>) -> Self {
        PolicyTable { default, rules }
    }

    /// The policy for a retry of `method` on `name` (tool name, prompt name or resource URI).
    pub fn policy_for(&self, method: &str, name: Option<&str>) -> Policy {
        let for_method = || self.rules.iter().filter(|r| r.method == method);
        if let Some(name) = name
            && let Some(rule) = for_method().find(|r| r.name.as_deref() == Some(name))
        {
            return rule.policy;
        }
        for_method()
            .find(|r| r.name.is_none())
            .map_or(self.default, |r| r.policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(method: &str, name: Option<&str>, policy: Policy) -> PolicyRule {
        PolicyRule {
            method: method.into(),
            name: name.map(Into::into),
            policy,
        }
    }

    #[test]
    fn named_rule_beats_method_rule_beats_default() {
        let table = PolicyTable::new(
            Policy::Always,
            vec![
                rule("prompts/get", None, Policy::Never),
                rule("prompts/get", Some("billing"), Policy::Always),
                rule("tools/call", Some("get_weather"), Policy::Never),
                rule("resources/read", Some("file:///etc/motd"), Policy::Never),
            ],
        );
        assert_eq!(
            table.policy_for("tools/call", Some("get_weather")),
            Policy::Never
        );
        assert_eq!(table.policy_for("tools/call", Some("pay")), Policy::Always);
        assert_eq!(table.policy_for("tools/call", None), Policy::Always);
        assert_eq!(
            table.policy_for("prompts/get", Some("greet")),
            Policy::Never
        );
        assert_eq!(
            table.policy_for("prompts/get", Some("billing")),
            Policy::Always
        );
        assert_eq!(
            table.policy_for("resources/read", Some("file:///etc/motd")),
            Policy::Never
        );
        assert_eq!(
            table.policy_for("resources/read", Some("file:///etc/passwd")),
            Policy::Always
        );
    }

    #[test]
    fn a_never_default_is_overridden_per_tool() {
        let table = PolicyTable::new(
            Policy::Never,
            vec![rule("tools/call", Some("transfer"), Policy::Always)],
        );
        assert_eq!(
            table.policy_for("tools/call", Some("transfer")),
            Policy::Always
        );
        assert_eq!(
            table.policy_for("tools/call", Some("lookup")),
            Policy::Never
        );
    }
}
