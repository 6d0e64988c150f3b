//! A bare-bones Streamable HTTP client for the server's own tests: raw
//! hyper requests plus an incremental SSE reader that keeps the exact
//! bytes received, so framing can be asserted.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

/// Upper bound for any single wait in the tests.
pub(crate) const STEP: Duration = Duration::from_secs(2);

#[derive(Clone)]
pub(crate) struct TestClient {
    http: Client<HttpConnector, Full<Bytes>>,
    pub(crate) url: String,
    pub(crate) session: Option<String>,
    pub(crate) version: Option<String>,
}

/// One parsed SSE event.
#[derive(Debug, Clone, Default)]
pub(crate) struct SseEvent {
    pub(crate) id: Option<String>,
    pub(crate) event: Option<String>,
    pub(crate) data: String,
    pub(crate) retry: Option<u64>,
}

impl SseEvent {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap_or_else(|e| panic!("bad JSON {:?}: {e}", self.data))
    }

    pub(crate) fn is_priming(&self) -> bool {
        self.data.is_empty()
    }
}

/// Reads SSE events from a response body as they arrive.
pub(crate) struct SseReader {
    body: Incoming,
    buf: String,
    /// Everything received so far, verbatim.
    pub(crate) raw: String,
    ended: bool,
}

impl SseReader {
    pub(crate) fn new(response: Response<Incoming>) -> Self {
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers()["content-type"],
            "text/event-stream",
            "expected an SSE response"
        );
        SseReader {
            body: response.into_body(),
            buf: String::new(),
            raw: String::new(),
            ended: false,
        }
    }

    fn take_event(&mut self) -> Option<SseEvent> {
        let crlf = self.buf.find("\r\n\r\n").map(|i| (i, 4));
        let lf = self.buf.find("\n\n").map(|i| (i, 2));
        let (at, len) = match (crlf, lf) {
            (Some(a), Some(b)) => {
                if a.0 <= b.0 {
                    a
                } else {
                    b
                }
            }
            (a, b) => a.or(b)?,
        };
        let block: String = self.buf.drain(..at + len).collect();
        let mut event = SseEvent::default();
        let mut data_lines = Vec::new();
        for line in block.split('\n').map(|l| l.trim_end_matches('\r')) {
            if line.is_empty() {
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "id" => event.id = Some(value.to_owned()),
                "event" => event.event = Some(value.to_owned()),
                "data" => data_lines.push(value.to_owned()),
                "retry" => event.retry = value.parse().ok(),
                _ => {}
            }
        }
        event.data = data_lines.join("\n");
        Some(event)
    }

    /// The next event (priming events included), or `None` once the
    /// stream ended. Panics after `STEP` without one.
    pub(crate) async fn next_event(&mut self) -> Option<SseEvent> {
        self.next_event_within(STEP)
            .await
            .expect("timed out waiting for an SSE event")
    }

    /// `Err(())` on timeout, `Ok(None)` when the stream ended.
    pub(crate) async fn next_event_within(
        &mut self,
        limit: Duration,
    ) -> Result<Option<SseEvent>, ()> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(event) = self.take_event() {
                return Ok(Some(event));
            }
            if self.ended {
                return Ok(None);
            }
            match tokio::time::timeout_at(deadline, self.body.frame()).await {
                Err(_) => return Err(()),
                Ok(None) | Ok(Some(Err(_))) => self.ended = true,
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        let text = String::from_utf8_lossy(&data);
                        self.buf.push_str(&text);
                        self.raw.push_str(&text);
                    }
                }
            }
        }
    }

    /// The next JSON message, skipping priming events.
    pub(crate) async fn next_message(&mut self) -> Option<Value> {
        loop {
            let event = self.next_event().await?;
            if !event.is_priming() {
                return Some(event.json());
            }
        }
    }

    /// Assert the stream ends (within `STEP`) without further messages.
    pub(crate) async fn expect_end(&mut self) {
        while let Some(event) = self.next_event().await {
            assert!(event.is_priming(), "unexpected event {event:?}");
        }
    }
}

impl TestClient {
    pub(crate) fn new(url: String) -> Self {
        TestClient {
            http: Client::builder(TokioExecutor::new()).build_http(),
            url,
            session: None,
            version: None,
        }
    }

    fn builder(&self, method: &str) -> http::request::Builder {
        let mut b = Request::builder().method(method).uri(&self.url);
        if let Some(s) = &self.session {
            b = b.header("mcp-session-id", s);
        }
        if let Some(v) = &self.version {
            b = b.header("mcp-protocol-version", v);
        }
        b
    }

    pub(crate) async fn send(&self, request: Request<Full<Bytes>>) -> Response<Incoming> {
        tokio::time::timeout(STEP, self.http.request(request))
            .await
            .expect("HTTP request timed out")
            .expect("HTTP request failed")
    }

    /// POST a JSON-RPC message with the usual MCP headers.
    pub(crate) async fn post(&self, message: &Value) -> Response<Incoming> {
        let request = self
            .builder("POST")
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(Full::new(Bytes::from(message.to_string())))
            .unwrap();
        self.send(request).await
    }

    /// POST a request and return its single answer, whether it came as JSON
    /// or as an SSE stream.
    pub(crate) async fn call(&self, message: &Value) -> Value {
        let response = self.post(message).await;
        assert_eq!(response.status(), StatusCode::OK);
        if response.headers()["content-type"] == "application/json" {
            return json_body(response).await;
        }
        let mut sse = SseReader::new(response);
        sse.next_message()
            .await
            .expect("stream ended without a message")
    }

    pub(crate) async fn initialize_with(&mut self, version: &str, capabilities: Value) -> Value {
        let response = self
            .post(&json!({
                "jsonrpc": "2.0", "id": 0, "method": "initialize",
                "params": {
                    "protocolVersion": version,
                    "capabilities": capabilities,
                    "clientInfo": {"name": "test-client", "version": "0"},
                },
            }))
            .await;
        assert_eq!(response.status(), StatusCode::OK);
        self.session = response
            .headers()
            .get("mcp-session-id")
            .map(|v| v.to_str().unwrap().to_owned());
        let answer = if response.headers()["content-type"] == "application/json" {
            json_body(response).await
        } else {
            SseReader::new(response).next_message().await.unwrap()
        };
        self.version = answer["result"]["protocolVersion"]
            .as_str()
            .map(str::to_owned);
        let status = self
            .post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await
            .status();
        assert_eq!(status, StatusCode::ACCEPTED);
        answer
    }

    /// Initialize with every client capability declared.
    pub(crate) async fn initialize(&mut self) -> Value {
        self.initialize_with(
            "2025-11-25",
            json!({"elicitation": {"form": {}, "url": {}}, "sampling": {}, "roots": {"listChanged": true}}),
        )
        .await
    }

    /// POST the answer to a server request; expects 202.
    pub(crate) async fn answer(&self, id: &Value, result: Value) {
        let response = self
            .post(&json!({"jsonrpc": "2.0", "id": id, "result": result}))
            .await;
        assert_eq!(response.status(), StatusCode::ACCEPTED);
    }

    pub(crate) async fn open_get(&self) -> Response<Incoming> {
        let request = self
            .builder("GET")
            .header("accept", "text/event-stream")
            .body(Full::new(Bytes::new()))
            .unwrap();
        self.send(request).await
    }

    pub(crate) async fn resume(&self, last_event_id: &str) -> Response<Incoming> {
        let request = self
            .builder("GET")
            .header("accept", "text/event-stream")
            .header("last-event-id", last_event_id)
            .body(Full::new(Bytes::new()))
            .unwrap();
        self.send(request).await
    }

    pub(crate) async fn delete(&self) -> StatusCode {
        let request = self
            .builder("DELETE")
            .body(Full::new(Bytes::new()))
            .unwrap();
        self.send(request).await.status()
    }
}

pub(crate) async fn json_body(response: Response<Incoming>) -> Value {
    let bytes = tokio::time::timeout(STEP, response.into_body().collect())
        .await
        .expect("body timed out")
        .expect("body failed")
        .to_bytes();
    serde_json::from_slice(&bytes).expect("JSON body")
}

pub(crate) fn tool_call(id: i64, name: &str, arguments: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": name, "arguments": arguments}})
}

/// The text of the first content block of a tool result message.
pub(crate) fn result_text(message: &Value) -> &str {
    message["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text in {message}"))
}
