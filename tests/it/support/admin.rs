//! The admin listener in tests: start it for a gateway, GET its endpoints.

use std::sync::Arc;

use mrtr_gateway::gateway::Gateway;
use serde_json::Value;

/// Serves `/healthz`, `/readyz` and `/metrics` for `gw` on a free loopback port; returns its base URL.
pub async fn start(gw: Arc<Gateway>) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(mrtr_gateway::admin::serve(
        gw,
        l,
        tokio_util::sync::CancellationToken::new(),
    ));
    format!("http://{addr}")
}

/// One GET: the status and the body (JSON when it parses, else a JSON string).
pub async fn get(url: &str) -> (u16, Value) {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let resp = client.get(url.parse().unwrap()).await.unwrap();
    let status = resp.status().as_u16();
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    (
        status,
        serde_json::from_slice(&body)
            .unwrap_or(Value::String(String::from_utf8_lossy(&body).into())),
    )
}
