//! GET handling: the standalone SSE stream (one per session; a second GET
//! while one is connected gets 409) and `Last-Event-ID` resumption of any
//! stream that keeps event ids.

use std::sync::Arc;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;

use super::Shared;
use super::config::SseFraming;
use super::jsonrpc::RpcError;
use super::session::Session;
use super::sse_writer::{Body, OnDrop, OutboundStream, StreamKind, StreamOptions, parse_event_id};
use super::transport::{accepts, error_reply, header, not_allowed, resolve_session, sse_reply};

const LAST_EVENT_ID: &str = "last-event-id";

pub(crate) fn get(shared: &Arc<Shared>, req: &Request<Incoming>) -> Response<Body> {
    let config = &shared.config;
    if config.stateless || !config.get_stream_enabled {
        return not_allowed(shared);
    }
    let headers = req.headers();
    if config.require_accept && !accepts(headers, "text/event-stream") {
        return error_reply(
            StatusCode::NOT_ACCEPTABLE,
            RpcError::INVALID_REQUEST,
            "Not Acceptable: Accept must include text/event-stream",
        );
    }
    let session = match resolve_session(shared, headers) {
        Ok(s) => s,
        Err(refusal) => return refusal.reply(),
    };
    if let Some(last) = header(headers, LAST_EVENT_ID) {
        return resume(shared, &session, last);
    }
    if session.live_get_stream().is_some() {
        return error_reply(
            StatusCode::CONFLICT,
            RpcError::INVALID_REQUEST,
            "Conflict: only one standalone SSE stream is allowed per session",
        );
    }
    let (stream, body) = OutboundStream::open(
        session.next_stream_number(),
        StreamKind::Standalone,
        StreamOptions {
            framing: config.framing,
            with_ids: config.framing == SseFraming::TypeScript,
            log_limit: config.event_log_limit,
            outstanding: 0,
        },
        session.event_seq.clone(),
        Some(get_stream_guard(shared)),
    );
    if config.framing == SseFraming::TypeScript {
        stream.prime(None);
    }
    if !session.install_get_stream(stream) {
        return error_reply(
            StatusCode::CONFLICT,
            RpcError::INVALID_REQUEST,
            "Conflict: only one standalone SSE stream is allowed per session",
        );
    }
    sse_reply(body, session.id.as_deref())
}

/// Counts the GET stream as open until its body is dropped.
fn get_stream_guard(shared: &Shared) -> OnDrop {
    let stats = shared.stats.clone();
    stats.record_get_stream_opened();
    OnDrop::new(move || stats.record_get_stream_closed())
}

fn resume(shared: &Arc<Shared>, session: &Session, last_event_id: &str) -> Response<Body> {
    let stream = parse_event_id(last_event_id).and_then(|(number, seq)| {
        session
            .stream(number)
            .filter(|s| s.keeps_ids())
            .map(|s| (s, seq))
    });
    let Some((stream, seq)) = stream else {
        return error_reply(
            StatusCode::BAD_REQUEST,
            RpcError::INVALID_REQUEST,
            format!("Bad Request: unknown Last-Event-ID {last_event_id}"),
        );
    };
    let guard = (stream.kind == StreamKind::Standalone).then(|| get_stream_guard(shared));
    let Some(body) = stream.resume(seq, guard) else {
        return error_reply(
            StatusCode::BAD_REQUEST,
            RpcError::INVALID_REQUEST,
            "Bad Request: stream is not resumable",
        );
    };
    shared.stats.record_resumption();
    if stream.kind == StreamKind::Standalone {
        session.get_stream_reattached();
    }
    sse_reply(body, session.id.as_deref())
}
