//! A small 2026-07-28 MCP client over Streamable HTTP, for the demo, tests and load tools.
//!
//! It sends one JSON-RPC request per POST with the required headers and `_meta`, accepts a
//! JSON or SSE answer, and can drive the MRTR loop with a caller-supplied answerer. It is
//! deliberately explicit: every exchange is returned whole (status, notifications, final
//! message), so tests can check each round's shape.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Map, Value, json};

use mrtr_wire::protocol::meta::{CLIENT_CAPABILITIES, CLIENT_INFO, PROTOCOL_VERSION};
use mrtr_wire::protocol::{MODERN_VERSION, header_value};
use mrtr_wire::sse::SseDecoder;

/// One HTTP exchange with the gateway.
#[derive(Debug, Clone)]
pub struct Exchange {
    pub status: StatusCode,
    pub headers: HeaderMap,
    /// Whether the answer came as an SSE stream.
    pub streamed: bool,
    /// Notifications that came before the final message (SSE only).
    pub notifications: Vec<Value>,
    /// The final JSON-RPC message, if the body held one.
    pub message: Option<Value>,
    pub raw_body: Bytes,
}

impl Exchange {
    pub fn result(&self) -> Option<&Value> {
        self.message.as_ref().and_then(|m| m.get("result"))
    }

    pub fn error(&self) -> Option<&Value> {
        self.message.as_ref().and_then(|m| m.get("error"))
    }

    pub fn error_code(&self) -> Option<i64> {
        self.error()
            .and_then(|e| e.get("code"))
            .and_then(Value::as_i64)
    }

    pub fn result_type(&self) -> Option<&str> {
        self.result()
            .and_then(|r| r.get("resultType"))
            .and_then(Value::as_str)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("HTTP: {0}")]
    Http(String),
    #[error("timed out")]
    Timeout,
    #[error("the server broke the protocol: {0}")]
    Protocol(String),
    #[error("MRTR loop exceeded {0} rounds")]
    TooManyRounds(u32),
    #[error("the answerer refused: {0}")]
    Answerer(String),
}

pub struct ModernClient {
    http: Client<HttpConnector, Full<Bytes>>,
    url: http::Uri,
    next_id: std::sync::atomic::AtomicI64,
    pub capabilities: Value,
    pub timeout: Duration,
    /// Extra headers for every request (e.g. `Authorization`).
    pub headers: HeaderMap,
}

/// Answers one `inputRequests` entry: `(key, request) -> response`.
pub type Answerer<'a> = dyn FnMut(&str, &Value) -> Result<Value, String> + Send + 'a;

/// What one MRTR round looked like, for the demo's printout and for tests.
#[derive(Debug, Clone)]
pub struct Round {
    pub input_requests: Map<String, Value>,
    pub request_state_len: usize,
    pub exchange: Exchange,
}

impl ModernClient {
    pub fn new(url: &str) -> ModernClient {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        ModernClient {
            http: Client::builder(TokioExecutor::new()).build(connector),
            url: url.parse().expect("a valid URL"),
            next_id: std::sync::atomic::AtomicI64::new(1),
            capabilities: json!({"elicitation": {"form": {}}, "sampling": {}, "roots": {}}),
            timeout: Duration::from_secs(30),
            headers: HeaderMap::new(),
        }
    }

    /// The same client, connecting from `local` (tests: anonymous callers told apart by
    /// their source address, e.g. 127.0.0.2).
    pub fn from_local_address(mut self, local: std::net::IpAddr) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_local_address(Some(local));
        self.http = Client::builder(TokioExecutor::new()).build(connector);
        self
    }

    pub fn with_capabilities(mut self, caps: Value) -> Self {
        self.capabilities = caps;
        self
    }

    pub fn next_id(&self) -> i64 {
        self.next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// Builds `params` with the required `_meta` merged in.
    pub fn params_with_meta(&self, params: Value) -> Value {
        let mut p = params.as_object().cloned().unwrap_or_default();
        let meta = p
            .entry("_meta")
            .or_insert_with(|| Value::Object(Map::new()))
            .as_object_mut()
            .expect("_meta is an object");
        meta.entry(PROTOCOL_VERSION)
            .or_insert(json!(MODERN_VERSION));
        meta.entry(CLIENT_CAPABILITIES)
            .or_insert(self.capabilities.clone());
        meta.entry(CLIENT_INFO).or_insert(
            json!({"name": "mrtr-gateway-client", "version": env!("CARGO_PKG_VERSION")}),
        );
        Value::Object(p)
    }

    /// The routing headers a conforming client sends for `body`.
    pub fn routing_headers(body: &Value) -> HeaderMap {
        let mut h = HeaderMap::new();
        let method = body
            .get("method")
            .and_then(Value::as_str)
            .unwrap_or_default();
        h.insert(
            HeaderName::from_static("mcp-protocol-version"),
            HeaderValue::from_static(MODERN_VERSION),
        );
        if let Ok(v) = HeaderValue::from_str(method) {
            h.insert(HeaderName::from_static("mcp-method"), v);
        }
        let member = match method {
            "tools/call" | "prompts/get" => Some("name"),
            "resources/read" => Some("uri"),
            "tasks/get" | "tasks/update" | "tasks/cancel" => Some("taskId"),
            _ => None,
        };
        if let Some(name) = member
            .and_then(|m| body.pointer(&format!("/params/{m}")))
            .and_then(Value::as_str)
            && let Ok(v) = HeaderValue::from_str(&header_value::encode(name))
        {
            h.insert(HeaderName::from_static("mcp-name"), v);
        }
        h
    }

    /// Sends a request built from `method` and `params` (with `_meta` added).
    pub async fn request(&self, method: &str, params: Value) -> Result<Exchange, ClientError> {
        let body = json!({
            "jsonrpc": "2.0",
            "id": self.next_id(),
            "method": method,
            "params": self.params_with_meta(params),
        });
        let headers = Self::routing_headers(&body);
        self.send_raw(
            Method::POST,
            headers,
            serde_json::to_vec(&body).expect("serializes").into(),
        )
        .await
    }

    /// Sends any bytes with any headers (plus content type / accept / client headers).
    pub async fn send_raw(
        &self,
        method: Method,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<Exchange, ClientError> {
        let mut req = Request::builder()
            .method(method)
            .uri(self.url.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json, text/event-stream")
            .body(Full::new(body))
            .expect("valid request");
        for (k, v) in &self.headers {
            req.headers_mut().insert(k.clone(), v.clone());
        }
        for (k, v) in &headers {
            req.headers_mut().insert(k.clone(), v.clone());
        }
        let fut = async {
            let resp = self
                .http
                .request(req)
                .await
                .map_err(|e| ClientError::Http(e.to_string()))?;
            let status = resp.status();
            let headers = resp.headers().clone();
            let streamed = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/event-stream"));
            let raw_body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| ClientError::Http(e.to_string()))?
                .to_bytes();
            let mut notifications = Vec::new();
            let mut message = None;
            if streamed {
                let mut dec = SseDecoder::new(64 << 20, 1 << 30);
                let mut events = Vec::new();
                dec.feed(&raw_body, &mut events)
                    .map_err(|e| ClientError::Protocol(e.to_string()))?;
                dec.feed(b"\n\n", &mut events)
                    .map_err(|e| ClientError::Protocol(e.to_string()))?;
                for ev in events {
                    if ev.data.is_empty() {
                        continue;
                    }
                    let v: Value = serde_json::from_str(&ev.data)
                        .map_err(|e| ClientError::Protocol(format!("bad SSE JSON: {e}")))?;
                    if v.get("id").is_some() && v.get("method").is_none() {
                        message = Some(v);
                    } else {
                        notifications.push(v);
                    }
                }
            } else if !raw_body.is_empty() {
                message = serde_json::from_slice(&raw_body).ok();
            }
            Ok(Exchange {
                status,
                headers,
                streamed,
                notifications,
                message,
                raw_body,
            })
        };
        tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| ClientError::Timeout)?
    }

    /// Sends a request built from `method` and `params` (with `_meta` added) and returns the
    /// answer as it arrives, for long-lived SSE responses such as `subscriptions/listen`.
    pub async fn open_stream(
        &self,
        method: &str,
        params: Value,
    ) -> Result<EventStream, ClientError> {
        let id = self.next_id();
        let body = json!({
            "jsonrpc": "2.0",
            "id": id,
            "method": method,
            "params": self.params_with_meta(params),
        });
        let headers = Self::routing_headers(&body);
        let mut stream = self
            .open_raw_stream(
                Method::POST,
                headers,
                serde_json::to_vec(&body).expect("serializes").into(),
            )
            .await?;
        stream.request_id = Some(json!(id));
        Ok(stream)
    }

    /// Sends any bytes with any headers (plus content type / accept / client headers) and
    /// returns once the response head has arrived; the body is read with [`EventStream`].
    pub async fn open_raw_stream(
        &self,
        method: Method,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<EventStream, ClientError> {
        let mut req = Request::builder()
            .method(method)
            .uri(self.url.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json, text/event-stream")
            .body(Full::new(body))
            .expect("valid request");
        for (k, v) in self.headers.iter().chain(headers.iter()) {
            req.headers_mut().insert(k.clone(), v.clone());
        }
        let resp = tokio::time::timeout(self.timeout, self.http.request(req))
            .await
            .map_err(|_| ClientError::Timeout)?
            .map_err(|e| ClientError::Http(e.to_string()))?;
        let (parts, body) = resp.into_parts();
        let streamed = parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        Ok(EventStream {
            status: parts.status,
            headers: parts.headers,
            streamed,
            request_id: None,
            body: Some(body),
            decoder: SseDecoder::new(64 << 20, 1 << 30),
            ready: VecDeque::new(),
            line: Vec::new(),
            comments: 0,
            plain: Vec::new(),
        })
    }

    /// Drives a `tools/call` / `prompts/get` / `resources/read` through its rounds, answering
    /// every input request with `answer`. Returns each round and the final exchange.
    pub async fn call_with_input(
        &self,
        method: &str,
        params: Value,
        answer: &mut Answerer<'_>,
        max_rounds: u32,
    ) -> Result<(Vec<Round>, Exchange), ClientError> {
        let mut rounds = Vec::new();
        let mut ex = self.request(method, params.clone()).await?;
        loop {
            if ex.result_type() != Some("input_required") {
                return Ok((rounds, ex));
            }
            if rounds.len() as u32 >= max_rounds {
                return Err(ClientError::TooManyRounds(max_rounds));
            }
            let result = ex.result().cloned().unwrap_or_default();
            let input_requests = result
                .get("inputRequests")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            let state = result
                .get("requestState")
                .and_then(Value::as_str)
                .map(str::to_string);
            let mut responses = Map::new();
            for (key, req) in &input_requests {
                let resp = answer(key, req).map_err(ClientError::Answerer)?;
                responses.insert(key.clone(), resp);
            }
            rounds.push(Round {
                input_requests,
                request_state_len: state.as_ref().map_or(0, String::len),
                exchange: ex,
            });
            let mut retry = params.as_object().cloned().unwrap_or_default();
            retry.insert("inputResponses".into(), Value::Object(responses));
            if let Some(s) = state {
                retry.insert("requestState".into(), Value::from(s));
            }
            ex = self.request(method, Value::Object(retry)).await?;
        }
    }
}

/// A response read as it arrives: the JSON-RPC messages of an SSE stream one at a time (or
/// the one message of a JSON body), with SSE comment lines counted.
pub struct EventStream {
    pub status: StatusCode,
    pub headers: HeaderMap,
    /// Whether the answer is an SSE stream.
    pub streamed: bool,
    /// The id of the request, when sent with [`ModernClient::open_stream`].
    pub request_id: Option<Value>,
    body: Option<Incoming>,
    decoder: SseDecoder,
    ready: VecDeque<Value>,
    /// The current line, for spotting comments.
    line: Vec<u8>,
    /// SSE comment lines (`: keep-alive`) seen so far.
    pub comments: u64,
    /// A JSON body, gathered until its end.
    plain: Vec<u8>,
}

impl EventStream {
    /// The next message; `Ok(None)` once the body has ended.
    pub async fn next(&mut self) -> Result<Option<Value>, ClientError> {
        loop {
            if let Some(v) = self.ready.pop_front() {
                return Ok(Some(v));
            }
            if !self.read_more().await? {
                return Ok(None);
            }
        }
    }

    /// Like [`EventStream::next`], giving up after `limit`.
    pub async fn next_within(&mut self, limit: Duration) -> Result<Option<Value>, ClientError> {
        tokio::time::timeout(limit, self.next())
            .await
            .map_err(|_| ClientError::Timeout)?
    }

    /// Reads until `n` comment lines in all have been seen (or the body ends); messages read
    /// meanwhile stay queued for [`EventStream::next`].
    pub async fn wait_for_comments(&mut self, n: u64) -> Result<(), ClientError> {
        while self.comments < n && self.read_more().await? {}
        Ok(())
    }

    /// Reads one more frame; `false` once the body has ended.
    async fn read_more(&mut self) -> Result<bool, ClientError> {
        let Some(body) = self.body.as_mut() else {
            return Ok(false);
        };
        match body.frame().await {
            None => {
                self.body = None;
                self.finish()?;
            }
            Some(Err(e)) => {
                self.body = None;
                return Err(ClientError::Http(e.to_string()));
            }
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    self.feed(&data)?;
                }
            }
        }
        Ok(true)
    }

    fn feed(&mut self, data: &[u8]) -> Result<(), ClientError> {
        if !self.streamed {
            self.plain.extend_from_slice(data);
            return Ok(());
        }
        for &b in data {
            if b == b'\n' || b == b'\r' {
                if self.line.first() == Some(&b':') {
                    self.comments += 1;
                }
                self.line.clear();
            } else {
                self.line.push(b);
            }
        }
        let mut events = Vec::new();
        self.decoder
            .feed(data, &mut events)
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        for ev in events {
            if ev.data.is_empty() {
                continue;
            }
            let v: Value = serde_json::from_str(&ev.data)
                .map_err(|e| ClientError::Protocol(format!("bad SSE JSON: {e}")))?;
            self.ready.push_back(v);
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<(), ClientError> {
        if !self.streamed && !self.plain.is_empty() {
            let v = serde_json::from_slice(&std::mem::take(&mut self.plain))
                .map_err(|e| ClientError::Protocol(format!("bad JSON body: {e}")))?;
            self.ready.push_back(v);
        }
        Ok(())
    }
}
