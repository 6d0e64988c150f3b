//! The Streamable HTTP transport's front door: routing by path and method,
//! the shared reply builders and header checks, session resolution
//! (`Mcp-Session-Id`, `MCP-Protocol-Version`), and DELETE. POST and GET
//! live in `post` and `get_stream`.

use std::sync::Arc;

use http::header::{
    ACCEPT, ALLOW, AUTHORIZATION, CACHE_CONTROL, CONTENT_TYPE, HeaderMap, HeaderValue,
    WWW_AUTHENTICATE,
};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::{Value, json};

use super::Shared;
use super::config::{CredentialView, LegacyServerConfig};
use super::get_stream::get;
use super::jsonrpc::{RpcError, error_response};
use super::post::post;
use super::session::Session;
use super::sse_writer::{Body, empty_body, full_body};

pub(crate) const SESSION_HEADER: &str = "mcp-session-id";
pub(crate) const VERSION_HEADER: &str = "mcp-protocol-version";

/// Why a connection ended without its response: the reply carrying it is never sent, the
/// service fails instead, and hyper closes the connection (`Faults::drop_next_call_response`).
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the response was dropped on purpose (fault injection)")]
pub(crate) struct DroppedResponse;

/// A reply that `serve` turns into a connection closed without a response.
pub(crate) fn dropped() -> Response<Body> {
    let mut r = Response::new(empty_body());
    r.extensions_mut().insert(DroppedResponse);
    r
}

/// Entry point of the hyper service.
pub(crate) async fn serve(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Body>, DroppedResponse> {
    let reply = if req.uri().path() != shared.config.path {
        status_reply(StatusCode::NOT_FOUND)
    } else if let Err(refusal) = credential_of(&shared.config, req.headers()) {
        refusal.reply()
    } else {
        match *req.method() {
            Method::POST => post(&shared, req).await,
            Method::GET => get(&shared, &req),
            Method::DELETE => delete(&shared, &req).await,
            _ => not_allowed(&shared),
        }
    };
    if let Some(dropped) = reply.extensions().get::<DroppedResponse>() {
        return Err(*dropped);
    }
    let status = reply.status();
    if status.is_client_error() || status.is_server_error() {
        shared.stats.record_http_error(status.as_u16());
    }
    Ok(reply)
}

// ----- replies ----------------------------------------------------------

fn status_reply(status: StatusCode) -> Response<Body> {
    let mut r = Response::new(empty_body());
    *r.status_mut() = status;
    r
}

pub(crate) fn accepted() -> Response<Body> {
    status_reply(StatusCode::ACCEPTED)
}

fn with_session(mut r: Response<Body>, session: Option<&str>) -> Response<Body> {
    if let Some(Ok(v)) = session.map(HeaderValue::from_str) {
        r.headers_mut().insert(SESSION_HEADER, v);
    }
    r
}

pub(crate) fn json_reply(
    status: StatusCode,
    body: &Value,
    session: Option<&str>,
) -> Response<Body> {
    let mut r = Response::new(full_body(body.to_string()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    with_session(r, session)
}

/// An HTTP-level failure with a JSON-RPC error body (`id: null`).
pub(crate) fn error_reply(
    status: StatusCode,
    code: i64,
    message: impl Into<String>,
) -> Response<Body> {
    let body = error_response(&Value::Null, &RpcError::new(code, message));
    json_reply(status, &body, None)
}

pub(crate) fn sse_reply(body: Body, session: Option<&str>) -> Response<Body> {
    let mut r = Response::new(body);
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    with_session(r, session)
}

pub(crate) fn not_allowed(shared: &Shared) -> Response<Body> {
    let mut allow = vec!["POST"];
    if !shared.config.stateless && shared.config.get_stream_enabled {
        allow.push("GET");
    }
    if !shared.config.stateless && shared.config.delete_enabled {
        allow.push("DELETE");
    }
    let mut r = error_reply(
        StatusCode::METHOD_NOT_ALLOWED,
        RpcError::INVALID_REQUEST,
        "Method Not Allowed",
    );
    if let Ok(v) = HeaderValue::from_str(&allow.join(", ")) {
        r.headers_mut().insert(ALLOW, v);
    }
    r
}

// ----- header checks -----------------------------------------------------

pub(crate) fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Whether `Accept` admits `mime` (wildcards included).
pub(crate) fn accepts(headers: &HeaderMap, mime: &str) -> bool {
    let major = mime.split('/').next().unwrap_or_default();
    headers
        .get_all(ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|part| part.split(';').next().unwrap_or_default().trim())
        .any(|t| t == mime || t == "*/*" || t.strip_suffix("/*").is_some_and(|m| m == major))
}

pub(crate) fn is_json_content(headers: &HeaderMap) -> bool {
    header(headers, CONTENT_TYPE.as_str()).is_some_and(|ct| {
        ct.split(';')
            .next()
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
    })
}

/// Why a request was turned away; becomes an error reply.
pub(crate) struct Refusal {
    status: StatusCode,
    code: i64,
    message: String,
    bearer_challenge: bool,
}

impl Refusal {
    fn new(status: StatusCode, code: i64, message: impl Into<String>) -> Self {
        Refusal {
            status,
            code,
            message: message.into(),
            bearer_challenge: false,
        }
    }

    fn with_bearer_challenge(mut self) -> Self {
        self.bearer_challenge = true;
        self
    }

    pub(crate) fn reply(self) -> Response<Body> {
        let mut r = error_reply(self.status, self.code, self.message);
        if self.bearer_challenge {
            r.headers_mut()
                .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

/// The configured credential a request presents: `Ok(None)` when it presents none and the
/// server requires none, a 401 refusal when the server requires one and it has none of them.
pub(crate) fn credential_of<'a>(
    config: &'a LegacyServerConfig,
    headers: &HeaderMap,
) -> Result<Option<&'a CredentialView>, Refusal> {
    let presented = header(headers, AUTHORIZATION.as_str());
    let known = config
        .credentials
        .iter()
        .find(|c| Some(c.authorization.as_str()) == presented);
    if config.credentials.is_empty() || config.credentials_optional {
        return Ok(known);
    }
    known.map(Some).ok_or_else(|| {
        Refusal::new(
            StatusCode::UNAUTHORIZED,
            RpcError::INVALID_REQUEST,
            "Unauthorized: a valid bearer token is required",
        )
        .with_bearer_challenge()
    })
}

/// The session a request belongs to, or the HTTP reply refusing it. In
/// stateless mode every request gets a fresh throw-away session.
pub(crate) fn resolve_session(
    shared: &Arc<Shared>,
    headers: &HeaderMap,
) -> Result<Arc<Session>, Refusal> {
    let version = header(headers, VERSION_HEADER);
    if shared.config.stateless {
        if let Some(v) = version
            && !shared.config.protocol_versions.iter().any(|s| s == v)
        {
            return Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                RpcError::INVALID_REQUEST,
                format!("Bad Request: unsupported protocol version {v}"),
            ));
        }
        return Ok(Arc::new(Session::new(
            None,
            shared.config.negotiate(version),
            json!({}),
            json!({}),
            shared.config.server_request_ids,
            &shared.shutdown,
        )));
    }
    let Some(id) = header(headers, SESSION_HEADER) else {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            RpcError::INVALID_REQUEST,
            "Bad Request: Mcp-Session-Id header is required",
        ));
    };
    let Some(session) = shared.sessions.get(id) else {
        return Err(Refusal::new(
            StatusCode::NOT_FOUND,
            RpcError::SESSION_NOT_FOUND,
            "Session not found",
        ));
    };
    if session.authorization.is_some()
        && session.authorization.as_deref() != header(headers, AUTHORIZATION.as_str())
    {
        return Err(Refusal::new(
            StatusCode::FORBIDDEN,
            RpcError::INVALID_REQUEST,
            "Forbidden: this session belongs to another credential",
        ));
    }
    if let Some(v) = version
        && v != session.protocol_version
    {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            RpcError::INVALID_REQUEST,
            format!(
                "Bad Request: MCP-Protocol-Version {v} does not match the negotiated {}",
                session.protocol_version
            ),
        ));
    }
    Ok(session)
}

// ----- DELETE ----------------------------------------------------------------

async fn delete(shared: &Arc<Shared>, req: &Request<Incoming>) -> Response<Body> {
    let config = &shared.config;
    if config.stateless || !config.delete_enabled {
        return not_allowed(shared);
    }
    if !config.delete_delay.is_zero() {
        tokio::time::sleep(config.delete_delay).await;
    }
    let session = match resolve_session(shared, req.headers()) {
        Ok(s) => s,
        Err(refusal) => return refusal.reply(),
    };
    if config.get_stream_outlives_delete
        && let Some(stream) = session.detach_get_stream()
    {
        let shutdown = shared.shutdown.clone();
        shared.tasks.spawn(async move {
            shutdown.cancelled().await;
            drop(stream);
        });
    }
    if let Some(id) = &session.id
        && shared.sessions.end(id)
    {
        shared.stats.record_session_deleted();
    }
    status_reply(StatusCode::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_parsing_handles_lists_params_and_wildcards() {
        let mut h = HeaderMap::new();
        h.insert(
            ACCEPT,
            HeaderValue::from_static("application/json;q=0.9, text/event-stream"),
        );
        assert!(accepts(&h, "application/json"));
        assert!(accepts(&h, "text/event-stream"));
        h.insert(ACCEPT, HeaderValue::from_static("text/*"));
        assert!(accepts(&h, "text/event-stream"));
        assert!(!accepts(&h, "application/json"));
        h.insert(ACCEPT, HeaderValue::from_static("*/*"));
        assert!(accepts(&h, "application/json"));
        assert!(!accepts(&HeaderMap::new(), "application/json"));
    }
}
