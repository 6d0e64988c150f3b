//! The `[single_use]` section: the raw TOML shape and its validation into typed values.
//!
//! Same two-step pattern as the rest of the configuration: [`RawSingleUse`] mirrors the file
//! (every key defaulted, unknown keys refused) and [`SingleUseConfig::from_raw`] checks every
//! value, naming the offending key (`single_use.redis.urls[0]`, `single_use.rules[2].policy`, …)
//! in the [`ConfigError`]. `config/gateway.toml` documents each key with its default and limits.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use serde::Deserialize;

use super::policy::{Policy, PolicyRule, PolicyTable};
use crate::fair_share::{FairShare, Fractions};
use crate::setting::{ConfigError, parse_duration};

/// Largest accepted `max_outcome_bytes`: a kept outcome is one Redis string or one heap
/// allocation per claim, so anything beyond a few MiB is a misconfiguration.
pub const MAX_OUTCOME_BYTES_LIMIT: u64 = 64 * 1024 * 1024;
/// Bounds of `claim_lease`: long enough for two store round trips, short enough that a retry
/// after a lost claim reply does not wait long.
pub const CLAIM_LEASE_MIN: Duration = Duration::from_millis(100);
pub const CLAIM_LEASE_MAX: Duration = Duration::from_secs(60);
/// Longest accepted `key_prefix`, bytes.
pub const MAX_KEY_PREFIX_BYTES: usize = 64;
/// The methods that can carry a `requestState`, hence the only ones a rule can name.
pub const RULE_METHODS: &[&str] = &["tools/call", "prompts/get", "resources/read"];

/// `[single_use]` as written in the file.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawSingleUse {
    pub store: String,
    pub policy: String,
    pub max_entries: u64,
    pub max_entries_per_principal: Option<u64>,
    pub max_outcome_bytes: u64,
    pub max_total_outcome_bytes: u64,
    pub sweep_interval: String,
    pub claim_lease: String,
    pub redis: RawRedis,
    pub rules: Vec<RawRule>,
}

impl Default for RawSingleUse {
    fn default() -> Self {
        RawSingleUse {
            store: "memory".into(),
            policy: "always".into(),
            max_entries: 100_000,
            max_entries_per_principal: None,
            max_outcome_bytes: 65_536,
            max_total_outcome_bytes: 64 * 1024 * 1024,
            sweep_interval: "5s".into(),
            claim_lease: "2s".into(),
            redis: RawRedis::default(),
            rules: Vec::new(),
        }
    }
}

/// `[single_use.redis]` as written in the file.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawRedis {
    pub urls: Vec<String>,
    pub cluster: bool,
    pub connect_timeout: String,
    pub command_timeout: String,
    pub key_prefix: String,
    pub ca_file: Option<String>,
}

impl Default for RawRedis {
    fn default() -> Self {
        RawRedis {
            urls: vec!["redis://127.0.0.1:6379/0".into()],
            cluster: false,
            connect_timeout: "2s".into(),
            command_timeout: "500ms".into(),
            key_prefix: "mrtr:".into(),
            ca_file: None,
        }
    }
}

/// One `[[single_use.rules]]` entry.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawRule {
    pub method: String,
    #[serde(default)]
    pub name: Option<String>,
    pub policy: String,
}

/// Which backend holds the claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// A map in this process: correct for one replica only.
    Memory,
    /// Redis (one server or a cluster), shared by every replica.
    Redis,
}

/// A Redis URL whose `Debug` form hides the password, so configs can be logged.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl(String);

impl RedisUrl {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match url::Url::parse(&self.0) {
            Ok(mut u) if u.password().is_some() => {
                let _ = u.set_password(Some("***"));
                write!(f, "{:?}", u.as_str())
            }
            _ => write!(f, "{:?}", self.0),
        }
    }
}

/// PEM certificates (from `ca_file`); `Debug` shows only their size.
#[derive(Clone, PartialEq, Eq)]
pub struct CaBundle(Arc<[u8]>);

impl CaBundle {
    pub fn pem(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for CaBundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CaBundle({} bytes of PEM)", self.0.len())
    }
}

/// Validated `[single_use.redis]`.
#[derive(Debug, Clone)]
pub struct RedisConfig {
    pub urls: Vec<RedisUrl>,
    /// True when `cluster = true` or more than one URL is listed.
    pub cluster: bool,
    pub connect_timeout: Duration,
    /// Bound on every Redis call, connection wait included once connected.
    pub command_timeout: Duration,
    pub key_prefix: String,
    /// With `rediss://`: the only CAs trusted for the server certificate (instead of the
    /// system's roots).
    pub ca: Option<CaBundle>,
}

/// Validated `[single_use]`.
#[derive(Debug, Clone)]
pub struct SingleUseConfig {
    pub store: StoreKind,
    /// Memory store: most ids held at once (live claims and kept outcomes).
    pub max_entries: usize,
    /// Memory store: how `max_entries` is divided between callers: most ids one caller holds
    /// at once (`max_entries_per_principal`, unset: `quotas.caller_share` of the store) and the
    /// ids kept for callers holding none (`quotas.newcomer_reserve`); see
    /// [`crate::fair_share`].
    pub entry_share: FairShare,
    /// Largest outcome kept for duplicates; bigger ones are dropped (`DoneNotKept`).
    pub max_outcome_bytes: usize,
    /// Memory store: most bytes of kept outcomes held at once.
    pub max_total_outcome_bytes: usize,
    /// Memory store: how often expired entries are swept.
    pub sweep_interval: Duration,
    /// How long a claim whose owner has not started its call keeps others out; after it, a
    /// retry may take the claim over (the owner never started, so the call runs once).
    pub claim_lease: Duration,
    pub redis: RedisConfig,
    pub policy: PolicyTable,
}

impl Default for SingleUseConfig {
    fn default() -> Self {
        SingleUseConfig::from_raw(&RawSingleUse::default(), None, Fractions::default())
            .expect("defaults are valid")
    }
}

impl SingleUseConfig {
    /// Validates the raw section; every error names the key it is about. A relative `ca_file`
    /// resolves against `base_dir` (the configuration file's directory); `fractions`
    /// (`[quotas]`) divide the memory store between callers.
    pub fn from_raw(
        raw: &RawSingleUse,
        base_dir: Option<&Path>,
        fractions: Fractions,
    ) -> Result<SingleUseConfig, ConfigError> {
        let store = match raw.store.as_str() {
            "memory" => StoreKind::Memory,
            "redis" => StoreKind::Redis,
            other => {
                return Err(ConfigError::new(
                    "single_use.store",
                    format!("must be \"memory\" or \"redis\", not {other:?}"),
                ));
            }
        };
        let default = parse_policy("single_use.policy", &raw.policy)?;
        let max_entries = positive("single_use.max_entries", raw.max_entries)?;
        let max_entries_per_principal = raw
            .max_entries_per_principal
            .map(|n| positive("single_use.max_entries_per_principal", n))
            .transpose()?;
        // Above max_entries it acts as max_entries (check-config says it has no effect).
        let entry_share = FairShare::of(max_entries, max_entries_per_principal, fractions);
        if raw.max_outcome_bytes > MAX_OUTCOME_BYTES_LIMIT {
            return Err(ConfigError::new(
                "single_use.max_outcome_bytes",
                format!("must be at most {MAX_OUTCOME_BYTES_LIMIT}"),
            ));
        }
        let max_outcome_bytes = usize::try_from(raw.max_outcome_bytes)
            .map_err(|_| ConfigError::new("single_use.max_outcome_bytes", "too large"))?;
        let max_total_outcome_bytes = usize::try_from(raw.max_total_outcome_bytes)
            .map_err(|_| ConfigError::new("single_use.max_total_outcome_bytes", "too large"))?;
        let sweep_interval = nonzero_duration("single_use.sweep_interval", &raw.sweep_interval)?;
        let claim_lease = parse_duration(&raw.claim_lease)
            .map_err(|m| ConfigError::new("single_use.claim_lease", m))?;
        if !(CLAIM_LEASE_MIN..=CLAIM_LEASE_MAX).contains(&claim_lease) {
            return Err(ConfigError::new(
                "single_use.claim_lease",
                format!("must be between {CLAIM_LEASE_MIN:?} and {CLAIM_LEASE_MAX:?}"),
            ));
        }
        let redis = redis_from_raw(&raw.redis, base_dir)?;
        let rules = rules_from_raw(&raw.rules)?;
        Ok(SingleUseConfig {
            store,
            max_entries,
            entry_share,
            max_outcome_bytes,
            max_total_outcome_bytes,
            sweep_interval,
            claim_lease,
            redis,
            policy: PolicyTable::new(default, rules),
        })
    }

    /// Whether a retry of `method` (on tool/prompt `name`, or resource URI) must claim its state.
    pub fn policy_for(&self, method: &str, name: Option<&str>) -> Policy {
        self.policy.policy_for(method, name)
    }
}

fn redis_from_raw(raw: &RawRedis, base_dir: Option<&Path>) -> Result<RedisConfig, ConfigError> {
    if raw.urls.is_empty() {
        return Err(ConfigError::new(
            "single_use.redis.urls",
            "at least one URL is required",
        ));
    }
    let cluster = raw.cluster || raw.urls.len() > 1;
    let mut tls = None;
    let mut urls = Vec::with_capacity(raw.urls.len());
    for (i, text) in raw.urls.iter().enumerate() {
        let key = format!("single_use.redis.urls[{i}]");
        let parsed = url::Url::parse(text)
            .map_err(|e| ConfigError::new(key.clone(), format!("not a URL: {e}")))?;
        let is_tls = match parsed.scheme() {
            "redis" => false,
            "rediss" => true,
            other => {
                return Err(ConfigError::new(
                    key,
                    format!("scheme must be redis or rediss, not {other:?}"),
                ));
            }
        };
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(ConfigError::new(key, "has no host"));
        }
        if *tls.get_or_insert(is_tls) != is_tls {
            return Err(ConfigError::new(
                key,
                "mixes redis:// and rediss://; use one scheme for every URL",
            ));
        }
        let info = redis::IntoConnectionInfo::into_connection_info(text.as_str())
            .map_err(|e| ConfigError::new(key.clone(), format!("not a Redis URL: {e}")))?;
        if cluster && info.redis_settings().db() != 0 {
            return Err(ConfigError::new(
                key,
                "Redis Cluster has only database 0; remove the /N path",
            ));
        }
        urls.push(RedisUrl(text.clone()));
    }
    if cluster {
        redis::cluster::ClusterClientBuilder::new(urls.iter().map(RedisUrl::as_str))
            .build()
            .map_err(|e| ConfigError::new("single_use.redis.urls", e.to_string()))?;
    }
    let connect_timeout =
        nonzero_duration("single_use.redis.connect_timeout", &raw.connect_timeout)?;
    let command_timeout =
        nonzero_duration("single_use.redis.command_timeout", &raw.command_timeout)?;
    if raw.key_prefix.len() > MAX_KEY_PREFIX_BYTES {
        return Err(ConfigError::new(
            "single_use.redis.key_prefix",
            format!("must be at most {MAX_KEY_PREFIX_BYTES} bytes"),
        ));
    }
    if raw.key_prefix.contains(['{', '}']) {
        return Err(ConfigError::new(
            "single_use.redis.key_prefix",
            "must not contain { or }: the gateway puts the claim id in a {hash tag}",
        ));
    }
    let ca = match &raw.ca_file {
        None => None,
        Some(_) if tls != Some(true) => {
            return Err(ConfigError::new(
                "single_use.redis.ca_file",
                "only applies to rediss:// URLs",
            ));
        }
        Some(file) => Some(load_ca(file, base_dir)?),
    };
    Ok(RedisConfig {
        urls,
        cluster,
        connect_timeout,
        command_timeout,
        key_prefix: raw.key_prefix.clone(),
        ca,
    })
}

fn load_ca(file: &str, base_dir: Option<&Path>) -> Result<CaBundle, ConfigError> {
    const KEY: &str = "single_use.redis.ca_file";
    let path = match base_dir {
        Some(dir) if Path::new(file).is_relative() => dir.join(file),
        _ => Path::new(file).to_path_buf(),
    };
    let pem = std::fs::read(&path)
        .map_err(|e| ConfigError::new(KEY, format!("cannot read {}: {e}", path.display())))?;
    let mut certs = 0;
    for cert in CertificateDer::pem_slice_iter(&pem) {
        cert.map_err(|e| {
            ConfigError::new(KEY, format!("{} is not valid PEM: {e}", path.display()))
        })?;
        certs += 1;
    }
    if certs == 0 {
        return Err(ConfigError::new(
            KEY,
            format!("{} holds no PEM certificate", path.display()),
        ));
    }
    Ok(CaBundle(pem.into()))
}

fn rules_from_raw(raw: &[RawRule]) -> Result<Vec<PolicyRule>, ConfigError> {
    let mut rules: Vec<PolicyRule> = Vec::with_capacity(raw.len());
    for (i, r) in raw.iter().enumerate() {
        let key = format!("single_use.rules[{i}]");
        if !RULE_METHODS.contains(&r.method.as_str()) {
            return Err(ConfigError::new(
                format!("{key}.method"),
                format!(
                    "must be one of {RULE_METHODS:?} (the methods that carry requestState), not {:?}",
                    r.method
                ),
            ));
        }
        if r.name.as_deref().is_some_and(str::is_empty) {
            return Err(ConfigError::new(
                format!("{key}.name"),
                "must not be empty; leave it out to match every name of the method",
            ));
        }
        let policy = parse_policy(&format!("{key}.policy"), &r.policy)?;
        if rules
            .iter()
            .any(|seen| seen.method == r.method && seen.name == r.name)
        {
            return Err(ConfigError::new(
                key,
                format!(
                    "duplicate rule for method {:?}{}",
                    r.method,
                    r.name
                        .as_deref()
                        .map(|n| format!(" and name {n:?}"))
                        .unwrap_or_default()
                ),
            ));
        }
        rules.push(PolicyRule {
            method: r.method.clone(),
            name: r.name.clone(),
            policy,
        });
    }
    Ok(rules)
}

fn parse_policy(key: &str, text: &str) -> Result<Policy, ConfigError> {
    match text {
        "always" => Ok(Policy::Always),
        "never" => Ok(Policy::Never),
        other => Err(ConfigError::new(
            key,
            format!("must be \"always\" or \"never\", not {other:?}"),
        )),
    }
}

fn positive(key: &str, n: u64) -> Result<usize, ConfigError> {
    if n == 0 {
        return Err(ConfigError::new(key, "must be greater than zero"));
    }
    usize::try_from(n).map_err(|_| ConfigError::new(key, "too large"))
}

fn nonzero_duration(key: &str, text: &str) -> Result<Duration, ConfigError> {
    let d = parse_duration(text).map_err(|m| ConfigError::new(key, m))?;
    if d.is_zero() {
        return Err(ConfigError::new(key, "must be greater than zero"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<SingleUseConfig, ConfigError> {
        let raw: RawSingleUse = serde_path_to_error::deserialize(toml::Value::Table(
            text.parse::<toml::Table>().expect("test TOML parses"),
        ))
        .map_err(|e| ConfigError::new(e.path().to_string(), e.inner().to_string()))?;
        SingleUseConfig::from_raw(&raw, None, Fractions::default())
    }

    fn err_key(text: &str) -> String {
        parse(text).expect_err(text).key
    }

    #[test]
    fn defaults_match_the_documented_values() {
        let c = SingleUseConfig::default();
        assert_eq!(c.store, StoreKind::Memory);
        assert_eq!(c.max_entries, 100_000);
        // A quarter of the store per caller, an eighth kept for newcomers.
        assert_eq!(
            (c.entry_share.per_caller, c.entry_share.reserve),
            (25_000, 12_500)
        );
        assert_eq!(c.claim_lease, Duration::from_secs(2));
        assert_eq!(c.max_outcome_bytes, 65_536);
        assert_eq!(c.max_total_outcome_bytes, 64 * 1024 * 1024);
        assert_eq!(c.sweep_interval, Duration::from_secs(5));
        assert!(!c.redis.cluster);
        assert_eq!(c.redis.urls[0].as_str(), "redis://127.0.0.1:6379/0");
        assert_eq!(c.redis.connect_timeout, Duration::from_secs(2));
        assert_eq!(c.redis.command_timeout, Duration::from_millis(500));
        assert_eq!(c.redis.key_prefix, "mrtr:");
        assert_eq!(c.policy_for("tools/call", Some("x")), Policy::Always);
    }

    #[test]
    fn each_bad_value_names_its_key() {
        assert_eq!(err_key("store = \"disk\""), "single_use.store");
        assert_eq!(err_key("policy = \"sometimes\""), "single_use.policy");
        assert_eq!(err_key("max_entries = 0"), "single_use.max_entries");
        assert_eq!(
            err_key("max_entries_per_principal = 0"),
            "single_use.max_entries_per_principal"
        );
        assert_eq!(err_key("claim_lease = \"50ms\""), "single_use.claim_lease");
        assert_eq!(err_key("claim_lease = \"2m\""), "single_use.claim_lease");
        assert_eq!(err_key("claim_lease = \"soon\""), "single_use.claim_lease");
        assert_eq!(
            err_key("max_outcome_bytes = 100000000"),
            "single_use.max_outcome_bytes"
        );
        assert_eq!(
            err_key("sweep_interval = \"0s\""),
            "single_use.sweep_interval"
        );
        assert_eq!(
            err_key("sweep_interval = \"5\""),
            "single_use.sweep_interval"
        );
        assert_eq!(err_key("[redis]\nurls = []"), "single_use.redis.urls");
        assert_eq!(
            err_key("[redis]\nurls = [\"redis://a:6379\", \"http://b:6379\"]"),
            "single_use.redis.urls[1]"
        );
        assert_eq!(
            err_key("[redis]\nurls = [\"not a url\"]"),
            "single_use.redis.urls[0]"
        );
        assert_eq!(
            err_key("[redis]\nurls = [\"redis://a:6379\", \"rediss://b:6379\"]"),
            "single_use.redis.urls[1]"
        );
        assert_eq!(
            err_key("[redis]\ncluster = true\nurls = [\"redis://a:6379/3\"]"),
            "single_use.redis.urls[0]"
        );
        assert_eq!(
            err_key("[redis]\ncommand_timeout = \"0ms\""),
            "single_use.redis.command_timeout"
        );
        assert_eq!(
            err_key("[redis]\nconnect_timeout = \"later\""),
            "single_use.redis.connect_timeout"
        );
        assert_eq!(
            err_key("[redis]\nkey_prefix = \"a{b}\""),
            "single_use.redis.key_prefix"
        );
        assert_eq!(
            err_key("[redis]\nca_file = \"/nonexistent/ca.pem\"\nurls = [\"rediss://a:6380\"]"),
            "single_use.redis.ca_file"
        );
        assert_eq!(
            err_key("[redis]\nca_file = \"Cargo.toml\"\nurls = [\"redis://a:6379\"]"),
            "single_use.redis.ca_file"
        );
        let e =
            parse("[redis]\nca_file = \"Cargo.toml\"\nurls = [\"rediss://a:6380\"]").unwrap_err();
        assert_eq!(e.key, "single_use.redis.ca_file");
        assert!(e.message.contains("no PEM certificate"), "{e}");
        assert_eq!(
            err_key("[[rules]]\nmethod = \"tools/list\"\npolicy = \"never\""),
            "single_use.rules[0].method"
        );
        assert_eq!(
            err_key("[[rules]]\nmethod = \"tools/call\"\nname = \"\"\npolicy = \"never\""),
            "single_use.rules[0].name"
        );
        assert_eq!(
            err_key(
                "[[rules]]\nmethod = \"tools/call\"\npolicy = \"never\"\n\
                 [[rules]]\nmethod = \"prompts/get\"\npolicy = \"maybe\""
            ),
            "single_use.rules[1].policy"
        );
        let dup = parse(
            "[[rules]]\nmethod = \"tools/call\"\nname = \"a\"\npolicy = \"never\"\n\
             [[rules]]\nmethod = \"tools/call\"\nname = \"a\"\npolicy = \"always\"",
        )
        .unwrap_err();
        assert_eq!(dup.key, "single_use.rules[1]");
        assert!(dup.message.contains("duplicate"), "{dup}");
    }

    #[test]
    fn the_per_caller_share_is_a_fraction_of_the_store_unless_configured() {
        // Unset, a small store still leaves room for others: a quarter of it per caller.
        let c = parse("max_entries = 20").unwrap();
        assert_eq!(c.entry_share.per_caller, 5);
        assert!(!c.entry_share.ineffective());
        let c = parse("max_entries = 10\nmax_entries_per_principal = 3").unwrap();
        assert_eq!(c.entry_share.per_caller, 3);
        // Above the store it acts as the store, and is reported as having no effect.
        let c = parse("max_entries = 20\nmax_entries_per_principal = 10000").unwrap();
        assert_eq!(c.entry_share.per_caller, 20);
        assert!(c.entry_share.ineffective());
    }

    #[test]
    fn several_urls_mean_a_cluster() {
        let c = parse("[redis]\nurls = [\"redis://10.0.0.1:7000\", \"redis://10.0.0.2:7000\"]")
            .unwrap();
        assert!(c.redis.cluster);
        let c = parse("[redis]\nurls = [\"rediss://cache.example:6380/2\"]").unwrap();
        assert!(!c.redis.cluster);
    }

    #[test]
    fn the_shipped_config_file_spells_out_the_defaults() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/gateway.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        let table: toml::Table = text.parse().unwrap();
        let section = table["single_use"].as_table().unwrap();
        for key in [
            "store",
            "policy",
            "max_entries",
            "max_outcome_bytes",
            "max_total_outcome_bytes",
            "sweep_interval",
            "claim_lease",
        ] {
            assert!(section.contains_key(key), "{key} is not documented");
        }
        // Unset by default (a fraction of the store): documented as a comment.
        assert!(text.contains("# max_entries_per_principal ="));
        let redis = section["redis"].as_table().unwrap();
        for key in [
            "urls",
            "cluster",
            "connect_timeout",
            "command_timeout",
            "key_prefix",
        ] {
            assert!(redis.contains_key(key), "redis.{key} is not documented");
        }
        let loaded = crate::config::Config::from_toml_str(&text, &[], None).unwrap();
        let defaults = SingleUseConfig::default();
        let file = loaded.single_use;
        assert_eq!(file.store, defaults.store);
        assert_eq!(file.max_entries, defaults.max_entries);
        assert_eq!(file.entry_share, defaults.entry_share);
        assert_eq!(file.claim_lease, defaults.claim_lease);
        assert_eq!(file.max_outcome_bytes, defaults.max_outcome_bytes);
        assert_eq!(
            file.max_total_outcome_bytes,
            defaults.max_total_outcome_bytes
        );
        assert_eq!(file.sweep_interval, defaults.sweep_interval);
        assert_eq!(file.redis.urls, defaults.redis.urls);
        assert_eq!(file.redis.cluster, defaults.redis.cluster);
        assert_eq!(file.redis.connect_timeout, defaults.redis.connect_timeout);
        assert_eq!(file.redis.command_timeout, defaults.redis.command_timeout);
        assert_eq!(file.redis.key_prefix, defaults.redis.key_prefix);
        assert_eq!(file.policy, defaults.policy);
    }

    #[test]
    fn the_gateway_config_reads_the_section_and_its_environment_overrides() {
        let keys = "[[state.keys]]\nid = \"k1\"\nsecret = \"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\"\n";
        let text = format!(
            "{keys}[single_use]\nstore = \"redis\"\n[[single_use.rules]]\n\
             method = \"tools/call\"\nname = \"get_weather\"\npolicy = \"never\"\n"
        );
        let vars = vec![(
            "MRTR_GATEWAY__SINGLE_USE__REDIS__URLS".to_string(),
            r#"["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"]"#.to_string(),
        )];
        let c = crate::config::Config::from_toml_str(&text, &vars, None).unwrap();
        assert_eq!(c.single_use.store, StoreKind::Redis);
        assert!(c.single_use.redis.cluster);
        assert_eq!(
            c.single_use.policy_for("tools/call", Some("get_weather")),
            Policy::Never
        );
        assert_eq!(
            c.single_use.policy_for("tools/call", Some("send_mail")),
            Policy::Always
        );
        let bad = vec![(
            "MRTR_GATEWAY__SINGLE_USE__SWEEP_INTERVAL".to_string(),
            "often".to_string(),
        )];
        let e = crate::config::Config::from_toml_str(keys, &bad, None).unwrap_err();
        assert_eq!(e.key, "single_use.sweep_interval");
        assert_eq!(
            e.env_var.as_deref(),
            Some("MRTR_GATEWAY__SINGLE_USE__SWEEP_INTERVAL")
        );
        let e = crate::config::Config::from_toml_str(
            &format!("{keys}[single_use]\nbogus = 1\n"),
            &[],
            None,
        )
        .unwrap_err();
        assert!(e.key.starts_with("single_use"), "{e}");
        assert!(e.message.contains("bogus"), "{e}");
    }

    #[test]
    fn debug_output_hides_redis_passwords() {
        let c = parse("[redis]\nurls = [\"redis://user:hunter2@cache.example:6379/0\"]").unwrap();
        let shown = format!("{c:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("cache.example"), "{shown}");
    }
}
