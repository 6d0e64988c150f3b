//! `[tracing]`: where spans are exported (OTLP/HTTP, protobuf) and how many may wait.

use std::time::Duration;

use super::check::{bounded_duration, in_range};
use super::{ConfigError, raw::RawTracing};
use crate::telemetry::OtlpExportConfig;

#[derive(Debug, Clone, PartialEq)]
pub struct TracingConfig {
    /// `None` while `tracing.otlp_endpoint` is empty: no span leaves the process.
    pub otlp: Option<OtlpExportConfig>,
}

/// The most spans the export queue may be configured to hold.
const MAX_QUEUE_SPANS: u64 = 1_000_000;

pub(super) fn tracing_config(raw: &RawTracing) -> Result<TracingConfig, ConfigError> {
    // Every key is checked whether export is on or off, so a typo shows before it matters.
    let service_name = raw.service_name.trim();
    if service_name.is_empty() || service_name.len() > 255 {
        return Err(ConfigError::new(
            "tracing.service_name",
            "must be 1 to 255 characters",
        ));
    }
    if !(0.0..=1.0).contains(&raw.sample_ratio) {
        return Err(ConfigError::new(
            "tracing.sample_ratio",
            format!("must be between 0.0 and 1.0, not {}", raw.sample_ratio),
        ));
    }
    let export_timeout = bounded_duration(
        "tracing.export_timeout",
        &raw.export_timeout,
        Duration::from_secs(60),
    )?;
    let export_interval = bounded_duration(
        "tracing.export_interval",
        &raw.export_interval,
        Duration::from_secs(60),
    )?;
    let max_queue_spans = in_range(
        "tracing.max_queue_spans",
        raw.max_queue_spans,
        1,
        MAX_QUEUE_SPANS,
    )?;
    if raw.max_batch_spans == 0 || raw.max_batch_spans > raw.max_queue_spans {
        return Err(ConfigError::new(
            "tracing.max_batch_spans",
            "must be between 1 and tracing.max_queue_spans",
        ));
    }
    let max_batch_spans = in_range(
        "tracing.max_batch_spans",
        raw.max_batch_spans,
        1,
        MAX_QUEUE_SPANS,
    )?;
    if raw.otlp_endpoint.is_empty() {
        return Ok(TracingConfig { otlp: None });
    }
    Ok(TracingConfig {
        otlp: Some(OtlpExportConfig {
            endpoint: otlp_endpoint(&raw.otlp_endpoint)?,
            service_name: service_name.to_string(),
            sample_ratio: raw.sample_ratio,
            export_timeout,
            export_interval,
            max_queue_spans,
            max_batch_spans,
        }),
    })
}

/// The collector's full traces URL: `http` or `https`, a host, no credentials (a collector's
/// token goes in `OTEL_EXPORTER_OTLP_HEADERS`), and a path — the gateway sends to the URL
/// as given and does not append `/v1/traces`.
fn otlp_endpoint(text: &str) -> Result<url::Url, ConfigError> {
    let key = "tracing.otlp_endpoint";
    let url = url::Url::parse(text).map_err(|e| {
        ConfigError::new(
            key,
            format!("not a URL ({e}); e.g. \"http://otel-collector:4318/v1/traces\" (or \"\" to turn export off)"),
        )
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(ConfigError::new(
            key,
            format!("must be an http or https URL, not {}:", url.scheme()),
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(ConfigError::new(key, "has no host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(ConfigError::new(
            key,
            "must not carry credentials; put a collector token in OTEL_EXPORTER_OTLP_HEADERS",
        ));
    }
    if url.path().is_empty() || url.path() == "/" {
        return Err(ConfigError::new(
            key,
            "needs the full traces path, e.g. http://otel-collector:4318/v1/traces (nothing is appended)",
        ));
    }
    Ok(url)
}
