//! The admin listener: `/metrics`, `/healthz`, `/readyz`, on its own address.
//!
//! Kept off the MCP listener so probes and scrapes never compete with client traffic for
//! request slots, and so the MCP port can be exposed without exposing these.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response, StatusCode, header};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::front::respond::{self, Body};
use crate::gateway::Gateway;

async fn route(gw: &Gateway, req: Request<hyper::body::Incoming>) -> Response<Body> {
    if req.method() != Method::GET {
        return respond::empty(StatusCode::METHOD_NOT_ALLOWED);
    }
    match req.uri().path() {
        "/metrics" => {
            gw.metrics.sync_jwks(&gw.auth().counters().snapshot());
            let mut r = Response::new(respond::full(gw.metrics.render()));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            r
        }
        "/healthz" => respond::json(
            StatusCode::OK,
            &json!({"status": "alive", "instance_id": gw.instance_id}),
        ),
        "/readyz" => {
            let r = gw.readiness().await;
            let checks: serde_json::Map<String, serde_json::Value> = r
                .checks
                .iter()
                .map(|(name, res)| {
                    let v = match res {
                        Ok(detail) => json!({"ok": true, "detail": detail}),
                        Err(detail) => json!({"ok": false, "detail": detail}),
                    };
                    (name.to_string(), v)
                })
                .collect();
            let status = if r.ready() {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            respond::json(
                status,
                &json!({"ready": r.ready(), "instance_id": gw.instance_id, "checks": checks}),
            )
        }
        _ => respond::empty(StatusCode::NOT_FOUND),
    }
}

/// Serves the admin endpoints until `shutdown`.
pub async fn serve(gw: Arc<Gateway>, listener: TcpListener, shutdown: CancellationToken) {
    let builder = auto::Builder::new(TokioExecutor::new());
    loop {
        let (stream, _) = tokio::select! {
            _ = shutdown.cancelled() => return,
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let gw = gw.clone();
        let conn = builder
            .serve_connection(
                TokioIo::new(stream),
                service_fn(move |req| {
                    let gw = gw.clone();
                    async move { Ok::<_, Infallible>(route(&gw, req).await) }
                }),
            )
            .into_owned();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = conn => {}
                _ = shutdown.cancelled() => {}
            }
        });
    }
}
