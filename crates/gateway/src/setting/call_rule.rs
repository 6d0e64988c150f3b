//! Per-call rules keyed by `method` and an optional `name`, matched first-match-wins: the
//! shape shared by `[[parking.rules]]` and `[[policy.rules]]`.
//!
//! `name` is the tool name for `tools/call`, the prompt name for `prompts/get` and the
//! resource URI for `resources/read`; a rule without one covers every call of its method.

use super::ConfigError;

/// The methods a per-call rule can name: the ones that run a legacy call able to ask the
/// client something.
pub const RULE_METHODS: &[&str] = &["tools/call", "prompts/get", "resources/read"];

/// A rule matched against a call's method and name.
pub trait CallRule {
    fn method(&self) -> &str;
    /// `None` matches every name of the method.
    fn name(&self) -> Option<&str>;
}

/// The first rule in `rules` that covers `method` on `name`.
pub fn first_match<'r, R: CallRule>(
    rules: &'r [R],
    method: &str,
    name: Option<&str>,
) -> Option<&'r R> {
    rules
        .iter()
        .find(|r| r.method() == method && (r.name().is_none() || r.name() == name))
}

/// Checks a rule's `method` (present, one of [`RULE_METHODS`]) and `name` (not empty);
/// `key` is the rule's key path, e.g. `policy.rules[2]`.
pub fn check_rule_target(key: &str, method: &str, name: Option<&str>) -> Result<(), ConfigError> {
    if method.is_empty() {
        return Err(ConfigError::new(
            format!("{key}.method"),
            format!("a rule must name its method, one of {RULE_METHODS:?}"),
        ));
    }
    if !RULE_METHODS.contains(&method) {
        return Err(ConfigError::new(
            format!("{key}.method"),
            format!("must be one of {RULE_METHODS:?}, not {method:?}"),
        ));
    }
    if name.is_some_and(str::is_empty) {
        return Err(ConfigError::new(
            format!("{key}.name"),
            "must not be empty; leave it out to match every call of the method",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Rule(&'static str, Option<&'static str>, u8);

    impl CallRule for Rule {
        fn method(&self) -> &str {
            self.0
        }
        fn name(&self) -> Option<&str> {
            self.1
        }
    }

    #[test]
    fn the_first_covering_rule_wins() {
        let rules = [
            Rule("tools/call", Some("a"), 1),
            Rule("tools/call", None, 2),
            Rule("tools/call", Some("b"), 3),
        ];
        let hit = |m, n| first_match(&rules, m, n).map(|r| r.2);
        assert_eq!(hit("tools/call", Some("a")), Some(1));
        assert_eq!(
            hit("tools/call", Some("b")),
            Some(2),
            "order, not specificity"
        );
        assert_eq!(hit("tools/call", None), Some(2));
        assert_eq!(hit("prompts/get", Some("a")), None);
    }

    #[test]
    fn targets_are_checked() {
        assert!(check_rule_target("r", "tools/call", Some("x")).is_ok());
        assert_eq!(
            check_rule_target("r", "", None).unwrap_err().key,
            "r.method"
        );
        assert_eq!(
            check_rule_target("r", "tools/list", None).unwrap_err().key,
            "r.method"
        );
        assert_eq!(
            check_rule_target("r", "tools/call", Some(""))
                .unwrap_err()
                .key,
            "r.name"
        );
    }
}
