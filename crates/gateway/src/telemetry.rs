//! Logging setup: JSON (default) or text lines through `tracing`, level from the config.

use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::reload;
use tracing_subscriber::util::SubscriberInitExt;

/// How log lines are written (`log.format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Json,
    Text,
}

/// Changes the log filter at run time (config reload).
pub type LevelHandle = reload::Handle<EnvFilter, tracing_subscriber::Registry>;

/// Installs the global subscriber. `RUST_LOG`, when set, overrides `level`.
pub fn init(level: &str, format: LogFormat) -> Option<LevelHandle> {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| EnvFilter::try_new(v).ok())
        .unwrap_or_else(|| EnvFilter::new(level));
    let (filter, handle) = reload::Layer::new(filter);
    let registry = tracing_subscriber::registry().with(filter);
    let installed = match format {
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_current_span(true)
                    .with_writer(std::io::stderr),
            )
            .try_init(),
        LogFormat::Text => registry
            .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
            .try_init(),
    };
    installed.ok().map(|_| handle)
}
