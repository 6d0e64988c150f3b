//! The HTTP client the gateway uses toward the legacy server, with its timeouts and limits.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;

use super::handshake::VersionMemory;
/// A legacy server's response body; reading it drives its connection ([`super::http_conns`]).
pub use super::http_conns::ConnBody as UpstreamBody;
use super::http_conns::{Connector, Conns, IdleLimits, SendError};
use crate::config::UpstreamConfig;
use crate::metrics::{ConnMetrics, LimitHits};
use crate::tls::upstream::TlsFailure;

/// Why talking to the legacy server failed, at the HTTP level.
#[derive(Debug, Clone, thiserror::Error)]
pub enum HttpError {
    #[error("cannot reach the legacy server: {0}")]
    Connect(String),
    /// The TLS connection to an `https` upstream failed; `detail` is for logs only.
    #[error("TLS with the legacy server failed: {failure}")]
    Tls { failure: TlsFailure, detail: String },
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
    /// Reconnects in a row without progress before a resumable SSE stream is given up.
    pub resume_attempts: u32,
    /// Cap on the server's `retry` delay before reconnecting.
    pub resume_max_delay: Duration,
    /// Where limit hits are counted.
    pub hits: LimitHits,
}

pub struct UpstreamHttp {
    conns: std::sync::Arc<Conns>,
    pub url: url::Url,
    uri: http::Uri,
    pub limits: UpstreamLimits,
    /// Which protocol version to request in `initialize`.
    pub versions: VersionMemory,
    pub client_name: String,
}

impl UpstreamHttp {
    /// The client `cfg` describes; limits it enforces are counted in `hits`, its connections
    /// in `conns`.
    pub fn new(cfg: &UpstreamConfig, hits: LimitHits, conns: ConnMetrics) -> UpstreamHttp {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(cfg.connect_timeout));
        connector.set_nodelay(true);
        // `https` URLs are handled by the TLS layer below; the TCP connector must let them by.
        connector.enforce_http(false);
        let tls = match &cfg.tls {
            Some(tls) => tls.client_config(),
            // A plain-http upstream: no TLS is ever negotiated, so nothing is trusted.
            None => std::sync::Arc::new(
                rustls::ClientConfig::builder_with_provider(crate::tls::provider())
                    .with_safe_default_protocol_versions()
                    .expect("the provider supports the default versions")
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth(),
            ),
        };
        let uri: http::Uri = cfg.url.as_str().parse().expect("validated URL");
        UpstreamHttp {
            conns: Conns::new(
                Connector {
                    tcp: connector,
                    tls,
                },
                &uri,
                IdleLimits {
                    max: cfg.max_idle_connections,
                    for_at_most: cfg.connection_idle_timeout,
                },
                conns,
            ),
            uri,
            url: cfg.url.clone(),
            limits: UpstreamLimits {
                response_timeout: cfg.response_timeout,
                idle_timeout: cfg.idle_timeout,
                max_event_bytes: cfg.max_event_bytes,
                max_stream_bytes: cfg.max_stream_bytes,
                resume_attempts: cfg.resume_attempts,
                resume_max_delay: cfg.resume_max_delay,
                hits,
            },
            versions: VersionMemory::new(&cfg.protocol_version),
            client_name: cfg.client_name.clone(),
        }
    }

    /// Sends one request to the configured endpoint and waits (bounded) for the response head.
    pub async fn send(
        &self,
        method: Method,
        headers: HeaderMap,
        body: Option<Bytes>,
    ) -> Result<Response<UpstreamBody>, HttpError> {
        self.send_to(&self.uri, method, headers, body).await
    }

    /// Like [`UpstreamHttp::send`], to another URI of the same server (the HTTP+SSE
    /// transport POSTs to the endpoint its SSE stream announced).
    pub async fn send_to(
        &self,
        uri: &http::Uri,
        method: Method,
        headers: HeaderMap,
        body: Option<Bytes>,
    ) -> Result<Response<UpstreamBody>, HttpError> {
        let Some(authority) = uri.authority() else {
            return Err(HttpError::Connect(format!("{uri} names no server")));
        };
        let host = HeaderValue::from_str(authority.as_str())
            .map_err(|_| HttpError::Connect(format!("{uri}: not a host header")))?;
        // HTTP/1 to the server itself: the request line carries the path, `Host` the server.
        let path = uri
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str);
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .body(body.unwrap_or_default())
            .expect("request parts are valid");
        *req.headers_mut() = headers;
        req.headers_mut().insert(header::HOST, host);
        let timeout = self.limits.response_timeout;
        match tokio::time::timeout(timeout, self.conns.send(uri, req)).await {
            Err(_) => Err(HttpError::Timeout(timeout)),
            Ok(Err(e)) => Err(send_failure(e)),
            Ok(Ok(resp)) => Ok(resp),
        }
    }
}

/// What a request that got no response head failed at. Only a request the server cannot have
/// had whole is a failure to reach it ([`HttpError::Connect`], or [`HttpError::Tls`]), which
/// callers take to mean that nothing ran; one the connection took whole may have run, however
/// its response then failed.
fn send_failure(e: SendError) -> HttpError {
    match e {
        SendError::Connect(e) => connect_error(e.as_ref()),
        SendError::Unsent(e) => connect_error(&e),
        SendError::Exchange(e) => HttpError::Body(error_chain(&e)),
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

/// Whether a response is an SSE stream.
pub fn is_sse(h: &HeaderMap) -> bool {
    h.get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| {
            ct.trim_start()
                .to_ascii_lowercase()
                .starts_with("text/event-stream")
        })
}

/// Reads a whole (small) body with a size cap and an idle timeout.
pub async fn read_body(
    body: UpstreamBody,
    limit: usize,
    idle: Duration,
) -> Result<Bytes, HttpError> {
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

/// A failure to reach the server or to exchange with it, as a TLS failure when one caused it.
fn connect_error(e: &(dyn std::error::Error + 'static)) -> HttpError {
    match TlsFailure::find(e) {
        Some(failure) => HttpError::Tls {
            failure,
            detail: error_chain(e),
        },
        None => HttpError::Connect(error_chain(e)),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::legacy::h1::H1Error;
    use crate::legacy::http_conns::ExchangeError;

    #[test]
    fn only_a_request_the_server_cannot_have_had_whole_is_a_failure_to_reach_it() {
        let refused = || std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let reset = || std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(matches!(
            send_failure(SendError::Connect(Box::new(refused()))),
            HttpError::Connect(_)
        ));
        assert!(matches!(
            send_failure(SendError::Unsent(reset())),
            HttpError::Connect(_)
        ));
        // Taken whole: the server may have run it, whether its connection then broke or its
        // response was not HTTP.
        for taken in [
            ExchangeError::Io(reset()),
            ExchangeError::Protocol(H1Error::Incomplete),
        ] {
            let e = send_failure(SendError::Exchange(taken));
            assert!(matches!(e, HttpError::Body(_)), "{e:?}");
        }
    }
}
