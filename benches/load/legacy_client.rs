//! A minimal legacy (2025-11-25) Streamable HTTP client: the "direct" side of the comparison.
//!
//! It does what a legacy MCP client does on the hot path and nothing more: `initialize` once,
//! keep the `Mcp-Session-Id`, send `notifications/initialized`, then POST `tools/call`s on the
//! warm session and read each answer (JSON or SSE). A server request that arrives on the
//! call's stream (an elicitation) is answered inline by POST while the stream stays open, as
//! a legacy client would. No standalone GET stream: the load tools ask on the call stream.

use std::sync::atomic::{AtomicI64, Ordering};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use mrtr_wire::sse::SseDecoder;
use serde_json::{Value, json};

const LEGACY_VERSION: &str = "2025-11-25";

pub struct LegacyClient {
    http: Client<HttpConnector, Full<Bytes>>,
    uri: Uri,
    session: HeaderValue,
    next_id: AtomicI64,
}

fn is_sse(resp: &Response<Incoming>) -> bool {
    resp.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

impl LegacyClient {
    /// Opens a session declaring form elicitation.
    pub async fn connect(url: &str) -> Result<LegacyClient, String> {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let http = Client::builder(TokioExecutor::new()).build(connector);
        let uri: Uri = url.parse().map_err(|e| format!("bad URL {url}: {e}"))?;
        let init = json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {
                "protocolVersion": LEGACY_VERSION,
                "capabilities": {"elicitation": {"form": {}}},
                "clientInfo": {"name": "mrtr-load-legacy-client", "version": "1"}
            }
        });
        let req = Request::builder()
            .method(Method::POST)
            .uri(uri.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json, text/event-stream")
            .body(Full::new(Bytes::from(init.to_string())))
            .expect("valid request");
        let resp = http.request(req).await.map_err(|e| e.to_string())?;
        if resp.status() != StatusCode::OK {
            return Err(format!("initialize: HTTP {}", resp.status()));
        }
        let session = resp
            .headers()
            .get("mcp-session-id")
            .cloned()
            .ok_or("initialize: no Mcp-Session-Id")?;
        let client = LegacyClient {
            http,
            uri,
            session,
            next_id: AtomicI64::new(1),
        };
        client
            .read_response(resp, &json!(0), &|_| json!({}))
            .await?;
        let ack = client
            .post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await?;
        if ack.status() != StatusCode::ACCEPTED {
            return Err(format!("initialized: HTTP {}", ack.status()));
        }
        Ok(client)
    }

    async fn post(&self, body: &Value) -> Result<Response<Incoming>, String> {
        let req = Request::builder()
            .method(Method::POST)
            .uri(self.uri.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json, text/event-stream")
            .header("mcp-session-id", self.session.clone())
            .header("mcp-protocol-version", LEGACY_VERSION)
            .body(Full::new(Bytes::from(body.to_string())))
            .expect("valid request");
        self.http.request(req).await.map_err(|e| e.to_string())
    }

    /// Calls a tool on the warm session; `answer` answers any server request on the way.
    /// Returns the `CallToolResult`.
    pub async fn call_tool(
        &self,
        name: &str,
        arguments: Value,
        answer: &(dyn Fn(&Value) -> Value + Sync),
    ) -> Result<Value, String> {
        let id = json!(self.next_id.fetch_add(1, Ordering::Relaxed));
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": name, "arguments": arguments}});
        let resp = self.post(&body).await?;
        if resp.status() != StatusCode::OK {
            return Err(format!("tools/call: HTTP {}", resp.status()));
        }
        let msg = self.read_response(resp, &id, answer).await?;
        match msg.get("result") {
            Some(r) => Ok(r.clone()),
            None => Err(format!("tools/call failed: {}", msg["error"])),
        }
    }

    /// Reads a JSON or SSE answer until the response with `id`, answering server requests.
    async fn read_response(
        &self,
        resp: Response<Incoming>,
        id: &Value,
        answer: &(dyn Fn(&Value) -> Value + Sync),
    ) -> Result<Value, String> {
        if !is_sse(&resp) {
            let bytes = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            return serde_json::from_slice(&bytes).map_err(|e| e.to_string());
        }
        let mut body = resp.into_body();
        let mut decoder = SseDecoder::new(16 << 20, 1 << 30);
        let mut events = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| e.to_string())?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            decoder
                .feed(&data, &mut events)
                .map_err(|e| e.to_string())?;
            for event in events.drain(..) {
                if event.data.is_empty() {
                    continue;
                }
                let msg: Value = serde_json::from_str(&event.data).map_err(|e| e.to_string())?;
                match (msg.get("method"), msg.get("id")) {
                    (Some(_), Some(server_id)) => {
                        let reply =
                            json!({"jsonrpc": "2.0", "id": server_id, "result": answer(&msg)});
                        let ack = self.post(&reply).await?;
                        let status = ack.status();
                        let _ = ack.into_body().collect().await;
                        if status != StatusCode::ACCEPTED {
                            return Err(format!("answer: HTTP {status}"));
                        }
                    }
                    (Some(_), None) => {}
                    (None, Some(got)) if got == id => return Ok(msg),
                    _ => {}
                }
            }
        }
        Err("the stream ended without a response".into())
    }

    /// Ends the session (DELETE).
    pub async fn close(self) {
        let req = Request::builder()
            .method(Method::DELETE)
            .uri(self.uri.clone())
            .header("mcp-session-id", self.session.clone())
            .header("mcp-protocol-version", LEGACY_VERSION)
            .body(Full::new(Bytes::new()))
            .expect("valid request");
        if let Ok(resp) = self.http.request(req).await {
            let _ = resp.into_body().collect().await;
        }
    }
}
