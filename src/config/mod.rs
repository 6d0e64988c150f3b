//! Gateway configuration: TOML file, environment overrides, validation into typed values.
//!
//! Loading runs in three steps, each with one job:
//! 1. parse the file into a TOML tree and apply `MRTR_GATEWAY__SECTION__KEY` environment
//!    overrides onto that tree ([`env`]);
//! 2. deserialize the tree into [`raw::RawConfig`] (unknown keys are errors, and the error
//!    names the key path);
//! 3. validate into [`Config`]: parse addresses, durations and URLs, load key material.
//!
//! Every error is a [`ConfigError`] naming the file key (and the variable, when the value came
//! from the environment); the binary turns it into exit status 64.

mod duration;
pub mod env;
pub mod raw;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;

pub use duration::parse_duration;
use raw::RawConfig;

/// The secret printed in `config/gateway.toml`; public, so never fit for production.
pub const EXAMPLE_SECRET: &str = "AEarFVUsENTN8apT0+NBD/WiFLYe0+IDHCIEZpsSwGs=";

/// Protocol versions the gateway can speak to a legacy server, newest first.
pub const LEGACY_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26"];

/// A configuration problem, tied to the key it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Dotted key path, e.g. `state.ttl`, or `(file)` for problems with the file itself.
    pub key: String,
    /// The environment variable the value came from, when it did.
    pub env_var: Option<String>,
    pub message: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.env_var {
            Some(var) => write!(f, "{} (set by {var}): {}", self.key, self.message),
            None => write!(f, "{}: {}", self.key, self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

impl ConfigError {
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            key: key.into(),
            env_var: None,
            message: message.into(),
        }
    }
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: ListenConfig,
    pub upstream: UpstreamConfig,
    pub state: StateConfig,
    pub mrtr: MrtrConfig,
    pub discover: DiscoverConfig,
    pub caching: CachingConfig,
    pub log: LogConfig,
    pub auth: crate::auth::config::AuthConfig,
}

#[derive(Debug, Clone)]
pub struct ListenConfig {
    pub addr: SocketAddr,
    pub path: String,
    pub max_body_bytes: usize,
}

#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    pub url: url::Url,
    pub protocol_version: String,
    pub connect_timeout: Duration,
    /// Longest wait for the legacy server's response headers (and for an `initialize` answer).
    pub response_timeout: Duration,
    /// Longest silence on a legacy SSE stream while a call is running.
    pub idle_timeout: Duration,
    /// Longest a single modern request may spend upstream, all phases together.
    pub call_timeout: Duration,
    pub max_event_bytes: usize,
    pub max_stream_bytes: usize,
    pub client_name: String,
}

#[derive(Debug, Clone)]
pub struct StateKeySpec {
    pub id: String,
    pub secret: [u8; 32],
}

#[derive(Debug, Clone)]
pub struct StateConfig {
    pub ttl: Duration,
    pub max_bytes: usize,
    pub max_rounds: u32,
    pub keys: Vec<StateKeySpec>,
}

#[derive(Debug, Clone)]
pub struct MrtrConfig {
    pub gather_window: Duration,
}

#[derive(Debug, Clone)]
pub struct DiscoverConfig {
    pub refresh: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheScope {
    Public,
    Private,
}

impl CacheScope {
    pub fn as_str(self) -> &'static str {
        match self {
            CacheScope::Public => "public",
            CacheScope::Private => "private",
        }
    }
}

/// A `ttlMs` / `cacheScope` pair.
#[derive(Debug, Clone, Copy)]
pub struct CacheHint {
    pub ttl: Duration,
    pub scope: CacheScope,
}

#[derive(Debug, Clone)]
pub struct CachingConfig {
    pub discover: CacheHint,
    pub list: CacheHint,
    pub read: CacheHint,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Json,
    Text,
}

#[derive(Debug, Clone)]
pub struct LogConfig {
    pub level: String,
    pub format: LogFormat,
}

impl Config {
    /// Reads `path`, applies environment overrides from the process environment, validates.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::new("(file)", format!("cannot read {}: {e}", path.display()))
        })?;
        let vars: Vec<(String, String)> = std::env::vars().collect();
        Self::from_toml_str(&text, &vars, path.parent())
    }

    /// Parses TOML text with the given environment; relative `secret_file` paths resolve
    /// against `base_dir` (the config file's directory).
    pub fn from_toml_str(
        text: &str,
        vars: &[(String, String)],
        base_dir: Option<&Path>,
    ) -> Result<Config, ConfigError> {
        let mut tree: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| ConfigError::new("(file)", e.to_string().trim()))?;
        let origins = env::apply_overrides(&mut tree, vars)?;
        let raw: RawConfig =
            serde_path_to_error::deserialize(toml::Value::Table(tree)).map_err(|e| {
                let key = e.path().to_string();
                let key = if key == "." {
                    "(file)".to_string()
                } else {
                    key
                };
                let mut err = ConfigError::new(key.clone(), e.inner().to_string());
                err.env_var = origins.var_for(&key);
                err
            })?;
        Self::from_raw(raw, base_dir).map_err(|mut e| {
            if e.env_var.is_none() {
                e.env_var = origins.var_for(&e.key);
            }
            e
        })
    }

    /// Validates a raw configuration into typed values.
    pub fn from_raw(raw: RawConfig, base_dir: Option<&Path>) -> Result<Config, ConfigError> {
        let listen = ListenConfig {
            addr: raw.listen.addr.parse().map_err(|_| {
                ConfigError::new(
                    "listen.addr",
                    format!(
                        "not a socket address: {:?} (expected e.g. \"127.0.0.1:8080\")",
                        raw.listen.addr
                    ),
                )
            })?,
            path: {
                if !raw.listen.path.starts_with('/') {
                    return Err(ConfigError::new("listen.path", "must start with '/'"));
                }
                raw.listen.path.clone()
            },
            max_body_bytes: positive_size("listen.max_body_bytes", raw.listen.max_body_bytes)?,
        };

        let url = url::Url::parse(&raw.upstream.url)
            .map_err(|e| ConfigError::new("upstream.url", format!("not a URL: {e}")))?;
        if url.scheme() != "http" && url.scheme() != "https" {
            return Err(ConfigError::new(
                "upstream.url",
                "scheme must be http or https",
            ));
        }
        if !LEGACY_VERSIONS.contains(&raw.upstream.protocol_version.as_str()) {
            return Err(ConfigError::new(
                "upstream.protocol_version",
                format!("must be one of {LEGACY_VERSIONS:?}"),
            ));
        }
        let upstream = UpstreamConfig {
            url,
            protocol_version: raw.upstream.protocol_version.clone(),
            connect_timeout: nonzero_duration(
                "upstream.connect_timeout",
                &raw.upstream.connect_timeout,
            )?,
            response_timeout: nonzero_duration(
                "upstream.response_timeout",
                &raw.upstream.response_timeout,
            )?,
            idle_timeout: nonzero_duration("upstream.idle_timeout", &raw.upstream.idle_timeout)?,
            call_timeout: nonzero_duration("upstream.call_timeout", &raw.upstream.call_timeout)?,
            max_event_bytes: positive_size(
                "upstream.max_event_bytes",
                raw.upstream.max_event_bytes,
            )?,
            max_stream_bytes: positive_size(
                "upstream.max_stream_bytes",
                raw.upstream.max_stream_bytes,
            )?,
            client_name: raw.upstream.client_name.clone(),
        };

        let state = StateConfig {
            ttl: nonzero_duration("state.ttl", &raw.state.ttl)?,
            max_bytes: {
                let n = positive_size("state.max_bytes", raw.state.max_bytes)?;
                if n < 256 {
                    return Err(ConfigError::new("state.max_bytes", "must be at least 256"));
                }
                n
            },
            max_rounds: {
                if raw.state.max_rounds == 0 {
                    return Err(ConfigError::new("state.max_rounds", "must be at least 1"));
                }
                raw.state.max_rounds
            },
            keys: load_keys(&raw.state.keys, base_dir)?,
        };

        let mrtr = MrtrConfig {
            gather_window: duration("mrtr.gather_window", &raw.mrtr.gather_window)?,
        };
        let discover = DiscoverConfig {
            refresh: nonzero_duration("discover.refresh", &raw.discover.refresh)?,
        };
        let c = &raw.caching;
        let caching = CachingConfig {
            discover: cache_hint("caching.discover", &c.discover_ttl, &c.discover_scope)?,
            list: cache_hint("caching.list", &c.list_ttl, &c.list_scope)?,
            read: cache_hint("caching.read", &c.read_ttl, &c.read_scope)?,
        };
        let log = LogConfig {
            level: {
                tracing_subscriber::EnvFilter::try_new(&raw.log.level)
                    .map_err(|e| ConfigError::new("log.level", format!("not a log filter: {e}")))?;
                raw.log.level.clone()
            },
            format: match raw.log.format.as_str() {
                "json" => LogFormat::Json,
                "text" => LogFormat::Text,
                other => {
                    return Err(ConfigError::new(
                        "log.format",
                        format!("must be \"json\" or \"text\", not {other:?}"),
                    ));
                }
            },
        };
        let auth = crate::auth::config::AuthConfig::from_raw(&raw.auth, base_dir)?;
        Ok(Config {
            listen,
            upstream,
            state,
            mrtr,
            discover,
            caching,
            log,
            auth,
        })
    }
}

fn duration(key: &str, text: &str) -> Result<Duration, ConfigError> {
    parse_duration(text).map_err(|m| ConfigError::new(key, m))
}

fn nonzero_duration(key: &str, text: &str) -> Result<Duration, ConfigError> {
    let d = duration(key, text)?;
    if d.is_zero() {
        return Err(ConfigError::new(key, "must be greater than zero"));
    }
    Ok(d)
}

fn positive_size(key: &str, n: u64) -> Result<usize, ConfigError> {
    if n == 0 {
        return Err(ConfigError::new(key, "must be greater than zero"));
    }
    usize::try_from(n).map_err(|_| ConfigError::new(key, "too large"))
}

fn cache_hint(prefix: &str, ttl: &str, scope: &str) -> Result<CacheHint, ConfigError> {
    let ttl = duration(&format!("{prefix}_ttl"), ttl)?;
    let scope = match scope {
        "public" => CacheScope::Public,
        "private" => CacheScope::Private,
        other => {
            return Err(ConfigError::new(
                format!("{prefix}_scope"),
                format!("must be \"public\" or \"private\", not {other:?}"),
            ));
        }
    };
    Ok(CacheHint { ttl, scope })
}

/// Key ids appear in every token: keep them short and URL-safe.
pub fn valid_key_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 32
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Decodes a 32-byte secret written as base64 (standard or URL-safe alphabet, padding optional).
pub fn decode_secret(text: &str) -> Result<[u8; 32], String> {
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    let cfg = GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
    let text = text.trim();
    let bytes = if text.contains(['-', '_']) {
        GeneralPurpose::new(&base64::alphabet::URL_SAFE, cfg).decode(text)
    } else {
        GeneralPurpose::new(&base64::alphabet::STANDARD, cfg).decode(text)
    }
    .map_err(|e| format!("not valid base64: {e}"))?;
    <[u8; 32]>::try_from(bytes.as_slice())
        .map_err(|_| format!("must decode to exactly 32 bytes, got {}", bytes.len()))
}

fn load_keys(
    raw: &[raw::RawStateKey],
    base_dir: Option<&Path>,
) -> Result<Vec<StateKeySpec>, ConfigError> {
    if raw.is_empty() {
        return Err(ConfigError::new(
            "state.keys",
            "at least one key is required (generate one with `mrtr-gateway keygen`)",
        ));
    }
    let mut keys: Vec<StateKeySpec> = Vec::with_capacity(raw.len());
    for (i, k) in raw.iter().enumerate() {
        let key_path = format!("state.keys[{i}]");
        if !valid_key_id(&k.id) {
            return Err(ConfigError::new(
                format!("{key_path}.id"),
                "must be 1-32 characters of A-Z a-z 0-9 _ -",
            ));
        }
        if keys.iter().any(|seen| seen.id == k.id) {
            return Err(ConfigError::new(
                format!("{key_path}.id"),
                format!("duplicate key id {:?}", k.id),
            ));
        }
        let secret = match (&k.secret, &k.secret_file) {
            (Some(s), None) => {
                decode_secret(s).map_err(|m| ConfigError::new(format!("{key_path}.secret"), m))?
            }
            (None, Some(file)) => {
                let path = resolve(base_dir, file);
                let text = std::fs::read_to_string(&path).map_err(|e| {
                    ConfigError::new(
                        format!("{key_path}.secret_file"),
                        format!("cannot read {}: {e}", path.display()),
                    )
                })?;
                decode_secret(&text)
                    .map_err(|m| ConfigError::new(format!("{key_path}.secret_file"), m))?
            }
            _ => {
                return Err(ConfigError::new(
                    key_path,
                    "set exactly one of `secret` or `secret_file`",
                ));
            }
        };
        keys.push(StateKeySpec {
            id: k.id.clone(),
            secret,
        });
    }
    Ok(keys)
}

fn resolve(base_dir: Option<&Path>, file: &str) -> PathBuf {
    let p = Path::new(file);
    match base_dir {
        Some(dir) if p.is_relative() => dir.join(p),
        _ => p.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

    fn minimal() -> String {
        format!("[[state.keys]]\nid = \"k1\"\nsecret = \"{KEY}\"\n")
    }

    #[test]
    fn minimal_file_gets_documented_defaults() {
        let c = Config::from_toml_str(&minimal(), &[], None).unwrap();
        assert_eq!(c.listen.addr.to_string(), "127.0.0.1:8080");
        assert_eq!(c.listen.path, "/mcp");
        assert_eq!(c.state.ttl, Duration::from_secs(600));
        assert_eq!(c.state.max_bytes, 65536);
        assert_eq!(c.state.max_rounds, 16);
        assert_eq!(c.state.keys[0].secret[31], 31);
    }

    fn err_of(text: &str) -> ConfigError {
        Config::from_toml_str(text, &[], None).unwrap_err()
    }

    #[test]
    fn each_bad_input_names_its_key() {
        let e = err_of(&format!(
            "{}\n[state]\nttl = \"soon\"\n",
            "[listen]\naddr=\"x\""
        ));
        assert_eq!(e.key, "listen.addr");
        let e = err_of(&format!("{}[mrtr]\ngather_window = \"soon\"\n", minimal()));
        assert_eq!(e.key, "mrtr.gather_window");
        let e = err_of(&format!("{}[listen]\nbogus = 1\n", minimal()));
        assert!(e.key.starts_with("listen"), "{e}");
        assert!(e.message.contains("bogus"), "{e}");
        let e = err_of("[state]\nttl = \"1m\"\n");
        assert_eq!(e.key, "state.keys");
        let e = err_of("[[state.keys]]\nid = \"k1\"\nsecret = \"%%%\"\n");
        assert_eq!(e.key, "state.keys[0].secret");
        let e = err_of(&format!(
            "{}[[state.keys]]\nid = \"k1\"\nsecret = \"{KEY}\"\n",
            minimal()
        ));
        assert_eq!(e.key, "state.keys[1].id");
        assert!(e.message.contains("duplicate"));
        let e = err_of("[[state.keys]]\nid = \"k1\"\nsecret_file = \"/nonexistent/key\"\n");
        assert_eq!(e.key, "state.keys[0].secret_file");
        let e = err_of("[[state.keys]]\nid = \"k1\"\nsecret = \"AAAA\"\n");
        assert!(e.message.contains("32 bytes"), "{e}");
    }

    #[test]
    fn environment_overrides_win_and_are_named_in_errors() {
        let vars = vec![("MRTR_GATEWAY__STATE__TTL".to_string(), "30s".to_string())];
        let text = format!("[state]\nttl = \"5m\"\n{}", minimal());
        let c = Config::from_toml_str(&text, &vars, None).unwrap();
        assert_eq!(c.state.ttl, Duration::from_secs(30));
        let bad = vec![(
            "MRTR_GATEWAY__STATE__TTL".to_string(),
            "forever".to_string(),
        )];
        let e = Config::from_toml_str(&text, &bad, None).unwrap_err();
        assert_eq!(e.key, "state.ttl");
        assert_eq!(e.env_var.as_deref(), Some("MRTR_GATEWAY__STATE__TTL"));
    }

    #[test]
    fn secrets_accept_both_alphabets() {
        assert!(decode_secret(KEY).is_ok());
        assert!(decode_secret(KEY.trim_end_matches('=')).is_ok());
        let url_safe = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode([0xfbu8; 32]);
        assert_eq!(decode_secret(&url_safe).unwrap(), [0xfb; 32]);
    }
}
