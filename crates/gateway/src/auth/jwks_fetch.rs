//! One bounded HTTP GET of a JWKS document.
//!
//! https with the operating system's root certificates; plain http only when the operator
//! allowed it (`auth.jwt.jwks_allow_http`, for tests and in-cluster endpoints). The whole
//! exchange (connect, headers, body) runs under `auth.jwt.jwks_fetch_timeout`, and the body may
//! not exceed `auth.jwt.jwks_max_bytes`: an identity provider that hangs or streams without end
//! cannot hold requests or memory. Redirects are not followed.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::config::RemoteJwksConfig;

/// Why a fetch produced no document.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FetchError {
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("document larger than {0} bytes")]
    TooLarge(usize),
    #[error("HTTP status {0}")]
    Status(http::StatusCode),
    #[error("{0}")]
    Transport(String),
}

impl FetchError {
    /// Label for the fetch counter.
    pub(crate) fn outcome(&self) -> &'static str {
        match self {
            FetchError::Timeout(_) => "timeout",
            FetchError::TooLarge(_) => "too_large",
            FetchError::Status(_) => "bad_status",
            FetchError::Transport(_) => "transport",
        }
    }
}

pub(crate) struct JwksFetcher {
    client: Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
    uri: http::Uri,
    timeout: Duration,
    max_bytes: usize,
}

impl JwksFetcher {
    pub(crate) fn new(cfg: &RemoteJwksConfig) -> Result<JwksFetcher, String> {
        let uri: http::Uri = cfg
            .url
            .as_str()
            .parse()
            .map_err(|e| format!("not a usable URI: {e}"))?;
        // The provider is named explicitly: more than one rustls provider is compiled into the
        // binary, and relying on a process default would panic if none was installed.
        let builder = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(rustls::crypto::aws_lc_rs::default_provider())
            .map_err(|e| format!("cannot load the system's root certificates: {e}"))?;
        let builder = if cfg.allow_http {
            builder.https_or_http()
        } else {
            builder.https_only()
        };
        let connector = builder.enable_http1().enable_http2().build();
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Ok(JwksFetcher {
            client,
            uri,
            timeout: cfg.fetch_timeout,
            max_bytes: cfg.max_bytes,
        })
    }

    pub(crate) async fn fetch(&self) -> Result<Bytes, FetchError> {
        tokio::time::timeout(self.timeout, self.fetch_unbounded_in_time())
            .await
            .map_err(|_| FetchError::Timeout(self.timeout))?
    }

    async fn fetch_unbounded_in_time(&self) -> Result<Bytes, FetchError> {
        let request = http::Request::get(self.uri.clone())
            .header(
                http::header::ACCEPT,
                "application/jwk-set+json, application/json",
            )
            .header(http::header::USER_AGENT, "mrtr-gateway")
            .body(Empty::new())
            .map_err(|e| FetchError::Transport(e.to_string()))?;
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| FetchError::Transport(error_chain(&e)))?;
        if !response.status().is_success() {
            return Err(FetchError::Status(response.status()));
        }
        let declared = response
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > self.max_bytes as u64) {
            return Err(FetchError::TooLarge(self.max_bytes));
        }
        let body = Limited::new(response.into_body(), self.max_bytes);
        match body.collect().await {
            Ok(collected) => Ok(collected.to_bytes()),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                Err(FetchError::TooLarge(self.max_bytes))
            }
            Err(e) => Err(FetchError::Transport(e.to_string())),
        }
    }
}

/// The error and its causes on one line (hyper's top-level message alone says little).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
