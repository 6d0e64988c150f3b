//! Gateway configuration: TOML file, environment overrides, validation into typed values.
//!
//! Loading runs in three steps, each with one job:
//! 1. parse the file into a TOML tree and apply `MRTR_GATEWAY__SECTION__KEY` environment
//!    overrides onto that tree ([`mod@env`]);
//! 2. deserialize the tree into [`raw::RawConfig`] (unknown keys are errors, and the error
//!    names the key path);
//! 3. validate into [`Config`]: parse addresses, durations and URLs, load key material.
//!
//! Every error is a [`ConfigError`] naming the file key (and the variable, when the value came
//! from the environment); the binary turns it into exit status 64.

mod admin;
mod caching;
mod check;
mod discover;
mod drain;
pub mod env;
mod legacy_clients;
mod listen;
mod log;
mod long_calls;
mod mrtr;
pub mod new_key;
mod parking;
mod pool;
mod quotas;
pub mod raw;
pub mod redact;
mod replica;
mod runtime;
mod state;
mod subscriptions;
mod tasks;
mod tls;
mod traces;
mod upstream;

use std::path::Path;

pub use crate::setting::call_rule;
pub use crate::setting::{ConfigError, parse_duration};
pub use crate::state::{StateKeySpec, valid_key_id};
pub use crate::telemetry::LogFormat;
pub use admin::AdminConfig;
pub use caching::{CacheHint, CacheScope, CachingConfig};
pub use discover::DiscoverConfig;
pub use drain::DrainConfig;
pub use legacy_clients::LegacyClientsConfig;
pub use listen::ListenConfig;
pub use log::LogConfig;
pub use long_calls::{LongCallRule, LongCallsConfig};
pub use mrtr::MrtrConfig;
pub use parking::{ParkPolicy, ParkingConfig, ParkingRule};
pub use pool::{PoolConfig, PoolMode};
pub use quotas::ineffective_quotas;
use raw::RawConfig;
pub use replica::ReplicaConfig;
pub use runtime::RuntimeConfig;
pub use state::{StateConfig, decode_secret, load_keys_dir};
pub use subscriptions::SubscriptionsConfig;
pub use tasks::{TaskRule, TaskSupport, TasksConfig};
pub use tls::{ClientAuth, TlsConfig};
pub use traces::TracingConfig;
pub use upstream::{LEGACY_VERSIONS, StdioConfig, UpstreamConfig, UpstreamTransport};

/// The secret printed in `config/gateway.toml`; public, so never fit for production.
pub const EXAMPLE_SECRET: &str = "AEarFVUsENTN8apT0+NBD/WiFLYe0+IDHCIEZpsSwGs=";

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
    pub admin: AdminConfig,
    /// Front TLS; `None` serves plain HTTP.
    pub tls: Option<TlsConfig>,
    pub drain: DrainConfig,
    pub replica: ReplicaConfig,
    pub parking: ParkingConfig,
    pub long_calls: LongCallsConfig,
    /// Tool calls served as tasks (`[tasks]`, the Tasks extension).
    pub tasks: TasksConfig,
    pub pool: PoolConfig,
    pub single_use: crate::single_use::SingleUseConfig,
    pub auth: crate::auth::config::AuthConfig,
    pub subscriptions: SubscriptionsConfig,
    /// What a legacy server may ask the client (`[policy]`).
    pub policy: crate::policy::PolicyConfig,
    pub legacy_clients: LegacyClientsConfig,
    /// How every pool callers share is divided (`[quotas]`; the pools carry the result).
    pub quotas: crate::fair_share::Fractions,
    /// OpenTelemetry trace export (`[tracing]`); read once at start.
    pub tracing: TracingConfig,
    /// The threads that run the gateway (`[runtime]`); read once at start.
    pub runtime: RuntimeConfig,
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
                // An array element (`policy.url.allow_hosts[1]`) came from the variable that
                // set the whole array.
                let whole = e.key.split_once('[').map_or(e.key.as_str(), |(k, _)| k);
                e.env_var = origins.var_for(&e.key).or_else(|| origins.var_for(whole));
            }
            e
        })
    }

    /// The effective configuration as TOML — file, environment overrides and defaults —
    /// with secrets redacted (`check-config --print`). Fails like [`Config::from_toml_str`].
    pub fn effective_toml(
        text: &str,
        vars: &[(String, String)],
        base_dir: Option<&Path>,
    ) -> Result<String, ConfigError> {
        Self::from_toml_str(text, vars, base_dir)?;
        let mut tree: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| ConfigError::new("(file)", e.to_string().trim()))?;
        env::apply_overrides(&mut tree, vars)?;
        let mut raw: RawConfig = toml::Value::Table(tree)
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::new("(file)", e.to_string()))?;
        redact(&mut raw);
        toml::to_string_pretty(&raw).map_err(|e| ConfigError::new("(file)", e.to_string()))
    }

    /// Validates a raw configuration into typed values, one section after the other in the
    /// order below: the first problem found is the one reported. Parking depends on the state
    /// TTL and the stdio children, and warm-up on the pool and auth sections, so they follow them.
    pub fn from_raw(raw: RawConfig, base_dir: Option<&Path>) -> Result<Config, ConfigError> {
        // First: every pool below is divided between callers by these.
        let quotas = quotas::quotas_config(&raw.quotas)?;
        let listen = listen::listen_config(&raw.listen)?;
        let upstream = upstream::upstream_config(&raw.upstream, base_dir)?;
        let state = state::state_config(&raw.state, base_dir)?;
        let mrtr = mrtr::mrtr_config(&raw.mrtr)?;
        let discover = discover::discover_config(&raw.discover)?;
        let caching = caching::caching_config(&raw.caching)?;
        let log = log::log_config(&raw.log)?;
        let admin = admin::admin_config(&raw.admin)?;
        let tls = tls::tls_config(&raw.tls, base_dir)?;
        let drain = drain::drain_config(&raw.drain)?;
        let replica = replica::replica_config(&raw.replica)?;
        let parking =
            parking::parking_config(&raw.parking, state.ttl, upstream.stdio.max_children, quotas)?;
        let pool = pool::pool_config(&raw.pool, quotas)?;
        let auth = crate::auth::config::AuthConfig::from_raw(&raw.auth, base_dir)?;
        pool::check_warm_up(&pool, &auth)?;
        let single_use =
            crate::single_use::SingleUseConfig::from_raw(&raw.single_use, base_dir, quotas)?;
        let subscriptions = subscriptions::subscriptions_config(&raw.subscriptions, quotas)?;
        let policy = crate::policy::PolicyConfig::from_raw(&raw.policy)?;
        let legacy_clients = legacy_clients::legacy_clients_config(&raw.legacy_clients, quotas)?;
        let long_calls = long_calls::long_calls_config(&raw.long_calls)?;
        let tasks = tasks::tasks_config(&raw.tasks, quotas)?;
        let tracing = traces::tracing_config(&raw.tracing)?;
        let runtime = runtime::runtime_config(&raw.runtime)?;
        Ok(Config {
            runtime,
            long_calls,
            tasks,
            quotas,
            tracing,
            legacy_clients,
            policy,
            pool,
            subscriptions,
            parking,
            listen,
            upstream,
            state,
            mrtr,
            discover,
            caching,
            log,
            admin,
            tls,
            drain,
            replica,
            single_use,
            auth,
        })
    }
}

use redact::REDACTED;

/// Replaces secret values in a raw configuration before it is printed.
fn redact(raw: &mut RawConfig) {
    for k in &mut raw.state.keys {
        if k.secret.is_some() {
            k.secret = Some(REDACTED.into());
        }
    }
    // Child-process environments often carry credentials.
    for v in raw.upstream.env.values_mut() {
        *v = REDACTED.into();
    }
    for u in &mut raw.single_use.redis.urls {
        *u = redact::redacted_url_text(u);
    }
    raw.upstream.url = redact::redacted_url_text(&raw.upstream.url);
}

#[cfg(test)]
mod tests;
