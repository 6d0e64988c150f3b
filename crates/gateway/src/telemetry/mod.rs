//! Logging setup: JSON (default) or text lines through `tracing`, level from the config; and,
//! when `[tracing] otlp_endpoint` is set, OpenTelemetry trace export ([`otlp_export`]) of the
//! spans [`spans`] marks for it.
//!
//! Lines are written off the request path (`line_writer`): a request formats its line and
//! appends it to a buffer; one background thread, woken only when lines start coming again,
//! writes the buffer to stderr in batches. Nothing waits on stderr unless the buffer is full
//! (then the request waits rather than drop a line: an access log with holes is worse than a
//! slow one). The writer writes what is left when [`Logging`] is dropped, at the end of
//! `main`.
//!
//! The two outputs have filters of their own: `log.level` (and `RUST_LOG`) decides which lines
//! are written, never which spans are exported, and the exporter sees only the spans that
//! declare an `otel.kind` (the request span and its legacy call), never an event — so no log
//! line, with whatever it carries, becomes part of a trace.

mod line_writer;
mod lines;
mod otlp_client;
pub mod otlp_export;
pub mod spans;
mod timestamp;

use tracing_subscriber::filter::{FilterExt, filter_fn};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry, reload};

pub use lines::Lines;
pub use otlp_export::{OtlpExportConfig, TraceCounters, TraceExport};

/// How log lines are written (`log.format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Json,
    Text,
}

/// Changes the log filter at run time (config reload).
pub type LevelHandle = reload::Handle<EnvFilter, tracing_subscriber::Registry>;

/// Bytes of lines the writer holds before a logging request waits for it (about 30,000
/// access lines).
const BUFFERED_BYTES: usize = 8 << 20;

/// The installed logger: the level handle (`None` when a logger was already installed), the
/// background writer, which flushes when this is dropped, and the trace exporter, if any.
pub struct Logging {
    pub level: Option<LevelHandle>,
    traces: Option<TraceExport>,
    _writer: line_writer::WriterGuard,
}

impl Logging {
    /// Sends the spans still queued and stops the exporter, waiting at most the export
    /// timeout (a no-op without export). Call it once requests are done, before the runtime
    /// the exporter sends on is dropped.
    pub fn flush_traces(&mut self) {
        if let Some(traces) = self.traces.take() {
            traces.shutdown();
        }
    }
}

type BoxedLayer = Box<dyn Layer<Registry> + Send + Sync>;

/// Installs the global subscriber. `RUST_LOG`, when set, overrides `level`. With `traces`,
/// the spans marked for export go to it as well.
pub fn init(level: &str, format: LogFormat, traces: Option<TraceExport>) -> Logging {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| EnvFilter::try_new(v).ok())
        .unwrap_or_else(|| EnvFilter::new(level));
    let (filter, handle) = reload::Layer::new(filter);
    let (writer, guard) = line_writer::spawn(std::io::stderr(), BUFFERED_BYTES, "mrtr-log-writer")
        .expect("the log writer thread starts");
    // Lines are written from events alone (a line names its request from the request's
    // context, see `lines`), so this layer never keeps a span's fields.
    let lines: BoxedLayer = tracing_subscriber::fmt::layer()
        .event_format(Lines::new(format))
        .with_writer(writer)
        .with_filter(filter.and(filter_fn(|meta| meta.is_event())))
        .boxed();
    let mut layers = vec![lines];
    if let Some(t) = &traces {
        layers.push(t.layer());
    }
    let installed = tracing_subscriber::registry().with(layers).try_init();
    Logging {
        level: installed.ok().map(|_| handle),
        traces,
        _writer: guard,
    }
}
