//! The upstream check behind `/readyz`: proof that the legacy server speaks MCP.
//!
//! It opens a real legacy session — `initialize` and `notifications/initialized` with the
//! configured credentials, over TLS where the URL says `https` — and closes it again; for
//! stdio that starts the command. A wrong path (HTTP 404), a TLS failure, a server that
//! answers something other than MCP, or a command that cannot start all fail it.
//!
//! What it can honestly check depends on `auth.upstream_credentials`:
//! - `none` and `static`: the same `initialize` every call's session sends, so success means
//!   calls can open sessions.
//! - `forward`: there is no caller, so no token to forward. It sends `initialize` without
//!   one; a success, or an HTTP 401 / 403 (the server is there and demands the caller's token),
//!   counts as ready; anything else (404, TLS, no connection, not MCP) does not. Whether a
//!   particular caller's token is accepted is not something readiness can know.
//! - stdio with every child slot taken: children are running, so the command starts; no extra
//!   child is started for the check.
//!
//! Results are cached for `admin.upstream_check_cache` so probes do not hammer the legacy
//! server (one check at a time, whatever the number of probes). A probe that finds the cache
//! stale starts a check and waits for it at most `admin.upstream_check_wait`; past that it
//! answers with the previous result (and the check finishes in the background), so a slow
//! upstream never makes the probe itself time out. Checks actually sent are counted in
//! `mrtr_gateway_upstream_checks_total{result}`. The check's text is the client-facing sentence
//! of [`crate::upstream_error`] (never a command line, URL or upstream body); the detail goes to
//! a WARN log line when the result changes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::{HeaderMap, StatusCode};
use prometheus::IntCounterVec;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::legacy::http::HttpError;
use crate::legacy::session::SessionError;
use crate::legacy::upstream::Upstream;
use mrtr_wire::capabilities::Declared;

/// How the upstream check presents credentials.
#[derive(Debug, Clone)]
pub struct CheckCredentials {
    /// Headers every legacy session carries without a caller (a static token, or nothing).
    pub headers: HeaderMap,
    /// Credentials are the caller's (`forward`): a 401 / 403 answer still means "there".
    pub forwarded: bool,
}

/// How long the cache lasts and how long a probe waits for a running check.
#[derive(Debug, Clone, Copy)]
pub struct CheckTiming {
    pub cache: Duration,
    pub wait: Duration,
    /// Upper bound on one check (the upstream timeouts bound it already; this is a backstop).
    pub limit: Duration,
}

#[derive(Clone)]
struct Checked {
    at: Instant,
    /// The upstream the result is about (a reload may swap it).
    upstream: Arc<Upstream>,
    result: Result<String, String>,
}

/// The cached, single-flight upstream check.
pub struct UpstreamCheck {
    inner: Arc<Inner>,
}

struct Inner {
    last: watch::Sender<Option<Checked>>,
    in_flight: AtomicBool,
    checks: IntCounterVec,
}

impl UpstreamCheck {
    /// `checks` counts checks sent, by `result` (`ok` / `error`).
    pub fn new(checks: IntCounterVec) -> UpstreamCheck {
        UpstreamCheck {
            inner: Arc::new(Inner {
                last: watch::Sender::new(None),
                in_flight: AtomicBool::new(false),
                checks,
            }),
        }
    }

    /// Whether `upstream` speaks MCP, from the cache when it is fresh.
    pub async fn check(
        &self,
        upstream: Arc<Upstream>,
        credentials: CheckCredentials,
        timing: CheckTiming,
    ) -> Result<String, String> {
        let about = |c: &Option<Checked>| {
            c.as_ref()
                .filter(|c| Arc::ptr_eq(&c.upstream, &upstream))
                .cloned()
        };
        let mut rx = self.inner.last.subscribe();
        if let Some(c) = about(&rx.borrow_and_update())
            && c.at.elapsed() < timing.cache
        {
            return c.result;
        }
        if !self.inner.in_flight.swap(true, Ordering::AcqRel) {
            let inner = self.inner.clone();
            let target = upstream.clone();
            tokio::spawn(async move {
                let (result, detail) =
                    match tokio::time::timeout(timing.limit, probe(&target, credentials)).await {
                        Ok(r) => r,
                        Err(_) => (
                            Err(format!(
                                "the upstream check did not finish within {:?}",
                                timing.limit
                            )),
                            None,
                        ),
                    };
                let previous = inner
                    .last
                    .borrow()
                    .as_ref()
                    .filter(|c| Arc::ptr_eq(&c.upstream, &target))
                    .map(|c| c.result.clone());
                // Logged when the outcome changes, not on every check.
                if previous.as_ref() != Some(&result) {
                    match &result {
                        Err(told) => tracing::warn!(
                            check = "upstream",
                            detail = detail.as_deref().unwrap_or(""),
                            "readiness: the upstream check fails: {told}"
                        ),
                        Ok(what) => tracing::info!(check = "upstream", "readiness: {what}"),
                    }
                }
                inner
                    .checks
                    .with_label_values(&[if result.is_ok() { "ok" } else { "error" }])
                    .inc();
                inner.last.send_replace(Some(Checked {
                    at: Instant::now(),
                    upstream: target,
                    result,
                }));
                inner.in_flight.store(false, Ordering::Release);
            });
        }
        let deadline = Instant::now() + timing.wait;
        loop {
            if let Some(c) = about(&rx.borrow_and_update())
                && c.at.elapsed() < timing.cache
            {
                return c.result;
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => continue,
                _ => break,
            }
        }
        // Still running: the previous result about this upstream, if there is one.
        about(&rx.borrow()).map_or_else(
            || Err("the first upstream check has not finished yet".to_string()),
            |c| c.result,
        )
    }
}

/// One check: open a legacy session and close it. Returns what `/readyz` shows and, on
/// failure, the detail for the log.
async fn probe(
    upstream: &Upstream,
    credentials: CheckCredentials,
) -> (Result<String, String>, Option<String>) {
    if let Upstream::Stdio(s) = upstream
        && s.at_capacity()
    {
        return (
            Ok("every stdio child is busy (the command starts)".into()),
            None,
        );
    }
    let outcome = upstream
        .open(&Declared::default(), credentials.headers)
        .await;
    let result = match outcome {
        Ok((session, _inbound)) => {
            let version = session.negotiated_version().to_string();
            session.close().await;
            Ok(format!(
                "speaks MCP (initialize answered, version {version})"
            ))
        }
        Err(
            SessionError::Http(HttpError::Status { status, .. })
            | SessionError::InitializeStatus { status, .. },
        ) if credentials.forwarded
            && (status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN) =>
        {
            Ok(format!(
                "answers HTTP {} without a caller's token (upstream_credentials = \"forward\": \
                 initialize is checked by calls, not here)",
                status.as_u16()
            ))
        }
        Err(e) => {
            let told = format!(
                "{} ({})",
                crate::upstream_error::client_message(&e),
                crate::upstream_error::reason(&e)
            );
            return (Err(told), Some(e.to_string()));
        }
    };
    (result, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{ConnMetrics, LimitHits};

    fn counter() -> IntCounterVec {
        IntCounterVec::new(prometheus::Opts::new("checks", "checks"), &["result"]).unwrap()
    }

    /// An upstream on a port where nothing listens (the check fails fast).
    fn closed_upstream() -> Arc<Upstream> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let text = format!(
            "[upstream]\nurl = \"http://127.0.0.1:{port}/mcp\"\n[[state.keys]]\nid = \"k1\"\nsecret = \"{}\"\n",
            crate::config::EXAMPLE_SECRET
        );
        let cfg = crate::config::Config::from_toml_str(&text, &[], None).unwrap();
        let hits = LimitHits::new(counter());
        Arc::new(Upstream::from_config(
            &cfg.upstream,
            hits,
            ConnMetrics::none(),
        ))
    }

    fn timing(cache: Duration) -> CheckTiming {
        CheckTiming {
            cache,
            wait: Duration::from_secs(5),
            limit: Duration::from_secs(5),
        }
    }

    fn no_credentials() -> CheckCredentials {
        CheckCredentials {
            headers: HeaderMap::new(),
            forwarded: false,
        }
    }

    #[tokio::test]
    async fn results_are_cached_per_upstream() {
        let checks = counter();
        let check = UpstreamCheck::new(checks.clone());
        let upstream = closed_upstream();
        let sent = || checks.with_label_values(&["error"]).get();
        for _ in 0..3 {
            let r = check
                .check(
                    upstream.clone(),
                    no_credentials(),
                    timing(Duration::from_secs(60)),
                )
                .await;
            let detail = r.unwrap_err();
            assert!(detail.contains("could not be reached"), "{detail}");
            assert!(!detail.contains("127.0.0.1"), "{detail}");
        }
        assert_eq!(
            sent(),
            1,
            "three probes within the cache time send one check"
        );
        // Another upstream (a reload swapped it) is checked afresh.
        let _ = check
            .check(
                closed_upstream(),
                no_credentials(),
                timing(Duration::from_secs(60)),
            )
            .await;
        assert_eq!(sent(), 2);
    }
}
