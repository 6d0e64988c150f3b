//! The gateway's log lines, captured in-process in its own line format (one subscriber per
//! test process, installed on first use), so a test can check what the log says and what the
//! client did not hear: `capture()` at the start of a test, then `warn_lines(request_id)`.

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

use mrtr_gateway::telemetry::{Lines, LogFormat};
use serde_json::Value;

/// Log output kept in memory: a writer for a `tracing_subscriber` (clones share the bytes).
#[derive(Clone, Default)]
pub struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl LogBuffer {
    /// What was written so far, line by line.
    pub fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// The access lines (`request done`) that contain `part`.
    pub fn access_lines(&self, part: &str) -> Vec<String> {
        self.lines()
            .into_iter()
            .filter(|l| l.contains("request done") && l.contains(part))
            .collect()
    }
}

impl Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The gateway's text log lines at INFO and above, for the calling thread only, until the
/// guard is dropped (a `current_thread` test sees every task of its runtime this way).
pub fn on_this_thread() -> (LogBuffer, tracing::subscriber::DefaultGuard) {
    let logs = LogBuffer::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .event_format(Lines::new(LogFormat::Text))
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || writer.clone())
        .finish();
    (logs, tracing::subscriber::set_default(subscriber))
}

static BUFFER: OnceLock<LogBuffer> = OnceLock::new();

/// Starts capturing (idempotent). The gateway's JSON lines at WARN and above are kept.
pub fn capture() {
    BUFFER.get_or_init(|| {
        let buffer = LogBuffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .event_format(Lines::new(LogFormat::Json))
            .with_max_level(tracing::Level::WARN)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber)
            .expect("no other global subscriber in this test process");
        buffer
    });
}

/// Every captured line, parsed.
pub fn lines() -> Vec<Value> {
    let buffer = BUFFER.get().expect("logs::capture() was called");
    let bytes = buffer.0.lock().unwrap().clone();
    String::from_utf8_lossy(&bytes)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The WARN lines of the request `request_id` (the id in the line's fields or its span), each
/// as its message and its `detail` field.
pub fn warn_lines(request_id: &str) -> Vec<String> {
    lines()
        .into_iter()
        .filter(|l| l["level"] == "WARN")
        .filter(|l| {
            l["fields"]["request_id"] == request_id || l["span"]["request_id"] == request_id
        })
        .map(|l| {
            let field = |k: &str| l["fields"][k].as_str().unwrap_or_default().to_string();
            format!("{} | {}", field("message"), field("detail"))
        })
        .collect()
}

/// The request id a client was given in `error.data.requestId`.
pub fn request_id_of(error: &Value) -> String {
    error["data"]["requestId"]
        .as_str()
        .unwrap_or_else(|| panic!("no error.data.requestId in {error}"))
        .to_string()
}

/// The WARN lines of the request whose error is `error`, after checking the client's error
/// does not contain `detail` and some WARN line with the same request id does.
pub fn assert_detail_logged_not_told(error: &Value, detail: &str) -> Vec<String> {
    let told = error.to_string();
    assert!(
        !told.contains(detail),
        "the client was told {detail:?}: {told}"
    );
    let id = request_id_of(error);
    let warned = warn_lines(&id);
    assert!(
        warned.iter().any(|l| l.contains(detail)),
        "no WARN line with request_id {id} holds {detail:?}: {warned:#?}"
    );
    warned
}
