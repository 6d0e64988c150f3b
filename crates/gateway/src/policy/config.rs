//! The `[policy]` section: the raw TOML shape and its validation into typed values.
//!
//! [`RawPolicy`] mirrors the file (every key defaulted, unknown keys refused);
//! [`PolicyConfig::from_raw`] checks every value and names the offending key
//! (`policy.url.allow_hosts[1]`, `policy.rules[0].allow[2]`, …). `config/gateway.toml`
//! documents each key with its default and bounds.

use serde::Deserialize;

use super::host_pattern::HostPattern;
use super::url::UrlPolicy;
use crate::setting::ConfigError;
use crate::setting::call_rule::{self, CallRule};
use crate::state::InputKind;

/// Bounds of `policy.url.max_length`, bytes.
pub const MAX_LENGTH_BOUNDS: (u64, u64) = (16, 65_536);
/// Largest `policy.sampling.max_tokens` (0 means no cap).
pub const MAX_TOKENS_LIMIT: u64 = 10_000_000;

/// `[policy]` as written in the file.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawPolicy {
    pub url: RawUrlPolicy,
    pub sampling: RawSamplingPolicy,
    pub rules: Vec<RawPolicyRule>,
}

/// `[policy.url]` as written in the file.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawUrlPolicy {
    pub allow_hosts: Vec<String>,
    pub deny_hosts: Vec<String>,
    pub allow_http: bool,
    pub max_length: u64,
    pub review_text: bool,
}

impl Default for RawUrlPolicy {
    fn default() -> Self {
        RawUrlPolicy {
            allow_hosts: Vec::new(),
            deny_hosts: Vec::new(),
            allow_http: false,
            max_length: 2048,
            review_text: true,
        }
    }
}

/// `[policy.sampling]` as written in the file.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawSamplingPolicy {
    pub max_tokens: u64,
}

/// One `[[policy.rules]]` entry as written. `method` and `allow` are checked (not left to
/// serde) so that a missing one is reported under its own key.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawPolicyRule {
    pub method: String,
    pub name: Option<String>,
    pub allow: Option<Vec<String>>,
}

/// The kinds of question a rule can allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Allowed {
    pub elicitation: bool,
    pub sampling: bool,
    pub roots: bool,
}

impl Allowed {
    pub const ALL: Allowed = Allowed {
        elicitation: true,
        sampling: true,
        roots: true,
    };

    /// Whether a question of `kind` is allowed (both elicitation modes are "elicitation").
    pub fn allows(self, kind: InputKind) -> bool {
        match kind {
            InputKind::ElicitForm | InputKind::ElicitUrl => self.elicitation,
            InputKind::Sampling => self.sampling,
            InputKind::Roots => self.roots,
        }
    }
}

/// One `[[policy.rules]]` entry, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyRule {
    pub method: String,
    pub name: Option<String>,
    pub allow: Allowed,
}

impl CallRule for PolicyRule {
    fn method(&self) -> &str {
        &self.method
    }
    fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }
}

/// The validated `[policy]` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyConfig {
    pub url: UrlPolicy,
    /// Cap on a sampling request's `maxTokens`; `None`: no cap.
    pub max_tokens: Option<u64>,
    pub rules: Vec<PolicyRule>,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig::from_raw(&RawPolicy::default()).expect("defaults are valid")
    }
}

impl PolicyConfig {
    /// Validates the raw section; every error names the key it is about.
    pub fn from_raw(raw: &RawPolicy) -> Result<PolicyConfig, ConfigError> {
        let (lo, hi) = MAX_LENGTH_BOUNDS;
        if !(lo..=hi).contains(&raw.url.max_length) {
            return Err(ConfigError::new(
                "policy.url.max_length",
                format!("must be between {lo} and {hi} bytes"),
            ));
        }
        if raw.sampling.max_tokens > MAX_TOKENS_LIMIT {
            return Err(ConfigError::new(
                "policy.sampling.max_tokens",
                format!("must be between 0 (no cap) and {MAX_TOKENS_LIMIT}"),
            ));
        }
        let mut rules = Vec::with_capacity(raw.rules.len());
        for (i, r) in raw.rules.iter().enumerate() {
            let key = format!("policy.rules[{i}]");
            call_rule::check_rule_target(&key, &r.method, r.name.as_deref())?;
            let Some(kinds) = &r.allow else {
                return Err(ConfigError::new(
                    format!("{key}.allow"),
                    "required: the kinds this call may ask, from \"elicitation\", \"sampling\", \
                     \"roots\" ([] allows none)",
                ));
            };
            rules.push(PolicyRule {
                method: r.method.clone(),
                name: r.name.clone(),
                allow: allowed(&format!("{key}.allow"), kinds)?,
            });
        }
        Ok(PolicyConfig {
            url: UrlPolicy {
                allow_hosts: patterns("policy.url.allow_hosts", &raw.url.allow_hosts)?,
                deny_hosts: patterns("policy.url.deny_hosts", &raw.url.deny_hosts)?,
                allow_http: raw.url.allow_http,
                max_length: raw.url.max_length as usize,
                review_text: raw.url.review_text,
            },
            max_tokens: (raw.sampling.max_tokens > 0).then_some(raw.sampling.max_tokens),
            rules,
        })
    }

    /// The kinds a call of `method` on `name` may ask: the first matching rule's, or all.
    pub fn allowed_for(&self, method: &str, name: Option<&str>) -> Allowed {
        call_rule::first_match(&self.rules, method, name).map_or(Allowed::ALL, |r| r.allow)
    }

    /// The kinds a question may be when the call that asked it is unknown (a passed-through
    /// legacy client's standalone GET stream, or a request that is not a call): only the
    /// kinds every rule allows, so no call can ask there what its own rule forbids.
    pub fn allowed_for_any_call(&self) -> Allowed {
        self.rules.iter().fold(Allowed::ALL, |a, r| Allowed {
            elicitation: a.elicitation && r.allow.elicitation,
            sampling: a.sampling && r.allow.sampling,
            roots: a.roots && r.allow.roots,
        })
    }
}

fn patterns(key: &str, raw: &[String]) -> Result<Vec<HostPattern>, ConfigError> {
    raw.iter()
        .enumerate()
        .map(|(i, p)| {
            HostPattern::parse(p)
                .map_err(|m| ConfigError::new(format!("{key}[{i}]"), format!("{p:?}: {m}")))
        })
        .collect()
}

fn allowed(key: &str, kinds: &[String]) -> Result<Allowed, ConfigError> {
    let mut a = Allowed::default();
    for (i, k) in kinds.iter().enumerate() {
        match k.as_str() {
            "elicitation" => a.elicitation = true,
            "sampling" => a.sampling = true,
            "roots" => a.roots = true,
            other => {
                return Err(ConfigError::new(
                    format!("{key}[{i}]"),
                    format!(
                        "unknown kind {other:?}; use \"elicitation\", \"sampling\" or \"roots\""
                    ),
                ));
            }
        }
    }
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEYS: &str =
        "[[state.keys]]\nid = \"k1\"\nsecret = \"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\"\n";

    fn load(extra: &str, vars: &[(&str, &str)]) -> Result<crate::config::Config, ConfigError> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        crate::config::Config::from_toml_str(&format!("{KEYS}{extra}"), &vars, None)
    }

    fn err(extra: &str) -> ConfigError {
        load(extra, &[]).expect_err(extra)
    }

    #[test]
    fn defaults_are_safe_and_match_the_documented_values() {
        let c = PolicyConfig::default();
        assert!(c.url.allow_hosts.is_empty() && c.url.deny_hosts.is_empty());
        assert!(!c.url.allow_http);
        assert_eq!(c.url.max_length, 2048);
        assert_eq!(c.max_tokens, None);
        assert_eq!(c.allowed_for("tools/call", Some("anything")), Allowed::ALL);
        assert_eq!(load("", &[]).unwrap().policy, c);
    }

    #[test]
    fn the_issue_example_reads_as_written() {
        let c = load(
            "[policy.url]\nallow_hosts = [\"auth.example.com\"]\ndeny_hosts = []\n\
             allow_http = false\nmax_length = 2048\n\
             [policy.sampling]\nmax_tokens = 1024\n\
             [[policy.rules]]\nmethod = \"tools/call\"\nname = \"where\"\nallow = [\"elicitation\"]\n",
            &[],
        )
        .unwrap()
        .policy;
        assert_eq!(
            c.url.allow_hosts,
            vec![HostPattern::Exact("auth.example.com".into())]
        );
        assert_eq!(c.max_tokens, Some(1024));
        let w = c.allowed_for("tools/call", Some("where"));
        assert!(w.allows(InputKind::ElicitForm) && w.allows(InputKind::ElicitUrl));
        assert!(!w.allows(InputKind::Sampling) && !w.allows(InputKind::Roots));
        assert_eq!(c.allowed_for("tools/call", Some("other")), Allowed::ALL);
        assert_eq!(c.allowed_for("prompts/get", Some("where")), Allowed::ALL);
    }

    #[test]
    fn first_matching_rule_wins_and_a_rule_may_cover_a_method() {
        let c = load(
            "[[policy.rules]]\nmethod = \"tools/call\"\nname = \"geo\"\nallow = [\"roots\", \"sampling\"]\n\
             [[policy.rules]]\nmethod = \"tools/call\"\nallow = [\"elicitation\"]\n\
             [[policy.rules]]\nmethod = \"resources/read\"\nallow = []\n",
            &[],
        )
        .unwrap()
        .policy;
        let geo = c.allowed_for("tools/call", Some("geo"));
        assert!(geo.roots && geo.sampling && !geo.elicitation);
        let other = c.allowed_for("tools/call", Some("x"));
        assert!(other.elicitation && !other.roots && !other.sampling);
        assert_eq!(
            c.allowed_for("resources/read", Some("file:///a")),
            Allowed::default()
        );
    }

    #[test]
    fn each_bad_value_names_its_key_and_variable() {
        let cases = [
            (
                "[policy.url]\nallow_hosts = [\"ok.example\", \"https://x\"]",
                "policy.url.allow_hosts[1]",
            ),
            (
                "[policy.url]\ndeny_hosts = [\"*\"]",
                "policy.url.deny_hosts[0]",
            ),
            (
                "[policy.url]\ndeny_hosts = [\"a.*.b\"]",
                "policy.url.deny_hosts[0]",
            ),
            ("[policy.url]\nmax_length = 0", "policy.url.max_length"),
            ("[policy.url]\nmax_length = 100000", "policy.url.max_length"),
            (
                "[policy.sampling]\nmax_tokens = 99999999999",
                "policy.sampling.max_tokens",
            ),
            (
                "[[policy.rules]]\nallow = [\"roots\"]",
                "policy.rules[0].method",
            ),
            (
                "[[policy.rules]]\nmethod = \"tools/list\"\nallow = []",
                "policy.rules[0].method",
            ),
            (
                "[[policy.rules]]\nmethod = \"tools/call\"\nname = \"\"\nallow = []",
                "policy.rules[0].name",
            ),
            (
                "[[policy.rules]]\nmethod = \"tools/call\"",
                "policy.rules[0].allow",
            ),
            (
                "[[policy.rules]]\nmethod = \"tools/call\"\nallow = []\n\
                 [[policy.rules]]\nmethod = \"tools/call\"\nallow = [\"elicitation\", \"email\"]",
                "policy.rules[1].allow[1]",
            ),
        ];
        for (text, key) in cases {
            let e = err(text);
            assert_eq!(e.key, key, "{text}: {e}");
        }
        let e = err("[policy.url]\nbogus = 1");
        assert!(
            e.key.starts_with("policy.url") && e.message.contains("bogus"),
            "{e}"
        );

        let e = load(
            "",
            &[(
                "MRTR_GATEWAY__POLICY__URL__ALLOW_HOSTS",
                "[\"a.example\", \"*.\"]",
            )],
        )
        .unwrap_err();
        assert_eq!(e.key, "policy.url.allow_hosts[1]");
        assert_eq!(
            e.env_var.as_deref(),
            Some("MRTR_GATEWAY__POLICY__URL__ALLOW_HOSTS")
        );
        let e = load("", &[("MRTR_GATEWAY__POLICY__SAMPLING__MAX_TOKENS", "-1")]).unwrap_err();
        assert_eq!(
            e.env_var.as_deref(),
            Some("MRTR_GATEWAY__POLICY__SAMPLING__MAX_TOKENS"),
            "{e}"
        );
    }

    #[test]
    fn environment_overrides_apply() {
        let c = load(
            "",
            &[
                (
                    "MRTR_GATEWAY__POLICY__URL__ALLOW_HOSTS",
                    "[\"auth.example.com\"]",
                ),
                ("MRTR_GATEWAY__POLICY__URL__ALLOW_HTTP", "true"),
                ("MRTR_GATEWAY__POLICY__SAMPLING__MAX_TOKENS", "512"),
            ],
        )
        .unwrap()
        .policy;
        assert_eq!(c.url.allow_hosts.len(), 1);
        assert!(c.url.allow_http);
        assert_eq!(c.max_tokens, Some(512));
    }

    #[test]
    fn the_shipped_config_file_spells_out_the_defaults() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/gateway.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        let table: toml::Table = text.parse().unwrap();
        let section = table["policy"].as_table().expect("[policy] is documented");
        let url = section["url"].as_table().unwrap();
        for key in ["allow_hosts", "deny_hosts", "allow_http", "max_length"] {
            assert!(url.contains_key(key), "policy.url.{key} is not documented");
        }
        assert!(
            section["sampling"]
                .as_table()
                .unwrap()
                .contains_key("max_tokens")
        );
        let loaded = crate::config::Config::from_toml_str(&text, &[], None).unwrap();
        assert_eq!(loaded.policy, PolicyConfig::default());
    }
}
