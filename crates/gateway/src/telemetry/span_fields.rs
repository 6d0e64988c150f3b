//! How a span's fields are kept for the JSON log lines.
//!
//! The JSON line format stores each span's fields as the text of a JSON object and, for every
//! field recorded after the span was created, `tracing-subscriber`'s own `JsonFields` parses
//! that text back into a map, adds the field, and writes the whole object again. The request
//! span records four fields after it starts (`call_target`, `round`, `path`, `parked`), so
//! every request paid four parse-and-write cycles for a line it writes once.
//!
//! [`SpanFields`] writes the first fields exactly as `JsonFields` does and *appends* later
//! ones to the object's text. A field recorded twice is then in the text twice; the line
//! formatter reads the text into a map, where the later value wins, so a line says what it
//! said with `JsonFields`, byte for byte (the test below checks).

use std::fmt;

use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::FormattedFields;
use tracing_subscriber::fmt::format::{JsonFields, Writer};

/// Span fields as one JSON object, appended to rather than rewritten.
#[derive(Debug, Default, Clone, Copy)]
pub struct SpanFields;

impl<'a> FormatFields<'a> for SpanFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'_>, fields: R) -> fmt::Result {
        JsonFields::new().format_fields(writer, fields)
    }

    fn add_fields(
        &self,
        current: &'a mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        let mut more = String::new();
        JsonFields::new().format_fields(Writer::new(&mut more), fields)?;
        append_members(&mut current.fields, &more);
        Ok(())
    }
}

/// Adds the members of the JSON object `more` to the JSON object `current` (either may be
/// empty text or `{}`).
fn append_members(current: &mut String, more: &str) {
    let members = more
        .strip_prefix('{')
        .and_then(|m| m.strip_suffix('}'))
        .unwrap_or_default();
    if members.is_empty() {
        return;
    }
    match current.strip_suffix('}') {
        Some(head) if head.len() > 1 => {
            current.pop();
            current.push(',');
        }
        _ => {
            current.clear();
            current.push('{');
        }
    }
    current.push_str(members);
    current.push('}');
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;

    use super::*;

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Lines {
        type Writer = Lines;
        fn make_writer(&'a self) -> Lines {
            self.clone()
        }
    }

    /// What a request's span and its access line look like: fields at creation, fields
    /// recorded later (one twice, one empty record), a nested span, an event in each.
    fn request_lines() {
        let span = tracing::info_span!(
            "request",
            request_id = "r1",
            instance_id = "i1",
            call_target = tracing::field::Empty,
            round = tracing::field::Empty,
            path = tracing::field::Empty,
            parked = tracing::field::Empty,
        );
        let _in = span.enter();
        span.record("call_target", "echo \"quoted\"");
        span.record("round", 1i64);
        span.record("path", "fresh");
        span.record("round", 2i64);
        tracing::info!(method = "tools/call", "inside");
        let child = tracing::info_span!("legacy call", upstream.transport = "http");
        child.in_scope(|| tracing::warn!("in the child"));
        span.record("parked", true);
        tracing::info!(method = "tools/call", outcome = "complete", "request done");
    }

    fn lines_with<N>(fields: N) -> String
    where
        N: for<'w> FormatFields<'w> + Send + Sync + 'static,
    {
        let out = Lines::default();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_current_span(true)
            .fmt_fields(fields)
            .without_time()
            .with_writer(out.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, request_lines);
        String::from_utf8(out.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn lines_are_the_ones_json_fields_writes() {
        let ours = lines_with(SpanFields);
        let theirs = lines_with(JsonFields::new());
        assert_eq!(ours, theirs);
        // The comparison means something only if later fields reached the lines.
        let last = ours.lines().last().unwrap();
        assert!(last.contains(r#""round":2"#), "{last}");
        assert!(last.contains(r#""parked":true"#), "{last}");
        assert!(
            last.contains(r#""call_target":"echo \"quoted\"""#),
            "{last}"
        );
        assert_eq!(ours.lines().count(), 3);
    }

    #[test]
    fn members_are_appended_to_empty_and_filled_objects() {
        let mut s = String::new();
        append_members(&mut s, "{}");
        assert_eq!(s, "");
        append_members(&mut s, r#"{"a":1}"#);
        assert_eq!(s, r#"{"a":1}"#);
        append_members(&mut s, r#"{"b":"}","c":[1]}"#);
        assert_eq!(s, r#"{"a":1,"b":"}","c":[1]}"#);
        let mut e = String::from("{}");
        append_members(&mut e, r#"{"x":true}"#);
        assert_eq!(e, r#"{"x":true}"#);
    }
}
