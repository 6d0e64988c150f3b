//! The HTTP client the gateway uses toward the legacy server, with its timeouts and limits.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::config::UpstreamConfig;

/// Why talking to the legacy server failed, at the HTTP level.
#[derive(Debug, Clone, thiserror::Error)]
pub enum HttpError {
    #[error("cannot reach the legacy server: {0}")]
    Connect(String),
    #[error("the legacy server did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the legacy server answered HTTP {status}: {body}")]
    Status { status: StatusCode, body: String },
    #[error("the legacy server sent a body larger than {0} bytes")]
    TooLarge(usize),
    #[error("reading the legacy server's response failed: {0}")]
    Body(String),
}

/// Limits and timeouts applied to every upstream exchange.
#[derive(Debug, Clone)]
pub struct UpstreamLimits {
    pub response_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_event_bytes: usize,
    pub max_stream_bytes: usize,
}

pub struct UpstreamHttp {
    client: Client<HttpConnector, Full<Bytes>>,
    pub url: url::Url,
    uri: http::Uri,
    pub limits: UpstreamLimits,
    /// The configured (newest) version to request in `initialize`.
    pub protocol_version: String,
    /// The version the server actually chose last time, when older than the configured one.
    learned_version: std::sync::Mutex<Option<String>>,
    pub client_name: String,
}

impl UpstreamHttp {
    pub fn new(cfg: &UpstreamConfig) -> UpstreamHttp {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(cfg.connect_timeout));
        connector.set_nodelay(true);
        connector.enforce_http(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        UpstreamHttp {
            client,
            uri: cfg.url.as_str().parse().expect("validated URL"),
            url: cfg.url.clone(),
            limits: UpstreamLimits {
                response_timeout: cfg.response_timeout,
                idle_timeout: cfg.idle_timeout,
                max_event_bytes: cfg.max_event_bytes,
                max_stream_bytes: cfg.max_stream_bytes,
            },
            protocol_version: cfg.protocol_version.clone(),
            learned_version: std::sync::Mutex::new(None),
            client_name: cfg.client_name.clone(),
        }
    }

    /// The version to request in the next `initialize`: the configured one, or the older
    /// one the server chose before (so capability shapes match what it will negotiate).
    pub fn request_version(&self) -> String {
        self.learned_version
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_else(|| self.protocol_version.clone())
    }

    /// Records the version a server negotiated.
    pub fn learn_version(&self, negotiated: &str) {
        let mut learned = self
            .learned_version
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        *learned = (negotiated < self.protocol_version.as_str()).then(|| negotiated.to_string());
    }

    /// Sends one request to the MCP endpoint and waits (bounded) for the response head.
    pub async fn send(
        &self,
        method: Method,
        headers: HeaderMap,
        body: Option<Bytes>,
    ) -> Result<Response<Incoming>, HttpError> {
        let mut req = Request::builder()
            .method(method)
            .uri(self.uri.clone())
            .body(Full::new(body.unwrap_or_default()))
            .expect("request parts are valid");
        *req.headers_mut() = headers;
        let timeout = self.limits.response_timeout;
        match tokio::time::timeout(timeout, self.client.request(req)).await {
            Err(_) => Err(HttpError::Timeout(timeout)),
            Ok(Err(e)) => Err(HttpError::Connect(error_chain(&e))),
            Ok(Ok(resp)) => Ok(resp),
        }
    }
}

/// Base headers for a POST of one JSON-RPC message.
pub fn post_headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(
        header::ACCEPT,
        HeaderValue::from_static("application/json, text/event-stream"),
    );
    h
}

/// Reads a whole (small) body with a size cap and an idle timeout.
pub async fn read_body(body: Incoming, limit: usize, idle: Duration) -> Result<Bytes, HttpError> {
    let mut body = body;
    let mut buf = bytes::BytesMut::new();
    loop {
        match tokio::time::timeout(idle, body.frame()).await {
            Err(_) => return Err(HttpError::Timeout(idle)),
            Ok(None) => return Ok(buf.freeze()),
            Ok(Some(Err(e))) => return Err(HttpError::Body(e.to_string())),
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    if buf.len() + data.len() > limit {
                        return Err(HttpError::TooLarge(limit));
                    }
                    buf.extend_from_slice(&data);
                }
            }
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(inner) = cur {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        cur = inner.source();
    }
    s
}
