//! Logging setup: JSON (default) or text lines through `tracing`, level from the config.
//!
//! Lines are written off the request path: a request formats its line and hands it to a
//! channel; one background thread writes the channel to stderr. Nothing waits on stderr or on
//! a lock around it unless the channel is full (then the writer blocks rather than drop a
//! line: an access log with holes is worse than a slow one). The writer flushes what is left
//! when [`Logging`] is dropped, at the end of `main`.

use std::io::IsTerminal;

use tracing_appender::non_blocking::{NonBlockingBuilder, WorkerGuard};
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

/// Lines the writer holds before a logging request waits for it.
const BUFFERED_LINES: usize = 64 * 1024;

/// The installed logger: the level handle (`None` when a logger was already installed) and
/// the background writer, which flushes when this is dropped.
pub struct Logging {
    pub level: Option<LevelHandle>,
    _writer: WorkerGuard,
}

/// Installs the global subscriber. `RUST_LOG`, when set, overrides `level`.
pub fn init(level: &str, format: LogFormat) -> Logging {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| EnvFilter::try_new(v).ok())
        .unwrap_or_else(|| EnvFilter::new(level));
    let (filter, handle) = reload::Layer::new(filter);
    let registry = tracing_subscriber::registry().with(filter);
    let (writer, guard) = NonBlockingBuilder::default()
        .lossy(false)
        .buffered_lines_limit(BUFFERED_LINES)
        .thread_name("mrtr-log-writer")
        .finish(std::io::stderr());
    let installed = match format {
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_current_span(true)
                    .with_writer(writer),
            )
            .try_init(),
        LogFormat::Text => registry
            .with(
                tracing_subscriber::fmt::layer()
                    // Colour codes only for a person at a terminal, never in a collected log.
                    .with_ansi(std::io::stderr().is_terminal())
                    .with_writer(writer),
            )
            .try_init(),
    };
    Logging {
        level: installed.ok().map(|_| handle),
        _writer: guard,
    }
}
