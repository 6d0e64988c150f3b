//! POST handling: recording each message, `initialize` (session
//! creation), notifications (`initialized`, `cancelled`), answers to server
//! requests, client requests answered as JSON or over an SSE call stream
//! (with injected call-stream faults), and 2025-03-26 batches.

use std::sync::Arc;

use bytes::Bytes;
use http::header::HeaderMap;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde_json::{Value, json};

use super::Shared;
use super::config::SseFraming;
use super::context::ToolContext;
use super::dispatch::run_cancellable;
use super::faults::CallStreamFault;
use super::jsonrpc::{Message, RpcError, error_response, response};
use super::session::{Session, mint_session_id};
use super::sse_writer::{Body, OutboundStream, StreamKind, StreamOptions, encode_event};
use super::stats::{MessageKind, ReceivedMessage};
use super::transport::{
    SESSION_HEADER, VERSION_HEADER, accepted, accepts, credential_of, error_reply, header,
    is_json_content, json_reply, resolve_session, sse_reply,
};

/// The only protocol version that allows JSON-RPC batches.
const BATCH_VERSION: &str = "2025-03-26";

pub(crate) async fn post(shared: &Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    if let Some(status) = shared.faults.take_post_failure() {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return error_reply(status, RpcError::INTERNAL_ERROR, "injected failure");
    }
    let (parts, body) = req.into_parts();
    let headers = parts.headers;
    let config = &shared.config;
    if config.require_accept
        && !(accepts(&headers, "application/json")
            && (config.json_response || accepts(&headers, "text/event-stream")))
    {
        return error_reply(
            StatusCode::NOT_ACCEPTABLE,
            RpcError::INVALID_REQUEST,
            "Not Acceptable: Accept must include application/json and text/event-stream",
        );
    }
    if !is_json_content(&headers) {
        return error_reply(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            RpcError::INVALID_REQUEST,
            "Unsupported Media Type: Content-Type must be application/json",
        );
    }
    let bytes: Bytes = match Limited::new(body, config.max_body_bytes).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => {
            return error_reply(
                StatusCode::PAYLOAD_TOO_LARGE,
                RpcError::INVALID_REQUEST,
                "request body too large or unreadable",
            );
        }
    };
    let value: Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(e) => {
            return error_reply(
                StatusCode::BAD_REQUEST,
                RpcError::PARSE_ERROR,
                format!("Parse error: {e}"),
            );
        }
    };
    match value {
        Value::Array(items) => batch(shared, &headers, items).await,
        single => post_single(shared, &headers, single).await,
    }
}

fn record(shared: &Shared, headers: &HeaderMap, raw: &Value, parsed: &Result<Message, RpcError>) {
    let (kind, method, id) = match parsed {
        Ok(Message::Request { id, method, .. }) => {
            (MessageKind::Request, Some(method.clone()), Some(id.clone()))
        }
        Ok(Message::Notification { method, .. }) => {
            (MessageKind::Notification, Some(method.clone()), None)
        }
        Ok(Message::Response { id, outcome }) => (
            if outcome.is_ok() {
                MessageKind::Response
            } else {
                MessageKind::ErrorResponse
            },
            None,
            Some(id.clone()),
        ),
        Err(_) => (MessageKind::Invalid, None, None),
    };
    let keep = shared.config.record_messages;
    shared.stats.record_message(
        ReceivedMessage {
            seq: 0,
            session_id: header(headers, SESSION_HEADER).map(str::to_owned),
            protocol_version_header: header(headers, VERSION_HEADER).map(str::to_owned),
            traceparent: header(headers, "traceparent").map(str::to_owned),
            kind,
            method,
            id,
            raw: if keep { raw.clone() } else { Value::Null },
        },
        keep,
    );
}

async fn post_single(shared: &Arc<Shared>, headers: &HeaderMap, value: Value) -> Response<Body> {
    let parsed = Message::classify(&value);
    record(shared, headers, &value, &parsed);
    let message = match parsed {
        Ok(m) => m,
        Err(e) => return error_reply(StatusCode::BAD_REQUEST, e.code, e.message),
    };
    if let Message::Request { id, method, params } = &message
        && method == "initialize"
    {
        return initialize(shared, headers, id, params);
    }
    if let Message::Request { method, .. } = &message
        && shared.faults.take_expire_before(method)
        && let Some(sid) = header(headers, SESSION_HEADER)
    {
        shared.faults.expire_session(sid);
    }
    let session = match resolve_session(shared, headers) {
        Ok(s) => s,
        Err(refusal) => return refusal.reply(),
    };
    match message {
        Message::Notification { method, params } => {
            on_notification(shared, &session, &method, &params);
            accepted()
        }
        Message::Response { id, outcome } => {
            on_response(shared, &session, &id, outcome);
            accepted()
        }
        Message::Request { id, method, params } => {
            request(shared, session, id, method, params).await
        }
    }
}

fn on_notification(shared: &Shared, session: &Session, method: &str, params: &Value) {
    match method {
        "notifications/initialized" => session.mark_initialized(),
        "notifications/cancelled" => {
            if let Some(id) = params.get("requestId") {
                shared
                    .stats
                    .record_cancellation(session.id.clone(), id.clone());
                session.cancel_call(id);
            }
        }
        _ => {}
    }
}

fn on_response(shared: &Shared, session: &Session, id: &Value, outcome: Result<Value, RpcError>) {
    if !session.resolve_server_request(id, outcome) {
        shared.stats.record_unmatched_response();
    }
}

fn initialize(
    shared: &Arc<Shared>,
    headers: &HeaderMap,
    id: &Value,
    params: &Value,
) -> Response<Body> {
    if let Some(status) = shared.faults.initialize_status() {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return error_reply(
            status,
            RpcError::INTERNAL_ERROR,
            "injected initialize failure",
        );
    }
    let config = &shared.config;
    let version = config.negotiate(params.get("protocolVersion").and_then(Value::as_str));
    // The front door already refused a request without a listed credential.
    let credential = credential_of(config, headers).ok().flatten();
    let session_id = (!config.stateless).then(mint_session_id);
    let mut session = Session::new(
        session_id,
        version.clone(),
        params.get("capabilities").cloned().unwrap_or(json!({})),
        params.get("clientInfo").cloned().unwrap_or(json!({})),
        config.server_request_ids,
        &shared.shutdown,
    );
    session.authorization = credential.map(|c| c.authorization.clone());
    let session = Arc::new(session);
    if !config.stateless {
        shared.sessions.insert(session.clone());
        shared.stats.record_session_opened();
    }
    let capabilities = credential
        .and_then(|c| c.capabilities.clone())
        .or_else(|| config.capabilities.clone())
        .unwrap_or_else(|| shared.handlers().derived_capabilities());
    let mut result = json!({
        "protocolVersion": version,
        "capabilities": capabilities,
        "serverInfo": {
            "name": config.server_info.name,
            "version": config.server_info.version,
        },
    });
    if let Some(instructions) = credential
        .and_then(|c| c.instructions.as_ref())
        .or(config.instructions.as_ref())
    {
        result["instructions"] = json!(instructions);
    }
    let message = response(id, &Ok(result));
    if config.json_response {
        return json_reply(StatusCode::OK, &message, session.id.as_deref());
    }
    let (stream, body) = open_call_stream(shared, &session, 1);
    stream.send_final(&message);
    sse_reply(body, session.id.as_deref())
}

/// A call stream, not yet primed.
fn new_call_stream(
    shared: &Shared,
    session: &Session,
    outstanding: usize,
) -> (Arc<OutboundStream>, Body) {
    let framing = shared.config.framing;
    OutboundStream::open(
        session.next_stream_number(),
        StreamKind::Call,
        StreamOptions {
            framing,
            with_ids: framing == SseFraming::TypeScript,
            log_limit: shared.config.event_log_limit,
            outstanding,
        },
        session.event_seq.clone(),
        None,
    )
}

/// A call stream, primed under TypeScript framing.
fn open_call_stream(
    shared: &Shared,
    session: &Session,
    outstanding: usize,
) -> (Arc<OutboundStream>, Body) {
    let (stream, body) = new_call_stream(shared, session, outstanding);
    if stream.framing() == SseFraming::TypeScript {
        stream.prime(None);
    }
    (stream, body)
}

/// Set up the fault's effect on a fresh call stream (before priming).
fn apply_fault(stream: &OutboundStream, fault: &CallStreamFault) {
    let ts = stream.framing() == SseFraming::TypeScript;
    match fault {
        CallStreamFault::MalformedEvent => {
            if ts {
                stream.prime(None);
            }
            stream.send_raw(encode_event(
                stream.framing(),
                None,
                "{\"jsonrpc\": \"2.0\", \"meth",
            ));
        }
        CallStreamFault::OversizeEvent(size) => {
            if ts {
                stream.prime(None);
            }
            let base = json!({"jsonrpc": "2.0", "method": "notifications/message",
                "params": {"level": "info", "data": ""}})
            .to_string()
            .len();
            let padding = "x".repeat(size.saturating_sub(base));
            let data = json!({"jsonrpc": "2.0", "method": "notifications/message",
                "params": {"level": "info", "data": padding}});
            stream.send_raw(encode_event(stream.framing(), None, &data.to_string()));
        }
        CallStreamFault::CloseAfterHeaders => stream.cut_after(0),
        CallStreamFault::CloseAfterFirstEvent => {
            stream.cut_after(1);
            if ts {
                stream.prime(None);
            }
        }
        CallStreamFault::HangAfterHeaders => stream.mute(),
        CallStreamFault::Poll { retry_ms } => {
            stream.enable_ids();
            stream.prime(Some(*retry_ms));
            stream.cut_connection();
        }
    }
}

async fn request(
    shared: &Arc<Shared>,
    session: Arc<Session>,
    id: Value,
    method: String,
    params: Value,
) -> Response<Body> {
    let progress_token = params.pointer("/_meta/progressToken").cloned();
    let call = session.begin_call(&id);
    // A dropped response is never sent, so its call gets no stream (it cannot ask anything).
    let dropped = method == "tools/call" && shared.faults.take_dropped_call_response();
    if shared.config.json_response || dropped {
        let ctx = ToolContext::new(
            shared.clone(),
            session.clone(),
            id.clone(),
            None,
            progress_token,
            Ok(call),
        );
        let outcome = run_cancellable(ctx, &method, params).await;
        if dropped {
            return super::transport::dropped();
        }
        let outcome = outcome.unwrap_or_else(|| {
            Err(RpcError::new(
                RpcError::REQUEST_CANCELLED,
                "Request cancelled",
            ))
        });
        return json_reply(
            StatusCode::OK,
            &response(&id, &outcome),
            session.id.as_deref(),
        );
    }

    let fault = if method == "tools/call" {
        shared.faults.take_call_stream_fault()
    } else {
        None
    };
    let (stream, body) = match &fault {
        None => open_call_stream(shared, &session, 1),
        Some(fault) => {
            let (stream, body) = new_call_stream(shared, &session, 1);
            apply_fault(&stream, fault);
            (stream, body)
        }
    };
    session.register_stream(stream.clone());
    let ctx = ToolContext::new(
        shared.clone(),
        session.clone(),
        id.clone(),
        Some(stream.clone()),
        progress_token,
        Ok(call),
    );
    let respond_to_cancelled = shared.config.respond_to_cancelled;
    let session_id = session.id.clone();
    shared.tasks.spawn(async move {
        let outcome = run_cancellable(ctx, &method, params).await;
        match outcome {
            Some(outcome) => {
                stream.send_final(&response(&id, &outcome));
            }
            None if respond_to_cancelled => {
                let error = RpcError::new(RpcError::REQUEST_CANCELLED, "Request cancelled");
                stream.send_final(&error_response(&id, &error));
            }
            None => stream.finish_without_response(),
        }
        if !stream.must_outlive_call() {
            session.unregister_stream(stream.number);
        }
    });
    sse_reply(body, session_id.as_deref())
}

/// A JSON-RPC batch, accepted only when the session negotiated 2025-03-26.
async fn batch(shared: &Arc<Shared>, headers: &HeaderMap, items: Vec<Value>) -> Response<Body> {
    let parsed: Vec<_> = items.iter().map(Message::classify).collect();
    for (raw, p) in items.iter().zip(&parsed) {
        record(shared, headers, raw, p);
    }
    if items.is_empty() {
        return error_reply(
            StatusCode::BAD_REQUEST,
            RpcError::INVALID_REQUEST,
            "empty batch",
        );
    }
    let session = match resolve_session(shared, headers) {
        Ok(s) => s,
        Err(refusal) => return refusal.reply(),
    };
    if session.protocol_version != BATCH_VERSION {
        return error_reply(
            StatusCode::BAD_REQUEST,
            RpcError::INVALID_REQUEST,
            format!("batches are only accepted under protocol {BATCH_VERSION}"),
        );
    }
    let mut messages = Vec::with_capacity(parsed.len());
    for p in parsed {
        match p {
            Ok(Message::Request { method, .. }) if method == "initialize" => {
                return error_reply(
                    StatusCode::BAD_REQUEST,
                    RpcError::INVALID_REQUEST,
                    "initialize must not be batched",
                );
            }
            Ok(m) => messages.push(m),
            Err(e) => return error_reply(StatusCode::BAD_REQUEST, e.code, e.message),
        }
    }
    let mut calls = Vec::new();
    for m in messages {
        match m {
            Message::Notification { method, params } => {
                on_notification(shared, &session, &method, &params);
            }
            Message::Response { id, outcome } => on_response(shared, &session, &id, outcome),
            Message::Request { id, method, params } => calls.push((id, method, params)),
        }
    }
    if calls.is_empty() {
        return accepted();
    }
    let make_ctx = |id: &Value, params: &Value, stream: Option<Arc<OutboundStream>>| {
        ToolContext::new(
            shared.clone(),
            session.clone(),
            id.clone(),
            stream,
            params.pointer("/_meta/progressToken").cloned(),
            Ok(session.begin_call(id)),
        )
    };
    if shared.config.json_response {
        let runs = calls.into_iter().map(|(id, method, params)| {
            let ctx = make_ctx(&id, &params, None);
            async move {
                let outcome = run_cancellable(ctx, &method, params).await;
                let outcome = outcome.unwrap_or_else(|| {
                    Err(RpcError::new(
                        RpcError::REQUEST_CANCELLED,
                        "Request cancelled",
                    ))
                });
                response(&id, &outcome)
            }
        });
        let replies = futures_util::future::join_all(runs).await;
        return json_reply(
            StatusCode::OK,
            &Value::Array(replies),
            session.id.as_deref(),
        );
    }
    let (stream, body) = open_call_stream(shared, &session, calls.len());
    session.register_stream(stream.clone());
    for (id, method, params) in calls {
        let ctx = make_ctx(&id, &params, Some(stream.clone()));
        let session = session.clone();
        let stream = stream.clone();
        shared.tasks.spawn(async move {
            let outcome = run_cancellable(ctx, &method, params).await;
            match outcome {
                Some(outcome) => {
                    stream.send_final(&response(&id, &outcome));
                }
                None => stream.finish_without_response(),
            }
            if stream.is_finished() && !stream.must_outlive_call() {
                session.unregister_stream(stream.number);
            }
        });
    }
    sse_reply(body, session.id.as_deref())
}
