//! The gateway's log lines, written by its own formatter.
//!
//! A line names the request it was written in from the request's context
//! ([`RequestContext`], a task-local), not from a `tracing` span. So a request needs no span
//! of its own unless its trace is exported, and a line costs one pass over its fields into the
//! writer's buffer: `tracing-subscriber`'s JSON formatter, fed from a span, kept the span's
//! fields as JSON text and parsed that text back into a map twice for every line
//! (docs/performance.md has the measured cost).
//!
//! The JSON lines have the shape `tracing-subscriber`'s JSON formatter gives them with the
//! current span and the span list, as if the request were the span `request` holding the
//! context's fields (keys sorted, `name` last): log pipelines built on the earlier lines read
//! these unchanged. The test below formats the same events both ways and compares them byte
//! for byte. Text lines follow `tracing-subscriber`'s full text format, without colours.

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_log::NormalizeEvent;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use super::LogFormat;
use crate::request_id::{Recorded, RequestContext};

/// Formats events as the gateway's JSON or text lines (`log.format`).
#[derive(Debug, Clone, Copy)]
pub struct Lines {
    format: LogFormat,
    timestamps: bool,
}

impl Lines {
    pub fn new(format: LogFormat) -> Lines {
        Lines {
            format,
            timestamps: true,
        }
    }

    /// Lines without their timestamp (the tests compare lines).
    #[cfg(test)]
    fn without_time(self) -> Lines {
        Lines {
            timestamps: false,
            ..self
        }
    }
}

impl<S, N> FormatEvent<S, N> for Lines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        // A `log` record reaches `tracing` as an event of target `log`; its own level, target
        // and place are in its fields.
        let normalized = event.normalized_metadata();
        let meta = normalized.as_ref().unwrap_or_else(|| event.metadata());
        match self.format {
            LogFormat::Json => {
                writer.write_char('{')?;
                if self.timestamps {
                    writer.write_str("\"timestamp\":\"")?;
                    super::timestamp::write_now(&mut writer)?;
                    writer.write_str("\",")?;
                }
                writer.write_str("\"level\":\"")?;
                writer.write_str(meta.level().as_str())?;
                writer.write_str("\",\"fields\":{")?;
                Fields::write(&mut writer, LogFormat::Json, event)?;
                writer.write_str("},\"target\":")?;
                json_str(&mut writer, meta.target())?;
                RequestContext::with_current(|cx, recorded| {
                    // The same object twice: as the current span and as the span list.
                    let mut span = String::with_capacity(128);
                    json_span(&mut span, cx, recorded)?;
                    writer.write_str(",\"span\":")?;
                    writer.write_str(&span)?;
                    writer.write_str(",\"spans\":[")?;
                    writer.write_str(&span)?;
                    writer.write_char(']')
                })
                .unwrap_or(Ok(()))?;
                writer.write_str("}\n")
            }
            LogFormat::Text => {
                if self.timestamps {
                    super::timestamp::write_now(&mut writer)?;
                    writer.write_char(' ')?;
                }
                write!(writer, "{:>5} ", meta.level().as_str())?;
                RequestContext::with_current(|cx, recorded| text_span(&mut writer, cx, recorded))
                    .unwrap_or(Ok(()))?;
                writer.write_str(meta.target())?;
                writer.write_str(": ")?;
                Fields::write(&mut writer, LogFormat::Text, event)?;
                writer.write_char('\n')
            }
        }
    }
}

/// The request as the JSON formatter wrote its span: the fields in key order, then `name`.
fn json_span(out: &mut dyn fmt::Write, cx: &RequestContext, r: &Recorded) -> fmt::Result {
    out.write_char('{')?;
    if let Some(t) = &r.call_target {
        out.write_str("\"call_target\":")?;
        json_str(out, t)?;
        out.write_char(',')?;
    }
    out.write_str("\"instance_id\":")?;
    json_str(out, cx.instance_id())?;
    out.write_char(',')?;
    if let Some(p) = r.parked {
        write!(out, "\"parked\":{p},")?;
    }
    if let Some(p) = r.path {
        out.write_str("\"path\":")?;
        json_str(out, p)?;
        out.write_char(',')?;
    }
    out.write_str("\"request_id\":")?;
    json_str(out, cx.id().as_str())?;
    out.write_char(',')?;
    if let Some(n) = r.round {
        write!(out, "\"round\":{n},")?;
    }
    out.write_str("\"name\":\"request\"}")
}

/// The request as the text formatter wrote its span: `request{request_id=… …}: `.
fn text_span(out: &mut Writer<'_>, cx: &RequestContext, r: &Recorded) -> fmt::Result {
    write!(
        out,
        "request{{request_id={} instance_id={}",
        cx.id(),
        cx.instance_id()
    )?;
    if let Some(t) = &r.call_target {
        write!(out, " call_target={t:?}")?;
    }
    if let Some(n) = r.round {
        write!(out, " round={n}")?;
    }
    if let Some(p) = r.path {
        write!(out, " path={p:?}")?;
    }
    if let Some(p) = r.parked {
        write!(out, " parked={p}")?;
    }
    out.write_str("}: ")
}

/// `s` as a JSON string, escaped as `serde_json` escapes it.
fn json_str(out: &mut dyn fmt::Write, s: &str) -> fmt::Result {
    out.write_char('"')?;
    Escaped(out).write_str(s)?;
    out.write_char('"')
}

/// Escapes what is written through it for the inside of a JSON string.
struct Escaped<'a>(&'a mut dyn fmt::Write);

impl fmt::Write for Escaped<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let bytes = s.as_bytes();
        let mut start = 0;
        for (i, &b) in bytes.iter().enumerate() {
            let escape = match b {
                b'"' => "\\\"",
                b'\\' => "\\\\",
                b'\n' => "\\n",
                b'\r' => "\\r",
                b'\t' => "\\t",
                0x08 => "\\b",
                0x0c => "\\f",
                0..=0x1f => "",
                _ => continue,
            };
            // Control and ASCII bytes are whole characters: `i` is a character boundary.
            self.0.write_str(&s[start..i])?;
            if escape.is_empty() {
                write!(self.0, "\\u{b:04x}")?;
            } else {
                self.0.write_str(escape)?;
            }
            start = i + 1;
        }
        self.0.write_str(&s[start..])
    }
}

/// An event's fields, in the order they were recorded: as the members of a JSON object, or
/// as the text formatter writes them (the message, then `name=value` with strings quoted; a
/// `log` record's own place fields left out).
struct Fields<'w, 'a> {
    out: &'w mut Writer<'a>,
    format: LogFormat,
    first: bool,
    result: fmt::Result,
}

impl<'w, 'a> Fields<'w, 'a> {
    fn write(out: &'w mut Writer<'a>, format: LogFormat, event: &Event<'_>) -> fmt::Result {
        let mut fields = Fields {
            out,
            format,
            first: true,
            result: Ok(()),
        };
        event.record(&mut fields);
        fields.result
    }

    /// Writes one field after the separator the format puts between fields.
    fn field(&mut self, value: impl FnOnce(&mut Writer<'_>) -> fmt::Result) {
        if self.result.is_err() {
            return;
        }
        let separator = match self.format {
            LogFormat::Json => ',',
            LogFormat::Text => ' ',
        };
        self.result = (|| {
            if !std::mem::take(&mut self.first) {
                self.out.write_char(separator)?;
            }
            value(self.out)
        })();
    }

    /// A JSON member `"name":value`.
    fn member(&mut self, field: &Field, value: impl FnOnce(&mut Writer<'_>) -> fmt::Result) {
        self.field(|o| {
            json_str(o, field.name())?;
            o.write_char(':')?;
            value(o)
        });
    }

    /// A number or boolean: bare in JSON, as its `Debug` form in text.
    fn plain(&mut self, field: &Field, value: &(impl fmt::Display + fmt::Debug)) {
        match self.format {
            LogFormat::Json => self.member(field, |o| write!(o, "{value}")),
            LogFormat::Text => self.record_debug(field, value),
        }
    }
}

impl Visit for Fields<'_, '_> {
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.plain(field, &value);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.plain(field, &value);
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.plain(field, &value);
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        match self.format {
            // As serde_json writes a float: shortest round-trip digits, `null` when not finite.
            LogFormat::Json => self.member(field, |o| match serde_json::Number::from_f64(value) {
                Some(n) => write!(o, "{n}"),
                None => o.write_str("null"),
            }),
            LogFormat::Text => self.record_debug(field, &value),
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        match self.format {
            LogFormat::Json => self.member(field, |o| json_str(o, value)),
            LogFormat::Text if field.name() == "message" => {
                self.record_debug(field, &format_args!("{value}"))
            }
            LogFormat::Text => self.record_debug(field, &value),
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        match self.format {
            LogFormat::Json => self.member(field, |o| {
                o.write_char('"')?;
                write!(Escaped(o), "{value:?}")?;
                o.write_char('"')
            }),
            LogFormat::Text if field.name().starts_with("log.") => {}
            LogFormat::Text => self.field(|o| match field.name() {
                "message" => write!(o, "{value:?}"),
                name => write!(o, "{}={value:?}", name.trim_start_matches("r#")),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;

    use super::*;
    use crate::request_id::RequestId;

    #[derive(Clone, Default)]
    struct Out(Arc<Mutex<Vec<u8>>>);

    impl Write for Out {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Out {
        type Writer = Out;
        fn make_writer(&'a self) -> Out {
            self.clone()
        }
    }

    impl Out {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    /// Events outside any request, with every kind of field value.
    fn outside() {
        tracing::info!(listen = "127.0.0.1:1", n = 3u64, "started");
        tracing::warn!(
            detail = "a \"quoted\"\n\ttext \u{1} \\ é",
            code = -32603i64,
            ms = 0.25f64,
            whole = 2.0f64,
            nan = f64::NAN,
            ok = false,
            err = %std::io::Error::other("disk \"full\""),
            dbg = ?vec!["x"],
            "the legacy server failed"
        );
    }

    /// Events in a request as its fields are recorded (through `record`): the target, the
    /// round and path, then `parked`.
    fn inside(record: &dyn Fn(Recorded)) {
        tracing::info!(n = 1u64, "before any field");
        record(Recorded {
            call_target: Some("echo \"quoted\"".into()),
            ..Default::default()
        });
        tracing::debug!(server_request_id = 7u64, "legacy server request");
        record(Recorded {
            round: Some(2),
            path: Some("resumed"),
            ..Default::default()
        });
        record(Recorded {
            parked: Some(true),
            ..Default::default()
        });
        tracing::info!(
            method = "tools/call",
            outcome = "complete",
            duration_ms = 1.5f64,
            "request done"
        );
    }

    /// Copies what `from` holds into `to` (a later record never unsets an earlier field).
    fn merge(to: &mut Recorded, from: Recorded) {
        if from.call_target.is_some() {
            to.call_target = from.call_target;
        }
        to.round = from.round.or(to.round);
        to.path = from.path.or(to.path);
        to.parked = from.parked.or(to.parked);
    }

    /// The lines `tracing-subscriber`'s own JSON formatter writes for the events when the
    /// request is a span holding the same fields.
    fn theirs(id: &str) -> String {
        let out = Out::default();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_current_span(true)
            .with_max_level(tracing::Level::DEBUG)
            .without_time()
            .with_writer(out.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            outside();
            let span = tracing::info_span!(
                "request",
                request_id = id,
                instance_id = "i1",
                call_target = tracing::field::Empty,
                round = tracing::field::Empty,
                path = tracing::field::Empty,
                parked = tracing::field::Empty,
            );
            span.in_scope(|| {
                inside(&|r: Recorded| {
                    if let Some(t) = &r.call_target {
                        span.record("call_target", &**t);
                    }
                    if let Some(n) = r.round {
                        span.record("round", i64::from(n));
                    }
                    if let Some(p) = r.path {
                        span.record("path", p);
                    }
                    if let Some(p) = r.parked {
                        span.record("parked", p);
                    }
                })
            });
        });
        out.text()
    }

    /// The lines [`Lines`] writes for the events in `format`, the request a context.
    fn ours(format: LogFormat, cx: &Arc<RequestContext>) -> String {
        let out = Out::default();
        let subscriber = tracing_subscriber::fmt()
            .event_format(Lines::new(format).without_time())
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(out.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            outside();
            cx.in_scope(|| inside(&|r| RequestContext::record(|to| merge(to, r))));
        });
        out.text()
    }

    fn context() -> Arc<RequestContext> {
        RequestContext::new(RequestId::new(), "i1".into())
    }

    #[test]
    fn json_lines_are_the_ones_tracing_subscriber_wrote() {
        let cx = context();
        let ours = ours(LogFormat::Json, &cx);
        assert_eq!(ours, theirs(cx.id().as_str()));
        // The comparison means something only if the fields reached the lines.
        let lines: Vec<&str> = ours.lines().collect();
        assert_eq!(lines.len(), 5, "{ours}");
        assert!(!lines[1].contains(r#""span""#), "{}", lines[1]);
        assert!(lines[1].contains(r#""detail":"a \"quoted\"\n\ttext \u0001 \\ é""#));
        assert!(lines[1].contains(r#""nan":null"#), "{}", lines[1]);
        let id = format!(r#""request_id":"{}""#, cx.id());
        assert!(lines[2].contains(&id), "{}", lines[2]);
        assert!(lines[4].contains(r#""round":2"#), "{}", lines[4]);
        assert!(lines[4].contains(r#""parked":true"#), "{}", lines[4]);
        assert!(lines[4].contains(r#""call_target":"echo \"quoted\"""#));
    }

    #[test]
    fn every_line_parses_as_json() {
        for line in ours(LogFormat::Json, &context()).lines() {
            let v: serde_json::Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
            assert!(v["fields"]["message"].is_string(), "{line}");
        }
    }

    #[test]
    fn text_lines_name_the_request_and_its_fields() {
        let cx = context();
        let text = ours(LogFormat::Text, &cx);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5, "{text}");
        let target = module_path!();
        assert_eq!(
            lines[0],
            format!(" INFO {target}: started listen=\"127.0.0.1:1\" n=3")
        );
        assert!(!lines[1].contains("request{"), "{}", lines[1]);
        assert_eq!(
            lines[4],
            format!(
                " INFO request{{request_id={} instance_id=i1 call_target=\"echo \\\"quoted\\\"\" \
                 round=2 path=\"resumed\" parked=true}}: {target}: \
                 request done method=\"tools/call\" outcome=\"complete\" duration_ms=1.5",
                cx.id()
            )
        );
    }

    #[test]
    fn escaping_matches_serde_json() {
        let all: String = (0u8..0x80).map(char::from).chain("é€😀".chars()).collect();
        let mut ours = String::new();
        json_str(&mut ours, &all).unwrap();
        assert_eq!(ours, serde_json::to_string(&all).unwrap());
    }
}
