//! The admin listener: `/metrics`, `/healthz`, `/readyz`, on its own address.
//!
//! Kept off the MCP listener so probes and scrapes never compete with client traffic for
//! request slots, and so the MCP port can be exposed without exposing these.
//!
//! It is hardened like the MCP listener, so that nobody who can reach it can starve the
//! process: at most `admin.max_connections` connections (more are closed at accept,
//! `limit_hits_total{limit="admin_max_connections"}`), requests must start within
//! `admin.header_read_timeout` (`limit="admin_header_read_timeout"`), idle connections are
//! closed after `admin.idle_timeout` (`limit="admin_idle_timeout"`), and accept errors back
//! off ([`crate::front::accept`]).
//!
//! **Host allow-list.** A page in a browser on the same machine can reach a loopback port
//! under a name it controls (DNS rebinding) and read the answer; the `Host` it sends is then
//! that name. So only these `Host` values are answered (421 Misdirected Request otherwise,
//! `limit="admin_allowed_hosts"`): `localhost`, loopback addresses, the address the listener
//! is bound to, the names in `admin.allowed_hosts`, and — when the listener is bound to an
//! unspecified address (`0.0.0.0`, `::`), as in Kubernetes where the kubelet and Prometheus
//! address the pod by IP — any IP address: a rebinding page can only present a name.

use std::net::IpAddr;
use std::sync::Arc;

use http::{HeaderMap, Method, Request, Response, StatusCode, Uri, header};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::front::accept::{Acceptor, CapLabels};
use crate::front::conn_limits::Caps;
use crate::front::connection::{self, ConnPolicy, LimitCounter};
use crate::front::respond::{self, Body};
use crate::gateway::Gateway;
use crate::metrics::Limit;

async fn route(gw: &Gateway, req: Request<hyper::body::Incoming>) -> Response<Body> {
    if req.method() != Method::GET {
        return respond::empty(StatusCode::METHOD_NOT_ALLOWED);
    }
    match req.uri().path() {
        "/metrics" => {
            let process = gw.metrics.process();
            process.sync_jwks(&gw.auth().counters().snapshot());
            process.sync_traces(&crate::telemetry::otlp_export::counters());
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
            let r = crate::readiness::evaluate(gw).await;
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

/// Whether a request's `Host` (or HTTP/2 `:authority`) may be answered, for a listener bound
/// to `bound` (see the module docs).
fn host_allowed(headers: &HeaderMap, uri: &Uri, bound: IpAddr, extra: &[String]) -> bool {
    let authority = match headers.get(header::HOST) {
        Some(h) => h
            .to_str()
            .ok()
            .and_then(|h| h.parse::<http::uri::Authority>().ok()),
        None => uri.authority().cloned(),
    };
    let Some(authority) = authority else {
        return false;
    };
    let host = authority.host().trim_end_matches('.').to_ascii_lowercase();
    if host == "localhost" || extra.contains(&host) {
        return true;
    }
    let literal = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(&host);
    match literal.parse::<IpAddr>() {
        Ok(ip) => ip.is_loopback() || bound.is_unspecified() || ip == bound,
        Err(_) => false,
    }
}

fn misdirected() -> Response<Body> {
    let mut r = Response::new(respond::full(
        "this Host is not served here (admin.allowed_hosts)\n",
    ));
    *r.status_mut() = StatusCode::MISDIRECTED_REQUEST;
    r
}

const CAP_LABELS: CapLabels = CapLabels {
    total: Limit::AdminMaxConnections,
    per_source: Limit::AdminMaxConnections,
};

/// Serves the admin endpoints until `shutdown`.
pub async fn serve(gw: Arc<Gateway>, listener: TcpListener, shutdown: CancellationToken) {
    let bound = match listener.local_addr() {
        Ok(a) => a.ip(),
        Err(e) => {
            tracing::error!(error = %e, "the admin listener has no local address; not serving it");
            return;
        }
    };
    let mut acceptor = Acceptor::new(
        listener,
        "admin",
        CAP_LABELS,
        &gw.metrics.front(),
        gw.metrics.limits(),
    );
    let caps_gw = gw.clone();
    let caps = move || Caps {
        total: caps_gw.config().admin.max_connections,
        per_source: None,
        ipv6_prefix: 128,
    };
    let counter = LimitCounter {
        hits: gw.metrics.limits(),
        header_timeout: Limit::AdminHeaderReadTimeout,
        idle: Limit::AdminIdleTimeout,
        at_rest: None,
    };
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            a = acceptor.next(&caps) => a,
        };
        let cfg = gw.config();
        let policy = ConnPolicy {
            header_read_timeout: cfg.admin.header_read_timeout,
            idle_timeout: cfg.admin.idle_timeout,
            http2_max_concurrent_streams: cfg.listen.http2_max_concurrent_streams,
            release_idle_after: cfg.listen.idle_release_after,
        };
        drop(cfg);
        let svc_gw = gw.clone();
        let handler = move |req: Request<hyper::body::Incoming>| {
            let gw = svc_gw.clone();
            async move {
                let allowed = &gw.config().admin.allowed_hosts;
                if !host_allowed(req.headers(), req.uri(), bound, allowed) {
                    gw.metrics.limits().hit(Limit::AdminAllowedHosts);
                    return misdirected();
                }
                route(&gw, req).await
            }
        };
        let counter = counter.clone();
        let stop = shutdown.child_token();
        tokio::spawn(async move {
            let _permit = accepted.permit;
            connection::serve(accepted.stream, policy, &counter, stop, handler).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed(host: Option<&str>, uri: &str, bound: &str, extra: &[&str]) -> bool {
        let mut h = HeaderMap::new();
        if let Some(v) = host {
            h.insert(header::HOST, v.parse().unwrap());
        }
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        host_allowed(&h, &uri.parse().unwrap(), bound.parse().unwrap(), &extra)
    }

    #[test]
    fn loopback_names_the_bound_address_and_listed_hosts_are_answered() {
        let lo = "127.0.0.1";
        for host in [
            "localhost:9090",
            "LOCALHOST",
            "127.0.0.1:9090",
            "127.0.0.5",
            "[::1]:9090",
        ] {
            assert!(allowed(Some(host), "/metrics", lo, &[]), "{host}");
        }
        // DNS rebinding: a name the attacker controls, resolving to loopback.
        assert!(!allowed(Some("evil.example:9090"), "/metrics", lo, &[]));
        assert!(!allowed(Some("10.0.0.7:9090"), "/metrics", lo, &[]));
        assert!(!allowed(None, "/metrics", lo, &[]), "no Host at all");
        assert!(allowed(
            Some("metrics.internal:9090"),
            "/metrics",
            lo,
            &["metrics.internal"]
        ));
        assert!(allowed(Some("10.0.0.7:9090"), "/metrics", "10.0.0.7", &[]));
        // HTTP/2 carries the authority in the URI.
        assert!(allowed(None, "http://localhost:9090/metrics", lo, &[]));
        assert!(!allowed(None, "http://evil.example/metrics", lo, &[]));
    }

    #[test]
    fn an_unspecified_bind_answers_any_address_but_still_no_foreign_name() {
        for bound in ["0.0.0.0", "::"] {
            assert!(allowed(Some("10.1.2.3:9090"), "/readyz", bound, &[]));
            assert!(allowed(Some("[fd00::7]:9090"), "/readyz", bound, &[]));
            assert!(!allowed(Some("evil.example"), "/readyz", bound, &[]));
        }
    }
}
