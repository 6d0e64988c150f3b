//! What a modern client is told when the legacy server fails, and what only the log hears.
//!
//! A legacy failure's own text can hold things the client must never see: the stdio child's
//! last stderr line (a DSN with its password), the child's command line (with an API key), an
//! upstream error body (an HTML error page), the upstream's URL or origin. The client gets a
//! fixed sentence per failure class, in its own terms ("the upstream MCP server could not be
//! reached"), plus `error.data.requestId`; the full detail goes to one WARN log line in the
//! request's span, carrying the same `request_id`, so an operator can find it from what the
//! client reports. `/readyz` uses the same sentences ([`client_message`]).

use serde_json::json;

use crate::error::{Rejection, RejectionKind};
use crate::legacy::http::HttpError;
use crate::legacy::session::SessionError;
use crate::request_id::RequestId;

/// The client-facing sentence for a legacy-session failure: what failed, never upstream text.
pub fn client_message(e: &SessionError) -> String {
    match e {
        SessionError::Http(h) => match h {
            HttpError::Connect(_) => "the upstream MCP server could not be reached".into(),
            HttpError::Tls { failure, .. } => {
                format!("TLS with the upstream MCP server failed: {failure}")
            }
            HttpError::Timeout(d) => {
                format!("the upstream MCP server did not answer within {d:?}")
            }
            HttpError::Status { status, .. } => {
                format!("the upstream MCP server answered HTTP {}", status.as_u16())
            }
            HttpError::TooLarge(n) => {
                format!("the upstream MCP server sent a body larger than {n} bytes")
            }
            HttpError::Body(_) => "reading the upstream MCP server's response failed".into(),
        },
        SessionError::Expired => "the upstream MCP server no longer knows this session".into(),
        SessionError::Initialize(_) => "the upstream MCP server refused to initialize".into(),
        SessionError::InitializeStatus { status, .. } => format!(
            "the upstream MCP server refused to initialize (HTTP {})",
            status.as_u16()
        ),
        SessionError::Protocol(_) => "the upstream MCP server broke the protocol".into(),
        SessionError::Spawn(_) => "the upstream MCP server's process could not be started".into(),
        SessionError::Gone(_) => "the upstream MCP server's process or connection ended".into(),
        SessionError::Backoff { retry_in, .. } => format!(
            "the upstream MCP server's process failed to start; the next attempt is in {retry_in:?}"
        ),
        SessionError::Saturated { limit, waited } => format!(
            "all {limit} upstream MCP server processes (upstream.stdio_max_children) stayed busy for {waited:?}"
        ),
    }
}

/// The failure class of a legacy-session failure.
pub fn kind(e: &SessionError) -> RejectionKind {
    match e {
        SessionError::Http(HttpError::Timeout(_)) => RejectionKind::UpstreamTimeout,
        SessionError::Http(HttpError::Connect(_)) => RejectionKind::UpstreamUnreachable,
        SessionError::Http(HttpError::Tls { .. }) => RejectionKind::UpstreamTlsFailed,
        SessionError::Http(HttpError::TooLarge(_)) => RejectionKind::UpstreamTooLarge,
        SessionError::Http(_) => RejectionKind::UpstreamHttpError,
        SessionError::Initialize(_) | SessionError::InitializeStatus { .. } => {
            RejectionKind::UpstreamInitializeFailed
        }
        SessionError::Expired => RejectionKind::UpstreamSessionExpired,
        SessionError::Protocol(_) => RejectionKind::UpstreamProtocolError,
        SessionError::Spawn(_) => RejectionKind::UpstreamSpawnFailed,
        SessionError::Gone(_) => RejectionKind::UpstreamStreamBroken,
        SessionError::Backoff { retry_in, .. } => RejectionKind::UpstreamSpawnBackoff {
            retry_after: *retry_in,
        },
        SessionError::Saturated { .. } => RejectionKind::StdioMaxChildren,
    }
}

/// The stable reason (metrics, access log) for a legacy-session failure.
pub fn reason(e: &SessionError) -> &'static str {
    kind(e).reason()
}

/// How a legacy-session failure is reported to the modern client (the detail is logged).
pub fn session_rejection(e: &SessionError) -> Rejection {
    concealed(Rejection::new(kind(e), client_message(e)), &e.to_string())
}

/// `rejection` as the client sees it, with the request id in `error.data`; `detail` (which the
/// client does not see) goes to a WARN line in the request's span with the same id.
pub fn concealed(rejection: Rejection, detail: &str) -> Rejection {
    let id = RequestId::current();
    let request_id = id.as_ref().map(RequestId::as_str).unwrap_or("");
    tracing::warn!(
        request_id,
        reason = rejection.reason(),
        detail,
        "upstream failure (the client was told: {})",
        rejection.message()
    );
    match id {
        Some(id) => rejection.with_data_member("requestId", json!(id.as_str())),
        None => rejection,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Fault;
    use crate::front::error_map::answer;
    use http::StatusCode;
    use std::time::Duration;

    const SECRETS: &[&str] = &["s3cret-pw", "API-KEY-123", "<html>", "db.internal:5432"];

    fn leaky_errors() -> Vec<SessionError> {
        vec![
            SessionError::Http(HttpError::Connect(
                "tcp connect error to db.internal:5432".into(),
            )),
            SessionError::Http(HttpError::Status {
                status: StatusCode::NOT_FOUND,
                body: "<html><body>404 at db.internal:5432</body></html>".into(),
            }),
            SessionError::Http(HttpError::Body("s3cret-pw".into())),
            SessionError::Initialize("JSON-RPC error {\"message\": \"s3cret-pw\"}".into()),
            SessionError::InitializeStatus {
                status: StatusCode::NOT_FOUND,
                body: "<html>s3cret-pw</html>".into(),
            },
            SessionError::Protocol("endpoint points to https://db.internal:5432".into()),
            SessionError::Spawn("cannot start `server --key API-KEY-123`: not found".into()),
            SessionError::Gone(
                "exited with status 1 (last stderr line: postgres://u:s3cret-pw@db)".into(),
            ),
            SessionError::Backoff {
                command: "server --key API-KEY-123".into(),
                retry_in: Duration::from_secs(3),
                failures: 2,
                last: "s3cret-pw".into(),
            },
        ]
    }

    #[tokio::test]
    async fn clients_are_told_the_class_never_the_detail() {
        for e in leaky_errors() {
            let rej = crate::request_id::RequestContext::new(RequestId::new(), "i1".into())
                .scope(async { session_rejection(&e) })
                .await;
            let shown = serde_json::to_string(&answer(&rej).error).unwrap();
            for secret in SECRETS {
                assert!(!shown.contains(secret), "{e}: {shown}");
            }
            assert!(rej.data().unwrap()["requestId"].is_string(), "{shown}");
            assert_eq!(rej.fault(), Fault::Upstream);
        }
    }

    #[test]
    fn statuses_and_reasons_stay_as_they_were() {
        let t = session_rejection(&SessionError::Http(HttpError::Timeout(
            Duration::from_secs(1),
        )));
        assert_eq!(
            (answer(&t).status, t.reason()),
            (StatusCode::GATEWAY_TIMEOUT, "upstream_timeout")
        );
        let backoff = leaky_errors()
            .into_iter()
            .find(|e| matches!(e, SessionError::Backoff { .. }))
            .unwrap();
        let b = answer(&session_rejection(&backoff));
        assert_eq!(b.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            b.headers[0],
            (http::header::RETRY_AFTER, "3".parse().unwrap())
        );
        let s = session_rejection(&SessionError::Saturated {
            limit: 2,
            waited: Duration::from_secs(1),
        });
        assert_eq!(
            (answer(&s).status, s.reason()),
            (StatusCode::SERVICE_UNAVAILABLE, "stdio_max_children")
        );
    }

    #[test]
    fn every_session_failure_is_counted_from_the_start() {
        let mut errors = leaky_errors();
        errors.extend([
            SessionError::Http(HttpError::Timeout(Duration::from_secs(1))),
            SessionError::Http(HttpError::TooLarge(1)),
            SessionError::Http(HttpError::Tls {
                failure: crate::tls::upstream::TlsFailure::UntrustedCertificate,
                detail: String::new(),
            }),
            SessionError::Expired,
            SessionError::Saturated {
                limit: 1,
                waited: Duration::from_secs(1),
            },
        ]);
        let produced: std::collections::BTreeSet<&str> = errors.iter().map(reason).collect();
        let listed: std::collections::BTreeSet<&str> = RejectionKind::SESSION_FAILURES
            .iter()
            .map(|k| k.reason())
            .collect();
        assert_eq!(produced, listed);
    }
}
