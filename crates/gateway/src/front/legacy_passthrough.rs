//! The dual-era front: legacy clients (2025-03-26 … 2025-11-25) on the modern endpoint,
//! passed through to the legacy server as legacy sessions, server requests and all.
//!
//! **Which requests.** The spec lets a dual-era server choose per request (digest §6.6):
//! - a legacy `initialize` (POST): legacy semantics begin here. An `initialize` sent as a
//!   2026-07-28 request (a 2026-07-28 `MCP-Protocol-Version` header, or that version in
//!   `_meta`) is not one: it takes the modern path, where `initialize` no longer exists
//!   (404, -32601, as the conformance suite's `server-stateless` scenario expects).
//! - a POST naming a session (`Mcp-Session-Id`) without a 2026-07-28 `MCP-Protocol-Version`
//!   (2025-03-26 clients send no version header at all). It is forwarded before any modern
//!   parsing, since it may be a notification, a batch, or the client's answer to a server
//!   request.
//! - a GET (the standalone stream) or DELETE carrying a session id this gateway sealed; any
//!   other GET or DELETE still gets 405.
//!
//! Everything else, `Mcp-Session-Id` or not, takes the modern path.
//!
//! **Session ids.** The legacy server's `Mcp-Session-Id` `S` never reaches the client: it gets
//! `T`, `S` sealed with the caller's principal under the state key ring
//! ([`crate::state::session_ticket`]). Every later request presents `T`; any replica opens it
//! back to `S`, so passthrough needs no affinity and no store. A `T` that does not open (forged,
//! tampered, sealed under a retired key, a `requestState` presented as a session id) or that was
//! issued to another principal is answered 404, as a legacy server answers an unknown session,
//! so the client initializes again.
//!
//! **Forwarding.** The request goes to `upstream.url` as it came: method, body, `Content-Type`,
//! `Accept`, `MCP-Protocol-Version` (not on `initialize`, which negotiates in its body),
//! `Last-Event-ID`, trace context and the credentials `[auth] upstream_credentials` asks for,
//! with `Mcp-Session-Id: S`. The answer comes back unchanged and unbuffered (status, JSON or
//! SSE body, `Content-Type`, `Cache-Control`, `Allow`, `Retry-After`), with `S` swapped back to
//! `T`. An SSE body is relayed event by event through the policy stage
//! ([`super::passthrough_review`]): the legacy server's questions are reviewed as a 2026-07-28
//! client's are, and a refused one is answered to the server and never relayed. The front's
//! limits apply as to any request: `Origin`, authentication (before anything
//! else is read), body size and deadline, request slots. A POST's response stream is cut after
//! `upstream.call_timeout` (`limit_hits_total{limit="legacy_passthrough_call_timeout"}`); a GET
//! stream lives until the client leaves or the gateway shuts down (the client reopens it, on
//! any replica). A GET stream gives its request slot back once it starts; instead it counts
//! against `legacy_clients.max_get_streams` per replica (503),
//! `legacy_clients.max_get_streams_per_principal` per caller (429) and the newcomers' reserve
//! (429 for a caller holding some; see [`crate::fair_share`]).
//!
//! **Only Streamable HTTP upstreams.** A legacy session must be addressable by id from any
//! replica. The 2024-11-05 HTTP+SSE transport ties a session to one long-lived connection, and
//! a stdio session is one child process of one replica, so with those upstreams `initialize` is
//! answered like a modern-only server answers it: 400, -32022, and the supported versions.
//! A stateless legacy server (one that issues no session id) can answer `initialize`, but the
//! client's later requests carry no session id and take the modern path.
//!
//! **Off.** `legacy_clients.enabled = false` answers every legacy `initialize`, and every
//! request on a session opened before, the same way.

use std::convert::Infallible;

use crate::legacy::http::UpstreamBody;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Response, header};
use http_body_util::{BodyExt, StreamBody};
use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::deps::Front;
use super::long_lived::{self, StreamPlace, StreamRefusal};
use super::passthrough_review::{AskingCall, Screen};
use super::respond::Body;
use crate::auth::Authenticator;
use crate::caller_scope::Caller;
use crate::error::{Rejection, RejectionKind};
use crate::legacy::session::{SESSION_HEADER, SessionError, VERSION_HEADER};
use crate::legacy::upstream::Upstream;
use crate::metrics::{Limit, LimitHits};
use crate::state::{SessionTicket, now_secs};
use crate::upstream_error::session_rejection;
use mrtr_wire::protocol::SUPPORTED_VERSIONS;

const LAST_EVENT_ID: HeaderName = HeaderName::from_static("last-event-id");

/// Request headers carried to the legacy server as they are.
const FORWARDED: [HeaderName; 3] = [header::CONTENT_TYPE, header::ACCEPT, LAST_EVENT_ID];
/// Response headers carried back to the client as they are.
const RETURNED: [HeaderName; 4] = [
    header::CONTENT_TYPE,
    header::CACHE_CONTROL,
    header::ALLOW,
    header::RETRY_AFTER,
];

/// Whether a POST belongs to a legacy client's session: it names a session and no modern
/// protocol version.
pub fn is_session_post(headers: &HeaderMap) -> bool {
    if !headers.contains_key(SESSION_HEADER) {
        return false;
    }
    match headers.get(VERSION_HEADER) {
        None => true,
        Some(v) => v
            .to_str()
            .map_or(true, |v| !SUPPORTED_VERSIONS.contains(&v)),
    }
}

/// Whether an `initialize` is a legacy client's: neither its `MCP-Protocol-Version` header
/// nor its `_meta` names a 2026-07-28 (modern) version. Legacy clients send no header on
/// `initialize` (or their own legacy version) and no modern `_meta`.
pub fn is_legacy_initialize(headers: &HeaderMap, params: Option<&Value>) -> bool {
    let modern = |v: Option<&str>| v.is_some_and(|v| SUPPORTED_VERSIONS.contains(&v));
    let header = headers.get(VERSION_HEADER).and_then(|v| v.to_str().ok());
    let meta = params
        .and_then(|p| p.pointer("/_meta"))
        .and_then(|m| m.get(mrtr_wire::protocol::meta::PROTOCOL_VERSION))
        .and_then(Value::as_str);
    !modern(header) && !modern(meta)
}

/// The ticket behind a request's session id, if it is one this gateway sealed.
fn ticket_of(front: &Front, headers: &HeaderMap) -> Option<(String, SessionTicket)> {
    let token = headers.get(SESSION_HEADER)?.to_str().ok()?;
    match front.codec.open_session(token) {
        Ok(t) => Some((token.to_string(), t)),
        Err(e) => {
            tracing::debug!(reason = e.reason(), "a legacy session id did not open");
            None
        }
    }
}

/// Whether a GET or DELETE is on a session this gateway sealed (if not, the front answers
/// 405 as before).
pub fn is_session_bodyless(front: &Front, method: &Method, headers: &HeaderMap) -> bool {
    matches!(*method, Method::GET | Method::DELETE) && ticket_of(front, headers).is_some()
}

/// The answer to a session id that cannot be served (`kind` says why, for the operator): the
/// same "not found" a legacy server gives an unknown session.
fn unknown_session(kind: RejectionKind) -> Rejection {
    Rejection::new(
        kind,
        "Session not found: this Mcp-Session-Id was not issued by this gateway, belongs to another \
         caller, or was sealed under a retired key; initialize a new session",
    )
}

fn kind_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "get",
        Method::DELETE => "delete",
        _ => "post",
    }
}

/// Serves a request on an existing legacy session (a POST, the GET stream, a DELETE), for a
/// caller already authenticated as `principal`.
pub async fn serve_session(
    front: &Front,
    method: Method,
    headers: &HeaderMap,
    body: Option<Bytes>,
    principal: &str,
    caller: &Caller,
) -> Result<Response<Body>, Rejection> {
    if !front.config().legacy_clients.enabled {
        return Err(passthrough_off(None));
    }
    let Some((token, ticket)) = ticket_of(front, headers) else {
        return Err(unknown_session(RejectionKind::LegacySessionUnknown));
    };
    if ticket.principal != principal {
        tracing::warn!(%principal, "a legacy session id issued to another principal was presented");
        return Err(unknown_session(RejectionKind::LegacySessionWrongPrincipal));
    }
    // The standalone GET stream lives as long as the client keeps it: it counts against its
    // own cap and the caller's quota instead of a request slot.
    let place = if method == Method::GET {
        Some(admit_get_stream(front, caller)?)
    } else {
        None
    };
    let kind = kind_label(&method);
    let auth = front.auth();
    let response = forward(
        front,
        &auth,
        Forward {
            kind,
            method,
            headers,
            session: Some((&token, &ticket)),
            principal,
            body,
        },
    )
    .await?;
    Ok(match place {
        Some(place) => {
            let mut response = super::respond::with_guard(response, place);
            long_lived::mark(&mut response);
            response
        }
        None => response,
    })
}

/// A place for one more passed-through GET stream: 503 when the replica holds
/// `legacy_clients.max_get_streams`, 429 when this caller holds its share, or holds some
/// and only the newcomers' reserve is left.
fn admit_get_stream(front: &Front, caller: &Caller) -> Result<StreamPlace, Rejection> {
    let limits = &front.config().legacy_clients;
    let refusal = match front
        .long_lived
        .admit_legacy_get(caller, &limits.get_stream_share)
    {
        Ok(place) => return Ok(place),
        Err(r) => r,
    };
    let (limit, rejection) = match refusal {
        StreamRefusal::Full => (
            Limit::MaxLegacyGetStreams,
            Rejection::new(
                RejectionKind::MaxLegacyGetStreams,
                format!(
                    "this gateway replica holds its limit of {} legacy GET streams (legacy_clients.max_get_streams); retry shortly",
                    limits.max_get_streams
                ),
            ),
        ),
        StreamRefusal::CallerShare => (
            Limit::MaxLegacyGetStreamsPerPrincipal,
            Rejection::new(
                RejectionKind::LegacyGetStreamQuota,
                format!(
                    "you already hold {} legacy GET streams on this replica (legacy_clients.max_get_streams_per_principal); close one first",
                    limits.get_stream_share.per_caller
                ),
            ),
        ),
        StreamRefusal::Reserve => (
            Limit::LegacyGetStreamsNewcomerReserve,
            Rejection::new(
                RejectionKind::LegacyGetStreamQuota,
                format!(
                    "this replica's last {} legacy GET streams are kept for callers holding none (quotas.newcomer_reserve), and you hold some; close one first or retry shortly",
                    limits.get_stream_share.reserve
                ),
            ),
        ),
    };
    front.limits.hit(limit);
    Err(rejection)
}

/// Serves a legacy `initialize` (already authenticated as `principal`); `params` are the
/// request's, for the error a non-HTTP upstream gets.
pub async fn serve_initialize(
    front: &Front,
    headers: &HeaderMap,
    body: Bytes,
    params: Option<&Value>,
    principal: &str,
) -> Result<Response<Body>, Rejection> {
    if !front.config().legacy_clients.enabled {
        return Err(passthrough_off(params));
    }
    if !matches!(*front.sessions.upstream(), Upstream::Http(_)) {
        let requested = params
            .and_then(|p| p.get("protocolVersion"))
            .cloned()
            .unwrap_or(Value::Null);
        return Err(Rejection::new(
            RejectionKind::LegacyPassthroughUnavailable,
            format!(
                "legacy clients are passed through only to a Streamable HTTP legacy server (upstream.transport is {:?}): \
                 a passed-through session must be addressable by id from any replica; use protocol version 2026-07-28",
                front.config().upstream.transport.as_str()
            ),
        )
        .with_data(serde_json::json!({"supported": SUPPORTED_VERSIONS, "requested": requested})));
    }
    let auth = front.auth();
    forward(
        front,
        &auth,
        Forward {
            kind: "initialize",
            method: Method::POST,
            headers,
            session: None,
            principal,
            body: Some(body),
        },
    )
    .await
}

/// The answer to a legacy client when `legacy_clients.enabled = false`: what a 2026-07-28-only
/// server answers a legacy `initialize` (400, -32022, the supported versions).
fn passthrough_off(params: Option<&Value>) -> Rejection {
    let requested = params
        .and_then(|p| p.get("protocolVersion"))
        .cloned()
        .unwrap_or(Value::Null);
    Rejection::new(
        RejectionKind::LegacyPassthroughUnavailable,
        "this gateway serves only protocol version 2026-07-28 clients (legacy_clients.enabled = false)",
    )
    .with_data(serde_json::json!({"supported": SUPPORTED_VERSIONS, "requested": requested}))
}

struct Forward<'a> {
    /// Metric label: initialize, post, get, delete.
    kind: &'static str,
    method: Method,
    headers: &'a HeaderMap,
    /// The client's session id and what it opened to (`None` for `initialize`).
    session: Option<(&'a str, &'a SessionTicket)>,
    principal: &'a str,
    body: Option<Bytes>,
}

async fn forward(
    front: &Front,
    auth: &Authenticator,
    f: Forward<'_>,
) -> Result<Response<Body>, Rejection> {
    let upstream = front.sessions.upstream();
    let Upstream::Http(http) = &*upstream else {
        // The upstream changed transport since the session began.
        return Err(unknown_session(
            RejectionKind::LegacySessionTransportChanged,
        ));
    };
    let mut out = super::handler::upstream_headers(f.headers, None, auth);
    for name in FORWARDED {
        if let Some(v) = f.headers.get(&name) {
            out.insert(name, v.clone());
        }
    }
    if f.kind != "initialize"
        && let Some(v) = f.headers.get(VERSION_HEADER)
    {
        out.insert(VERSION_HEADER, v.clone());
    }
    if let Some((_, ticket)) = f.session {
        let sid = HeaderValue::from_str(&ticket.upstream_session).map_err(|_| {
            Rejection::new(
                RejectionKind::LegacySessionUnsendable,
                "a sealed legacy session id holds bytes no header can carry",
            )
        })?;
        out.insert(SESSION_HEADER, sid);
    }
    front.metrics.passed_through(f.kind);
    let get = f.method == Method::GET;
    // What an answer to a refused question carries: the same credentials and session.
    let mut answer_headers = out.clone();
    answer_headers.remove(LAST_EVENT_ID);
    let asking = f.body.as_deref().and_then(AskingCall::of_body);
    let resp = http
        .send(f.method, out, f.body)
        .await
        .map_err(|e| session_rejection(&SessionError::Http(e)))?;
    let (parts, body) = resp.into_parts();

    let mut r = Response::new(super::respond::full(Bytes::new()));
    *r.status_mut() = parts.status;
    for name in RETURNED {
        for v in parts.headers.get_all(&name) {
            r.headers_mut().append(name.clone(), v.clone());
        }
    }
    if let Some(sid) = parts.headers.get(SESSION_HEADER) {
        let sid = sid.to_str().map_err(|_| {
            Rejection::new(
                RejectionKind::UpstreamProtocolError,
                "the legacy server sent an Mcp-Session-Id that is not visible ASCII",
            )
        })?;
        let client_id = match f.session {
            Some((token, ticket)) if ticket.upstream_session == sid => token.to_string(),
            _ => front
                .codec
                .seal_session(&SessionTicket {
                    upstream_session: sid.to_string(),
                    principal: f.principal.to_string(),
                    issued_at: now_secs(),
                })
                .map_err(|e| {
                    Rejection::new(
                        RejectionKind::LegacySessionTooLarge,
                        format!(
                            "the legacy server's session id is too long to seal within state.max_bytes ({} > {} bytes)",
                            e.size, e.limit
                        ),
                    )
                })?,
        };
        r.headers_mut().insert(
            SESSION_HEADER,
            HeaderValue::from_str(&client_id).expect("sealed ids are visible ASCII"),
        );
        // `initialize` learns the session here.
        answer_headers.insert(
            SESSION_HEADER,
            HeaderValue::from_str(sid).expect("checked visible ASCII above"),
        );
    }
    // Every SSE body may carry the legacy server's questions, and a JSON body a -32042 error
    // with URLs for the client: each passes the policy stage.
    let sse = crate::legacy::http::is_sse(&parts.headers);
    let json = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("application/json"));
    let screen = (sse || json).then(|| {
        let screen = Screen::new(
            front.engine.clone(),
            upstream.clone(),
            answer_headers,
            asking,
            front.limits.clone(),
        );
        if sse {
            r.headers_mut()
                .insert("x-accel-buffering", HeaderValue::from_static("no"));
            screen
        } else {
            screen.for_json()
        }
    });
    let ends = if get {
        // The standalone stream: until the client leaves or the gateway shuts down.
        Ends {
            // A child: the relay checks it for every chunk, and the shutdown token itself is
            // shared by every stream (see `connection::serve`).
            shutdown: Some(front.long_lived.shutdown().child_token()),
            deadline: None,
            hits: LimitHits::none(),
        }
    } else {
        Ends {
            shutdown: None,
            deadline: Some(Instant::now() + front.config().upstream.call_timeout),
            hits: front.limits.clone(),
        }
    };
    *r.body_mut() = relay(body, ends, screen);
    Ok(r)
}

/// When a relayed body is cut short.
struct Ends {
    shutdown: Option<CancellationToken>,
    deadline: Option<Instant>,
    /// Where a deadline cut is counted (nowhere for the standalone stream, which has none).
    hits: LimitHits,
}

async fn cancelled(t: &Option<CancellationToken>) {
    match t {
        Some(t) => t.cancelled().await,
        None => std::future::pending().await,
    }
}

async fn reached(d: Option<Instant>) {
    match d {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// The upstream body, frame by frame as it arrives; an upstream error ends it. An SSE body
/// goes through `screen` (the policy stage on the legacy server's questions) event by event,
/// a JSON body whole once it has arrived.
fn relay(body: UpstreamBody, ends: Ends, screen: Option<Screen>) -> Body {
    let start = (body, ends, screen);
    let frames = futures_util::stream::unfold(start, |(mut body, ends, mut screen)| async move {
        loop {
            let next = tokio::select! {
                biased;
                _ = cancelled(&ends.shutdown) => return None,
                _ = reached(ends.deadline) => {
                    ends.hits.hit(Limit::LegacyPassthroughCallTimeout);
                    tracing::warn!("cut a passed-through legacy response at upstream.call_timeout");
                    return None;
                }
                f = body.frame() => f,
            };
            let frame = match next {
                Some(Ok(frame)) => frame,
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "a passed-through legacy response broke");
                    return None;
                }
                None => {
                    // A gathered JSON body goes out now, reviewed.
                    let tail = match screen.take() {
                        Some(mut s) => s.finish().await,
                        None => Bytes::new(),
                    };
                    if tail.is_empty() {
                        return None;
                    }
                    let frame = hyper::body::Frame::data(tail);
                    return Some((Ok::<_, Infallible>(frame), (body, ends, None)));
                }
            };
            let frame = match (&mut screen, frame.into_data()) {
                (Some(s), Ok(data)) => match s.feed(&data).await {
                    Ok(out) if out.is_empty() => continue,
                    Ok(out) => hyper::body::Frame::data(out),
                    Err(_) => return None,
                },
                (_, Ok(data)) => hyper::body::Frame::data(data),
                (_, Err(frame)) => frame,
            };
            return Some((Ok::<_, Infallible>(frame), (body, ends, screen)));
        }
    });
    StreamBody::new(frames).boxed_unsync()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn a_session_post_names_a_session_and_no_modern_version() {
        assert!(is_session_post(&headers(&[("mcp-session-id", "x")])));
        assert!(is_session_post(&headers(&[
            ("mcp-session-id", "x"),
            ("mcp-protocol-version", "2025-06-18")
        ])));
        assert!(!is_session_post(&headers(&[
            ("mcp-session-id", "x"),
            ("mcp-protocol-version", "2026-07-28")
        ])));
        assert!(!is_session_post(&headers(&[(
            "mcp-protocol-version",
            "2025-06-18"
        )])));
        assert!(!is_session_post(&HeaderMap::new()));
    }

    #[test]
    fn an_initialize_is_legacy_unless_a_2026_version_is_in_its_header_or_meta() {
        let legacy = serde_json::json!({"protocolVersion": "2025-11-25", "capabilities": {}});
        assert!(is_legacy_initialize(&HeaderMap::new(), Some(&legacy)));
        assert!(is_legacy_initialize(
            &headers(&[("mcp-protocol-version", "2025-11-25")]),
            Some(&legacy)
        ));
        assert!(is_legacy_initialize(&HeaderMap::new(), None));
        assert!(!is_legacy_initialize(
            &headers(&[("mcp-protocol-version", "2026-07-28")]),
            Some(&legacy)
        ));
        let modern_meta = serde_json::json!({
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}
        });
        assert!(!is_legacy_initialize(&HeaderMap::new(), Some(&modern_meta)));
    }
}
