//! The HTTP client the OTLP exporter sends its batches with: the gateway's own hyper client
//! (HTTP/1.1; `https` with the system's roots), no second HTTP stack.
//!
//! The SDK's batch processor runs on a thread of its own and waits for each export there, but
//! a hyper connection needs a tokio runtime: each request is spawned onto the gateway's, and
//! the processor's thread waits for that task. Requests are bounded in time (the export
//! timeout, per attempt) and in what is read back (a collector's reply is small).

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use opentelemetry_http::{HttpClient, HttpError};

/// The most of a collector's reply that is read (an OTLP response is a few bytes; a partial
/// success carries a short message).
const MAX_REPLY_BYTES: usize = 64 * 1024;

#[derive(Debug, Clone)]
pub(super) struct OtlpHttpClient {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    runtime: tokio::runtime::Handle,
    timeout: Duration,
}

impl OtlpHttpClient {
    pub(super) fn new(
        runtime: tokio::runtime::Handle,
        timeout: Duration,
    ) -> Result<OtlpHttpClient, String> {
        // The provider is named explicitly, as for every TLS client of the gateway.
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(rustls::crypto::aws_lc_rs::default_provider())
            .map_err(|e| {
                format!("tracing.otlp_endpoint: cannot load the system's root certificates: {e}")
            })?
            .https_or_http()
            .enable_http1()
            .build();
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(1)
            .build(connector);
        Ok(OtlpHttpClient {
            client,
            runtime,
            timeout,
        })
    }

    async fn send(
        client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
        request: Request<Bytes>,
    ) -> Result<Response<Bytes>, HttpError> {
        let response = client.request(request.map(Full::new)).await?;
        let (parts, body) = response.into_parts();
        let body = Limited::new(body, MAX_REPLY_BYTES)
            .collect()
            .await?
            .to_bytes();
        Ok(Response::from_parts(parts, body))
    }
}

#[async_trait::async_trait]
impl HttpClient for OtlpHttpClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let timeout = self.timeout;
        let client = self.client.clone();
        let task = self.runtime.spawn(async move {
            tokio::time::timeout(timeout, Self::send(client, request))
                .await
                .map_err(|_| -> HttpError {
                    format!("no answer from the collector within {timeout:?}").into()
                })?
        });
        task.await?
    }
}
