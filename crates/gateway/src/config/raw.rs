//! The TOML file as written by operators: every key, with serde defaults, unknown keys refused.
//!
//! Nothing here is validated beyond its TOML type; [`super::Config::from_raw`] turns this into
//! the typed configuration (parsed addresses, durations, loaded keys) and names the key of
//! anything wrong. `config/gateway.toml` documents each key with its default.

use std::collections::BTreeMap;

use serde::Deserialize;

#[derive(Debug, Deserialize, serde::Serialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    #[serde(default)]
    pub listen: RawListen,
    #[serde(default)]
    pub upstream: RawUpstream,
    #[serde(default)]
    pub state: RawState,
    #[serde(default)]
    pub mrtr: RawMrtr,
    #[serde(default)]
    pub discover: RawDiscover,
    #[serde(default)]
    pub caching: RawCaching,
    #[serde(default)]
    pub log: RawLog,
    #[serde(default)]
    pub admin: RawAdmin,
    #[serde(default)]
    pub tls: RawTls,
    #[serde(default)]
    pub drain: RawDrain,
    #[serde(default)]
    pub replica: RawReplica,
    #[serde(default)]
    pub parking: RawParking,
    #[serde(default)]
    pub pool: RawPool,
    #[serde(default)]
    pub single_use: crate::single_use::config::RawSingleUse,
    #[serde(default)]
    pub auth: crate::auth::config::RawAuth,
    #[serde(default)]
    pub subscriptions: RawSubscriptions,
    #[serde(default)]
    pub policy: crate::policy::config::RawPolicy,
    #[serde(default)]
    pub legacy_clients: RawLegacyClients,
    #[serde(default)]
    pub long_calls: RawLongCalls,
    #[serde(default)]
    pub tasks: RawTasks,
    #[serde(default)]
    pub tracing: RawTracing,
    #[serde(default)]
    pub quotas: RawQuotas,
    #[serde(default)]
    pub runtime: RawRuntime,
}

/// `[runtime]`: the threads that run the gateway.
#[derive(Debug, Deserialize, serde::Serialize, Default, Clone)]
#[serde(deny_unknown_fields, default)]
pub struct RawRuntime {
    /// 0: one per CPU the process may use.
    pub worker_threads: u32,
}

/// `[quotas]`: how every per-caller pool is divided (see `crate::fair_share`).
#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawQuotas {
    pub caller_share: f64,
    pub newcomer_reserve: f64,
}

impl Default for RawQuotas {
    fn default() -> Self {
        RawQuotas {
            caller_share: crate::fair_share::DEFAULT_CALLER_SHARE,
            newcomer_reserve: crate::fair_share::DEFAULT_NEWCOMER_RESERVE,
        }
    }
}

#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawListen {
    pub addr: String,
    pub path: String,
    pub max_body_bytes: u64,
    pub allowed_origins: Vec<String>,
    pub header_read_timeout: String,
    pub idle_timeout: String,
    pub idle_release_after: String,
    pub max_concurrent_requests: u64,
    pub body_read_timeout: String,
    pub max_connections: u64,
    pub max_connections_per_source: u64,
    pub ipv6_source_prefix: u64,
    pub http2_max_concurrent_streams: u64,
}

impl Default for RawListen {
    fn default() -> Self {
        RawListen {
            addr: "127.0.0.1:8080".into(),
            path: "/mcp".into(),
            max_body_bytes: 1024 * 1024,
            allowed_origins: Vec::new(),
            header_read_timeout: "10s".into(),
            idle_timeout: "2m".into(),
            idle_release_after: "1s".into(),
            max_concurrent_requests: 1024,
            body_read_timeout: "10s".into(),
            max_connections: 4096,
            max_connections_per_source: 1024,
            ipv6_source_prefix: u64::from(crate::caller_scope::DEFAULT_IPV6_SOURCE_PREFIX),
            http2_max_concurrent_streams: 100,
        }
    }
}

#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawUpstream {
    pub transport: String,
    pub url: String,
    pub protocol_version: String,
    pub connect_timeout: String,
    pub response_timeout: String,
    pub idle_timeout: String,
    pub call_timeout: String,
    pub max_event_bytes: u64,
    pub max_stream_bytes: u64,
    pub client_name: String,
    pub resume_attempts: u64,
    pub resume_max_delay: String,
    pub max_idle_connections: u64,
    pub connection_idle_timeout: String,
    pub ca_file: Option<String>,
    pub client_cert_file: Option<String>,
    pub client_key_file: Option<String>,
    pub pin_sha256: Vec<String>,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
    pub max_line_bytes: u64,
    pub stdio_max_children: u64,
    pub stdio_spawn_backoff: String,
    pub stdio_shutdown_grace: String,
}

impl Default for RawUpstream {
    fn default() -> Self {
        RawUpstream {
            transport: "streamable-http".into(),
            url: "http://127.0.0.1:9001/mcp".into(),
            protocol_version: "2025-11-25".into(),
            connect_timeout: "5s".into(),
            response_timeout: "30s".into(),
            idle_timeout: "5m".into(),
            call_timeout: "10m".into(),
            max_event_bytes: 4 * 1024 * 1024,
            max_stream_bytes: 64 * 1024 * 1024,
            client_name: "mrtr-gateway".into(),
            resume_attempts: 5,
            resume_max_delay: "10s".into(),
            max_idle_connections: 1024,
            connection_idle_timeout: "30s".into(),
            ca_file: None,
            client_cert_file: None,
            client_key_file: None,
            pin_sha256: Vec::new(),
            command: Vec::new(),
            env: BTreeMap::new(),
            cwd: None,
            max_line_bytes: 4 * 1024 * 1024,
            stdio_max_children: 8,
            stdio_spawn_backoff: "5s".into(),
            stdio_shutdown_grace: "3s".into(),
        }
    }
}

#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawState {
    pub ttl: String,
    pub max_bytes: u64,
    pub max_rounds: u32,
    pub clock_skew: String,
    pub keys_dir: Option<String>,
    pub keys: Vec<RawStateKey>,
}

impl Default for RawState {
    fn default() -> Self {
        RawState {
            ttl: "10m".into(),
            max_bytes: 65536,
            max_rounds: 16,
            clock_skew: "30s".into(),
            keys_dir: None,
            keys: Vec::new(),
        }
    }
}

#[derive(Debug, Deserialize, serde::Serialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct RawStateKey {
    pub id: String,
    #[serde(default)]
    pub secret: Option<String>,
    #[serde(default)]
    pub secret_file: Option<String>,
}

#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawMrtr {
    pub gather_window: String,
    pub gather_quiet: String,
    pub learned_rounds_max: u64,
}

impl Default for RawMrtr {
    fn default() -> Self {
        RawMrtr {
            gather_window: "100ms".into(),
            gather_quiet: "2ms".into(),
            learned_rounds_max: 4096,
        }
    }
}

#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawLongCalls {
    pub round_after: String,
    pub rules: Vec<RawLongCallRule>,
    pub max_running: u64,
    pub max_running_per_principal: Option<u64>,
}

impl Default for RawLongCalls {
    fn default() -> Self {
        RawLongCalls {
            round_after: "20s".into(),
            rules: Vec::new(),
            max_running: 256,
            max_running_per_principal: None,
        }
    }
}

#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawLongCallRule {
    pub method: String,
    #[serde(default)]
    pub name: Option<String>,
    pub round_after: String,
}

#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawTasks {
    pub enabled: bool,
    pub rules: Vec<RawTaskRule>,
    pub ttl: String,
    pub poll_interval: String,
    pub lease: String,
    pub max_running: u64,
    pub max_running_per_principal: Option<u64>,
    pub max_kept: u64,
}

impl Default for RawTasks {
    fn default() -> Self {
        RawTasks {
            enabled: true,
            rules: Vec::new(),
            ttl: "1h".into(),
            poll_interval: "1s".into(),
            lease: "15s".into(),
            max_running: 256,
            max_running_per_principal: None,
            max_kept: 4096,
        }
    }
}

#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawTaskRule {
    #[serde(default = "tools_call")]
    pub method: String,
    #[serde(default)]
    pub name: Option<String>,
    pub support: String,
}

fn tools_call() -> String {
    "tools/call".into()
}

#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawDiscover {
    pub refresh: String,
}

impl Default for RawDiscover {
    fn default() -> Self {
        RawDiscover {
            refresh: "5m".into(),
        }
    }
}

#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawCaching {
    pub discover_ttl: String,
    pub discover_scope: String,
    pub list_ttl: String,
    pub list_scope: String,
    pub read_ttl: String,
    pub read_scope: String,
}

impl Default for RawCaching {
    fn default() -> Self {
        RawCaching {
            discover_ttl: "5m".into(),
            discover_scope: "public".into(),
            list_ttl: "1m".into(),
            list_scope: "private".into(),
            read_ttl: "0s".into(),
            read_scope: "private".into(),
        }
    }
}

#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawLog {
    pub level: String,
    pub format: String,
}

impl Default for RawLog {
    fn default() -> Self {
        RawLog {
            level: "info".into(),
            format: "json".into(),
        }
    }
}

#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawAdmin {
    pub addr: String,
    pub max_connections: u64,
    pub header_read_timeout: String,
    pub idle_timeout: String,
    pub allowed_hosts: Vec<String>,
    pub upstream_check_cache: String,
    pub upstream_check_wait: String,
}

impl Default for RawAdmin {
    fn default() -> Self {
        RawAdmin {
            addr: "127.0.0.1:9090".into(),
            max_connections: 64,
            header_read_timeout: "5s".into(),
            idle_timeout: "30s".into(),
            allowed_hosts: Vec::new(),
            upstream_check_cache: "2s".into(),
            upstream_check_wait: "1500ms".into(),
        }
    }
}

#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawTls {
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
    pub client_ca_file: Option<String>,
    pub client_auth: String,
}

impl Default for RawTls {
    fn default() -> Self {
        RawTls {
            cert_file: None,
            key_file: None,
            client_ca_file: None,
            client_auth: "none".into(),
        }
    }
}

#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawDrain {
    pub readiness_delay: String,
    pub deadline: String,
}

impl Default for RawDrain {
    fn default() -> Self {
        RawDrain {
            readiness_delay: "5s".into(),
            deadline: "30s".into(),
        }
    }
}

#[derive(Debug, Deserialize, serde::Serialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct RawReplica {
    pub id: String,
}

#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawParking {
    pub default_policy: String,
    pub max_calls: u64,
    pub max_per_principal: Option<u64>,
    pub ttl: String,
    pub max_buffered_bytes: u64,
    pub stdio_reserved_children: Option<u64>,
    pub rules: Vec<RawParkingRule>,
}

impl Default for RawParking {
    fn default() -> Self {
        RawParking {
            default_policy: "park-then-replay".into(),
            max_calls: 1000,
            max_per_principal: None,
            ttl: String::new(),
            max_buffered_bytes: 1024 * 1024,
            stdio_reserved_children: None,
            rules: Vec::new(),
        }
    }
}

#[derive(Debug, Deserialize, serde::Serialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct RawParkingRule {
    pub method: String,
    #[serde(default)]
    pub name: Option<String>,
    pub policy: String,
}

#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawPool {
    pub mode: String,
    pub max_idle_per_key: u64,
    pub max_idle: u64,
    pub max_idle_per_principal: Option<u64>,
    pub idle_timeout: String,
    pub idle_read_after: String,
    pub warm_up: u64,
    pub warm_up_capabilities: Vec<String>,
    pub roots_refresh_wait: String,
    pub roots_refresh_probes: u64,
}

impl Default for RawPool {
    fn default() -> Self {
        RawPool {
            mode: "pooled".into(),
            max_idle_per_key: 8,
            max_idle: 1024,
            max_idle_per_principal: None,
            idle_timeout: "60s".into(),
            idle_read_after: "25ms".into(),
            warm_up: 0,
            warm_up_capabilities: Vec::new(),
            roots_refresh_wait: "1s".into(),
            roots_refresh_probes: 3,
        }
    }
}

/// `[subscriptions]`: `subscriptions/listen` streams.
#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawSubscriptions {
    pub keepalive: String,
    pub max_streams: u64,
    pub max_streams_per_principal: Option<u64>,
    pub max_resource_subscriptions: u64,
}

impl Default for RawSubscriptions {
    fn default() -> Self {
        RawSubscriptions {
            keepalive: "15s".into(),
            max_streams: 256,
            max_streams_per_principal: None,
            max_resource_subscriptions: 64,
        }
    }
}

/// `[legacy_clients]`: legacy clients passed through by the dual-era front.
#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawLegacyClients {
    pub enabled: bool,
    pub max_get_streams: u64,
    pub max_get_streams_per_principal: Option<u64>,
}

impl Default for RawLegacyClients {
    fn default() -> Self {
        RawLegacyClients {
            enabled: true,
            max_get_streams: 256,
            max_get_streams_per_principal: None,
        }
    }
}

/// `[tracing]`: OpenTelemetry trace export over OTLP/HTTP (off while `otlp_endpoint` is empty).
#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawTracing {
    pub otlp_endpoint: String,
    pub service_name: String,
    pub sample_ratio: f64,
    pub export_timeout: String,
    pub export_interval: String,
    pub max_queue_spans: u64,
    pub max_batch_spans: u64,
}

impl Default for RawTracing {
    fn default() -> Self {
        RawTracing {
            otlp_endpoint: String::new(),
            service_name: "mrtr-gateway".into(),
            sample_ratio: 1.0,
            export_timeout: "10s".into(),
            export_interval: "5s".into(),
            max_queue_spans: 2048,
            max_batch_spans: 512,
        }
    }
}
