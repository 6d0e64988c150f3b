//! What the exported spans say, in one place: the request's server span and its legacy call's
//! client span.
//!
//! The request span exists only while export is on (`request`; the front makes it). It
//! carries the fields of the request's log lines (`request_id`, `instance_id`,
//! `call_target`, `round`, `path`, `parked`, kept for the lines in the request's context), and
//! the exporter turns it into an OpenTelemetry span with those fields as attributes under the
//! same names, so a trace and a log line can be matched. It adds the semantic-convention names
//! where one exists (`mcp.method.name`, `gen_ai.tool.name`, `gen_ai.prompt.name`,
//! `mcp.resource.uri`, `jsonrpc.request.id`, `http.response.status_code`, `error.type`,
//! `rpc.response.status_code`) and the `outcome`. Never arguments, answers, states or
//! credentials: only names, counts and the fixed reason labels.
//!
//! Every function here returns at once while export is off (after recording into the
//! request's context, for the log lines), so a gateway without `[tracing] otlp_endpoint` pays
//! one relaxed load per call.

use std::sync::atomic::{AtomicBool, Ordering};

use http::HeaderMap;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{Status, TraceContextExt};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use serde_json::Value;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::error::{Fault, Rejection};
use crate::request_id::RequestContext;

static EXPORTING: AtomicBool = AtomicBool::new(false);

pub(super) fn exporting_on() {
    EXPORTING.store(true, Ordering::Relaxed);
}

/// Whether spans are exported in this process.
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// W3C trace context read from the request's HTTP headers.
struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// W3C trace context read from `params._meta`, where 2026-07-28 clients may carry it.
struct Meta<'a>(&'a Value);

impl Extractor for Meta<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(Value::as_str)
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .as_object()
            .map(|m| m.keys().map(String::as_str).collect())
            .unwrap_or_default()
    }
}

/// The parent a `traceparent` (and `tracestate`) names, if it is a valid one.
fn parent_from(carrier: &dyn Extractor) -> Option<opentelemetry::Context> {
    let cx = TraceContextPropagator::new().extract(carrier);
    cx.span().span_context().is_valid().then_some(cx)
}

/// Marks the request span as the server span and, when the request's headers carry a
/// `traceparent`, makes it the parent. Called as the request arrives.
pub fn begin_server(span: &Span, headers: &HeaderMap) {
    if !exporting() {
        return;
    }
    span.record("otel.kind", "server");
    if let Some(cx) = parent_from(&Headers(headers)) {
        let _ = span.set_parent(cx);
    }
}

/// Names the server span for its JSON-RPC method and, when the headers had no
/// `traceparent`, takes the parent from `params._meta.traceparent` (the same precedence as
/// the trace context passed to the legacy server). Called once the body is parsed, before
/// the span has a child. `method` is the bounded method label (anything unknown is `other`).
pub fn name_server(
    span: &Span,
    headers: &HeaderMap,
    method: &'static str,
    id: &Value,
    params: Option<&Value>,
) {
    if !exporting() {
        return;
    }
    if parent_from(&Headers(headers)).is_none()
        && let Some(meta) = params.and_then(|p| p.get("_meta"))
        && let Some(cx) = parent_from(&Meta(meta))
    {
        let _ = span.set_parent(cx);
    }
    span.record("otel.name", method);
    span.set_attribute("mcp.method.name", method);
    match id {
        Value::String(s) => span.set_attribute("jsonrpc.request.id", s.clone()),
        Value::Number(n) => span.set_attribute("jsonrpc.request.id", n.to_string()),
        _ => {}
    }
}

/// The span name and the attribute for what a call is about: `tools/call get_weather`
/// (`gen_ai.tool.name`), `prompts/get greet` (`gen_ai.prompt.name`), `resources/read`
/// (`mcp.resource.uri`; a URI is not a low-cardinality name, so not in the span name).
fn describe_target(span: &Span, method: &str, target: &str) {
    let attribute = match method {
        "tools/call" => "gen_ai.tool.name",
        "prompts/get" => "gen_ai.prompt.name",
        "resources/read" => {
            span.set_attribute("mcp.resource.uri", target.to_string());
            return;
        }
        _ => return,
    };
    span.record("otel.name", format!("{method} {target}"));
    span.set_attribute(attribute, target.to_string());
}

/// How a request ended, on the server span: the HTTP status, the access line's `outcome`,
/// and for an error its reason label and JSON-RPC code. A 5xx marks the span failed (a 4xx
/// is the client's doing, not the server's failure).
pub fn end_server(span: &Span, status: u16, outcome: &str, error: Option<(&str, i64)>) {
    if !exporting() {
        return;
    }
    span.set_attribute("http.response.status_code", i64::from(status));
    span.set_attribute("outcome", outcome.to_string());
    if let Some((reason, code)) = error {
        span.set_attribute("error.type", reason.to_string());
        span.set_attribute("rpc.response.status_code", code.to_string());
        if status >= 500 {
            span.set_status(Status::error(reason.to_string()));
        }
    }
}

/// The request span, while export is on (a disabled span otherwise: nothing to enter, nothing
/// to record). Its parent is taken later ([`begin_server`], [`name_server`]).
pub fn request(cx: &RequestContext) -> Span {
    if !exporting() {
        return Span::none();
    }
    tracing::info_span!(
        "request",
        request_id = %cx.id(),
        instance_id = cx.instance_id(),
        call_target = tracing::field::Empty,
        round = tracing::field::Empty,
        path = tracing::field::Empty,
        parked = tracing::field::Empty,
        otel.kind = tracing::field::Empty,
        otel.name = tracing::field::Empty,
    )
}

/// The call's target (tool or prompt name, resource URI), in the request's context for its
/// log lines and on the server span.
pub fn call_target(span: &Span, method: &str, target: &str) {
    RequestContext::record(|r| r.call_target = Some(target.into()));
    if exporting() {
        span.record("call_target", target);
        describe_target(span, method, target);
    }
}

/// The round a call's request serves and how its legacy call began (`fresh`, `resumed` from
/// this replica's parking lot, `replayed`, `following`): in the request's context (its log
/// lines) and on the server span. Recorded from inside the request.
pub fn record_round(round: u32, path: &'static str) {
    RequestContext::record(|r| {
        r.round = Some(round);
        r.path = Some(path);
    });
    if exporting() {
        let span = Span::current();
        // As an i64: the exporter turns an unsigned field into text.
        span.record("round", i64::from(round));
        span.record("path", path);
    }
}

/// Whether the round ended with the legacy call parked here, in the request's context and
/// on the server span.
pub fn record_parked(parked: bool) {
    RequestContext::record(|r| r.parked = Some(parked));
    if exporting() {
        Span::current().record("parked", parked);
    }
}

/// The legacy call, as a client span under the current request span: from the moment the
/// engine takes the call in hand (resumed or sent) until this request's part of it ends. A
/// disabled span while export is off. It is never entered: log lines stay in the request's
/// context. `method` is the bounded method label.
pub fn legacy_call(method: &'static str, target: Option<&str>, transport: &'static str) -> Span {
    if !exporting() {
        return Span::none();
    }
    let span = tracing::info_span!(
        "legacy call",
        otel.kind = "client",
        otel.name = tracing::field::Empty,
        upstream.transport = transport,
    );
    span.record("otel.name", method);
    span.set_attribute("mcp.method.name", method);
    span.set_attribute(
        "network.transport",
        if transport == "stdio" { "pipe" } else { "tcp" },
    );
    if let Some(t) = target {
        describe_target(&span, method, t);
    }
    span
}

/// How the legacy call's part ended: a failure the legacy server or the gateway caused
/// marks the client span failed; any refusal is named by its reason label (`error.type`).
pub fn end_legacy(span: &Span, refused: Option<&Rejection>) {
    if !exporting() {
        return;
    }
    if let Some(rej) = refused {
        span.set_attribute("error.type", rej.reason());
        if rej.fault() != Fault::Client {
            span.set_status(Status::error(rej.reason()));
        }
    }
}
