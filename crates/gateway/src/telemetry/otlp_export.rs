//! OpenTelemetry trace export: the spans [`super::spans`] marks go, in batches, to an OTLP/HTTP
//! collector as protobuf (`[tracing] otlp_endpoint`).
//!
//! Nothing here runs on a request's path but one atomic add and a channel send when a span
//! ends. From there:
//!
//! ```text
//!  span ends ──▶ QueueGate ──(full? count it, drop it)──▶ BatchSpanProcessor queue
//!                                                         │ its own thread, every
//!                                                         │ export_interval or max_batch_spans
//!                                                         ▼
//!                                    CountedExporter ──▶ OTLP/HTTP exporter (protobuf)
//!                                                         │ OtlpHttpClient: the request runs
//!                                                         ▼ as a task on the gateway's runtime
//!                                                      collector
//! ```
//!
//! The SDK's batch processor keeps its own bounded queue but only logs what it drops; the gate
//! in front of it holds the same bound and counts each span it refuses
//! (`mrtr_gateway_trace_spans_total{result="dropped"}`), so the processor itself never drops.
//! A span is counted as queued from the gate until the exporter takes its batch.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider, Span, SpanData,
    SpanExporter, SpanProcessor,
};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{LevelFilter, filter_fn};

use super::BoxedLayer;
use super::otlp_client::OtlpHttpClient;

/// `[tracing]` with export on, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct OtlpExportConfig {
    /// The collector's traces URL, used as given (`…/v1/traces`).
    pub endpoint: url::Url,
    /// The `service.name` resource attribute.
    pub service_name: String,
    /// Share of traces started here (no sampled parent) that are recorded; a request whose
    /// `traceparent` says sampled or not follows its parent.
    pub sample_ratio: f64,
    /// Longest one export (all its attempts) may take; also bounds the flush at shutdown.
    pub export_timeout: Duration,
    /// How often queued spans are sent when fewer than a batch are waiting.
    pub export_interval: Duration,
    /// Spans waiting for export at most; more are dropped and counted.
    pub max_queue_spans: usize,
    /// Spans per export request at most.
    pub max_batch_spans: usize,
}

/// What export has done since the process started (one exporter per process).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TraceCounters {
    /// Spans the collector accepted.
    pub exported: u64,
    /// Spans refused because `max_queue_spans` were already waiting.
    pub dropped: u64,
    /// Spans in batches the collector did not accept (after the exporter's retries).
    pub failed: u64,
    /// Spans waiting now.
    pub queued: u64,
}

static EXPORTED: AtomicU64 = AtomicU64::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);
static FAILED: AtomicU64 = AtomicU64::new(0);
static QUEUED: AtomicUsize = AtomicUsize::new(0);
/// Whether the last export failed: its warning is logged once per run of failures.
static FAILING: AtomicBool = AtomicBool::new(false);

/// The counters so far (all zero while export is off).
pub fn counters() -> TraceCounters {
    TraceCounters {
        exported: EXPORTED.load(Ordering::Relaxed),
        dropped: DROPPED.load(Ordering::Relaxed),
        failed: FAILED.load(Ordering::Relaxed),
        queued: QUEUED.load(Ordering::Relaxed) as u64,
    }
}

/// The running exporter: give `TraceExport::layer` to the subscriber, and call
/// [`TraceExport::shutdown`] once requests are done.
pub struct TraceExport {
    provider: SdkTracerProvider,
    timeout: Duration,
    endpoint: String,
}

impl TraceExport {
    /// Builds the exporter. Export requests run as tasks on `runtime`, which must outlive
    /// [`TraceExport::shutdown`].
    pub fn start(
        cfg: &OtlpExportConfig,
        runtime: tokio::runtime::Handle,
    ) -> Result<TraceExport, String> {
        let client = OtlpHttpClient::new(runtime, cfg.export_timeout)?;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(cfg.endpoint.as_str())
            .with_timeout(cfg.export_timeout)
            .build()
            .map_err(|e| format!("tracing.otlp_endpoint: cannot build the OTLP exporter: {e}"))?;
        let batches = BatchConfigBuilder::default()
            .with_max_queue_size(cfg.max_queue_spans)
            .with_max_export_batch_size(cfg.max_batch_spans)
            .with_scheduled_delay(cfg.export_interval)
            .build();
        let processor = QueueGate {
            inner: BatchSpanProcessor::new(CountedExporter(exporter), batches),
            max: cfg.max_queue_spans,
        };
        let resource = Resource::builder()
            .with_service_name(cfg.service_name.clone())
            .with_attribute(opentelemetry::KeyValue::new(
                "service.version",
                env!("CARGO_PKG_VERSION"),
            ))
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                cfg.sample_ratio,
            ))))
            .with_resource(resource)
            .build();
        super::spans::exporting_on();
        Ok(TraceExport {
            provider,
            timeout: cfg.export_timeout,
            endpoint: cfg.endpoint.to_string(),
        })
    }

    /// The subscriber layer that turns marked spans into OpenTelemetry spans. It sees spans
    /// only, and only those that declare `otel.kind`; a span becomes an OpenTelemetry span
    /// lazily (entering it does nothing), so its parent can still be set once the request's
    /// body shows a `_meta.traceparent`.
    pub(super) fn layer(&self) -> BoxedLayer {
        let tracer = self.provider.tracer("mrtr-gateway");
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_context_activation(false)
            .with_tracked_inactivity(false)
            .with_location(false)
            .with_threads(false)
            .with_target(false)
            .with_filter(
                filter_fn(|m| m.is_span() && m.fields().field("otel.kind").is_some())
                    .with_max_level_hint(LevelFilter::INFO),
            )
            .boxed()
    }

    /// Where spans go (the endpoint carries no credentials: the config refuses them).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Exports what is queued, waiting at most the export timeout, and stops the exporter.
    pub fn shutdown(self) {
        let before = counters();
        let result = self.provider.shutdown_with_timeout(self.timeout);
        let after = counters();
        match result {
            Ok(()) => tracing::info!(
                exported = after.exported - before.exported,
                failed = after.failed - before.failed,
                "trace export flushed and stopped"
            ),
            Err(e) => tracing::warn!(
                error = %e,
                left = after.queued,
                "trace export did not finish its flush within tracing.export_timeout"
            ),
        }
    }
}

/// Bounds the spans waiting for export and counts those it refuses.
#[derive(Debug)]
struct QueueGate {
    inner: BatchSpanProcessor,
    max: usize,
}

impl SpanProcessor for QueueGate {
    fn on_start(&self, span: &mut Span, cx: &opentelemetry::Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        // Reserve a place first: the processor's own queue, of the same size, then never
        // fills, because every span in it holds a place here until its batch is taken.
        if QUEUED.fetch_add(1, Ordering::AcqRel) >= self.max {
            QUEUED.fetch_sub(1, Ordering::AcqRel);
            DROPPED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The OTLP exporter, counting what it is given and how each batch fared.
#[derive(Debug)]
struct CountedExporter(opentelemetry_otlp::SpanExporter);

impl SpanExporter for CountedExporter {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len();
        QUEUED.fetch_sub(n, Ordering::AcqRel);
        let result = self.0.export(batch).await;
        match &result {
            Ok(()) => {
                EXPORTED.fetch_add(n as u64, Ordering::Relaxed);
                if FAILING.swap(false, Ordering::Relaxed) {
                    tracing::info!("trace export works again");
                }
            }
            Err(e) => {
                FAILED.fetch_add(n as u64, Ordering::Relaxed);
                if !FAILING.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %e, spans = n, "trace export failed; spans are lost until it works again (mrtr_gateway_trace_spans_total{{result=\"failed\"}})");
                }
            }
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.0.set_resource(resource);
    }
}
