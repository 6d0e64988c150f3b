//! `subscriptions/listen`: a long-lived SSE response carrying list changes and resource
//! updates, fed by a legacy session of its own.
//!
//! One listen request, in order:
//! 1. **Filter.** `params.notifications` names what the client opts in to
//!    (`toolsListChanged`, `promptsListChanged`, `resourcesListChanged`,
//!    `resourceSubscriptions`); a member of the wrong type is -32602, more URIs than
//!    `subscriptions.max_resource_subscriptions` too.
//! 2. **Admission.** At most `subscriptions.max_streams` streams per replica (503 +
//!    `Retry-After` beyond, `limit_hits_total{limit="max_listen_streams"}`) and
//!    `subscriptions.max_streams_per_principal` per caller (429 + `Retry-After`,
//!    `limit="max_listen_streams_per_principal"`; unset, a quarter of `max_streams`), the last
//!    few kept for callers holding none (`quotas.newcomer_reserve`, 429,
//!    `limit="listen_streams_newcomer_reserve"`), none once the shutdown has begun. A stream
//!    gives its request slot back once it starts: these caps bound it instead.
//! 3. **Legacy session.** A session of its own, declaring no client capabilities; opening it
//!    opens the standalone GET stream, where legacy servers send `list_changed` and
//!    `resources/updated`. The **agreed** filter is the requested one cut down to what that
//!    server declares (`tools.listChanged`, `prompts.listChanged`, `resources.listChanged`,
//!    `resources.subscribe` for URIs). Every agreed URI gets a legacy `resources/subscribe`,
//!    confirmed within `upstream.response_timeout`; a refusal or a timeout is a JSON-RPC error
//!    response, sent before any streaming. With nothing agreed the session is closed at once.
//! 4. **Stream.** First `notifications/subscriptions/acknowledged` with the agreed filter and
//!    `_meta["io.modelcontextprotocol/subscriptionId"]` = the listen request's id; then only
//!    the agreed notifications, each tagged with that id. Request-scoped notifications
//!    (progress, logs) never go on it. A server request on this session is answered upstream
//!    with -32602 (`ping` with `{}`): no client is waiting to be asked. An idle stream gets a
//!    `: keep-alive` comment every `subscriptions.keepalive`.
//! 5. **End.** The client closing the stream drops the body, which closes the legacy session
//!    (DELETE). The drain's closing phase ([`crate::drain::Drain::close`]) sends the
//!    graceful final response, `{"resultType":"complete","_meta":{subscriptionId, serverInfo}}`,
//!    then closes. If the legacy session dies instead (its GET stream ends and cannot be
//!    reopened, the server forgot the session, the server is gone) the stream ends *without*
//!    that response: per the spec that is an unexpected drop, and the client may listen again.
//!
//! Listening works on the HTTP transports. With a stdio upstream every session is a separate
//! child process, whose notifications say nothing about the children serving calls (and a
//! listen stream would hold one of `upstream.stdio_max_children` for its whole life): there
//! the agreed filter is always empty and `server/discover` advertises neither `listChanged`
//! nor `subscribe`. A Streamable HTTP server that refuses the GET stream cannot notify either,
//! so nothing is agreed with it.
//!
//! What reaches a listen stream is what the legacy server sends to the listen stream's *own*
//! session. A server that notifies only the session whose request changed the list (FastMCP
//! 1.x's `send_tool_list_changed()` from inside a tool) tells the gateway's per-call session,
//! not this one, and the change is not seen here.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Response};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use serde_json::{Map, Value, json};
use tokio::time::{Instant, Interval, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::deps::Front;
pub use super::listen_filter::Filter;
use super::listen_filter::bad_filter;
use super::long_lived::{self, StreamPlace, StreamRefusal};
use super::respond::{self, Body};
use crate::caller_scope::Caller;
use crate::caller_scope::CallerScope;
use crate::error::{Rejection, RejectionKind};
use crate::legacy::exchange::{Event, Exchange};
use crate::legacy::session::LegacySession;
use crate::legacy::upstream::Upstream;
use crate::metrics::Limit;
use crate::translate;
use crate::upstream_error::session_rejection;
use mrtr_wire::capabilities::Declared;
use mrtr_wire::jsonrpc::{self, ErrorObject, codes};

/// The `_meta` key that ties a message to its listen stream.
pub const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";
const ACKNOWLEDGED: &str = "notifications/subscriptions/acknowledged";
/// Agreed notifications that arrive while the URIs are being subscribed are held (this many at
/// most) and sent right after the acknowledgement.
const EARLY_BACKLOG: usize = 64;
const KEEP_ALIVE: &[u8] = b": keep-alive\n\n";

/// How long one change is coalesced across the sessions it is seen on.
const COALESCE: std::time::Duration = std::time::Duration::from_millis(500);

/// Whether listen streams can be fed by this upstream (see the module docs).
pub fn supported(upstream: &Upstream) -> bool {
    !matches!(upstream, Upstream::Stdio(_))
}

/// `msg` with `params._meta[subscriptionId] = id`.
pub(super) fn tagged(mut msg: Value, id: &Value) -> Value {
    if let Some(obj) = msg.as_object_mut() {
        let params = obj
            .entry("params")
            .or_insert_with(|| Value::Object(Map::new()));
        if !params.is_object() {
            *params = Value::Object(Map::new());
        }
        let meta = params
            .as_object_mut()
            .expect("just made an object")
            .entry("_meta")
            .or_insert_with(|| Value::Object(Map::new()));
        if !meta.is_object() {
            *meta = Value::Object(Map::new());
        }
        meta.as_object_mut()
            .expect("just made an object")
            .insert(SUBSCRIPTION_ID.into(), id.clone());
    }
    msg
}

/// Answers a server request on a listen session: nobody can be asked, so it is refused
/// (`ping` never gets here: the exchange answers it).
async fn refuse_server_request(exchange: &Exchange, msg: &Value) {
    let method = msg
        .get("method")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let refusal = ErrorObject::new(
        codes::INVALID_PARAMS,
        format!(
            "{method} cannot be answered on a subscriptions/listen session: no client request is waiting on it"
        ),
    );
    if let Err(e) = exchange.refuse(msg, refusal).await {
        tracing::debug!(error = %e, %method, "could not answer a server request on a listen session");
    }
}

/// Sends `resources/subscribe` for every agreed URI and waits for all the confirmations.
async fn subscribe(
    exchange: &mut Exchange,
    agreed: &Filter,
    early: &mut VecDeque<Value>,
    timeout: Duration,
) -> Result<(), Rejection> {
    let mut waiting: HashMap<i64, String> = HashMap::new();
    for uri in &agreed.uris {
        let id = exchange
            .session_mut()
            .request("resources/subscribe", Some(&json!({"uri": uri})))
            .await
            .map_err(|e| session_rejection(&e))?;
        waiting.insert(id, uri.clone());
    }
    let deadline = Instant::now() + timeout;
    while !waiting.is_empty() {
        let event = tokio::time::timeout_at(deadline, exchange.next())
            .await
            .map_err(|_| {
                Rejection::new(
                    RejectionKind::ListenSubscribeTimeout,
                    format!(
                        "the legacy server did not confirm resources/subscribe within upstream.response_timeout ({timeout:?})"
                    ),
                )
            })?;
        match event {
            Event::Response { id, msg } => {
                let Some(uri) = waiting.remove(&id) else {
                    continue;
                };
                if let Some(err) = msg.get("error") {
                    return Err(translate::legacy_error(
                        err,
                        &json!({"uri": uri}),
                        RejectionKind::ListenSubscribeRefused,
                    ));
                }
            }
            Event::Request(msg) => refuse_server_request(exchange, &msg).await,
            Event::Notification { msg, .. } => {
                if agreed.admits(&msg) && early.len() < EARLY_BACKLOG {
                    early.push_back(msg);
                }
            }
            Event::CallEnded { id, error } if waiting.contains_key(&id) => {
                return Err(crate::upstream_error::concealed(
                    Rejection::new(
                        RejectionKind::UpstreamStreamBroken,
                        "the upstream MCP server ended resources/subscribe without an answer",
                    ),
                    error.as_deref().unwrap_or("no error reported"),
                ));
            }
            Event::StreamEnded { error } => {
                return Err(crate::upstream_error::concealed(
                    Rejection::new(
                        RejectionKind::UpstreamStreamBroken,
                        "the upstream MCP server stopped delivering notifications",
                    ),
                    error.as_deref().unwrap_or("no error reported"),
                ));
            }
            Event::Closed => {
                return Err(Rejection::new(
                    RejectionKind::UpstreamStreamBroken,
                    "the legacy session ended while subscribing",
                ));
            }
            Event::CallEnded { .. } | Event::Invalid(_) => {}
        }
    }
    Ok(())
}

/// One `subscriptions/listen` request, as the front routed it.
pub struct ListenRequest<'a> {
    pub caller: &'a Caller,
    /// The request id, which becomes the subscription id.
    pub id: &'a Value,
    pub params: &'a Value,
    pub accepts_sse: bool,
    /// Credentials and trace context for the stream's legacy session.
    pub upstream_headers: HeaderMap,
    pub scope: &'a CallerScope,
}

/// Serves one `subscriptions/listen` request: an error before streaming, or the stream.
pub async fn serve(front: &Front, r: ListenRequest<'_>) -> Result<Response<Body>, Rejection> {
    let ListenRequest {
        caller,
        id,
        params,
        accepts_sse,
        upstream_headers,
        scope,
    } = r;
    let (requested, place) = admit(front, caller, params, accepts_sse)?;
    let Opened {
        agreed,
        early,
        server_info,
        feed,
    } = open_feed(front, &requested, upstream_headers, scope).await?;
    let cfg = front.config();
    let limits = &cfg.subscriptions;
    tracing::info!(
        subscription_id = %id,
        requested = %requested.to_json(),
        agreed = %agreed.to_json(),
        "listen stream open"
    );

    let ack = jsonrpc::notification(
        ACKNOWLEDGED,
        Some(json!({"notifications": agreed.to_json(), "_meta": {SUBSCRIPTION_ID: id}})),
    );
    let mut pending = VecDeque::with_capacity(1 + early.len());
    pending.push_back(respond::sse_event(&ack));
    pending.extend(
        early
            .into_iter()
            .map(|m| respond::sse_event(&tagged(m, id))),
    );
    let period = limits.keepalive;
    let mut keepalive = tokio::time::interval_at(Instant::now() + period, period);
    keepalive.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let stream = ListenStream {
        id: id.clone(),
        agreed,
        pending,
        feed,
        keepalive,
        // A child: the stream checks it on each wake, and the shutdown token itself is shared
        // by every stream (see `connection::serve`).
        shutdown: front.long_lived.shutdown().child_token(),
        relayed: front.long_lived.relayed(scope),
        recent: VecDeque::new(),
        server_info,
        ended: false,
        _place: place,
    };
    let body = futures_util::stream::unfold(stream, |mut st| async move {
        let bytes = st.next_chunk().await?;
        Some((Ok::<_, Infallible>(Frame::data(bytes)), st))
    });
    let mut response = respond::sse_response(StreamBody::new(body).boxed_unsync());
    long_lived::mark(&mut response);
    Ok(response)
}

/// Everything a listen request must pass before a legacy session is opened for it: a filter
/// within the limits, an SSE-accepting client, a replica that is not shutting down, and a
/// place among the listen streams (the replica's cap and the caller's quota).
fn admit(
    front: &Front,
    caller: &Caller,
    params: &Value,
    accepts_sse: bool,
) -> Result<(Filter, StreamPlace), Rejection> {
    let cfg = front.config();
    let limits = &cfg.subscriptions;
    let requested = Filter::parse(params)?;
    if requested.uris.len() > limits.max_resource_subscriptions {
        front.limits.hit(Limit::MaxResourceSubscriptions);
        return Err(bad_filter(format!(
            "params.notifications.resourceSubscriptions names {} URIs; the limit is {} (subscriptions.max_resource_subscriptions)",
            requested.uris.len(),
            limits.max_resource_subscriptions
        )));
    }
    if !accepts_sse {
        return Err(Rejection::new(
            RejectionKind::ListenNeedsSse,
            "subscriptions/listen answers with an SSE stream: Accept must include text/event-stream",
        ));
    }
    if front.long_lived.shutdown().is_cancelled() {
        return Err(Rejection::new(
            RejectionKind::ShuttingDown,
            "this gateway replica is shutting down; listen again (another replica will serve it)",
        ));
    }
    match front.long_lived.admit_listen(caller, &limits.stream_share) {
        Ok(place) => Ok((requested, place)),
        Err(StreamRefusal::Full) => {
            front.limits.hit(Limit::MaxListenStreams);
            Err(Rejection::new(
                RejectionKind::MaxListenStreams,
                format!(
                    "this gateway replica holds its limit of {} listen streams (subscriptions.max_streams); retry shortly",
                    limits.max_streams
                ),
            ))
        }
        Err(StreamRefusal::CallerShare) => {
            front.limits.hit(Limit::MaxListenStreamsPerPrincipal);
            Err(Rejection::new(
                RejectionKind::ListenStreamQuota,
                format!(
                    "you already hold {} listen streams on this replica (subscriptions.max_streams_per_principal); close one first",
                    limits.stream_share.per_caller
                ),
            ))
        }
        Err(StreamRefusal::Reserve) => {
            front.limits.hit(Limit::ListenStreamsNewcomerReserve);
            Err(Rejection::new(
                RejectionKind::ListenStreamQuota,
                format!(
                    "this replica's last {} listen streams are kept for callers holding none (quotas.newcomer_reserve), and you hold some; close one first or retry shortly",
                    limits.stream_share.reserve
                ),
            ))
        }
    }
}

/// The legacy side of a listen stream: what the server agreed to send, notifications that
/// came while subscribing, the server's identity, and the session that feeds the stream
/// (`None` when nothing was agreed).
struct Opened {
    agreed: Filter,
    early: VecDeque<Value>,
    server_info: Value,
    feed: Option<Exchange>,
}

/// Opens the stream's own legacy session and subscribes to the agreed resources; where the
/// upstream cannot feed a listen stream, the caller's own session only gives the identity.
async fn open_feed(
    front: &Front,
    requested: &Filter,
    upstream_headers: HeaderMap,
    scope: &CallerScope,
) -> Result<Opened, Rejection> {
    let cfg = front.config();
    let mut agreed = Filter::default();
    let mut early = VecDeque::new();
    let server_info;
    let mut feed: Option<Exchange> = None;
    if !supported(&front.sessions.upstream()) {
        // No session of its own (see the module docs); the identity is still this caller's.
        let init = crate::discover::caller_init(
            &front.engine,
            scope,
            &Declared::default(),
            upstream_headers,
        )
        .await?;
        server_info = translate::server_info(Some(&init)).clone();
    } else {
        let mut opened = front
            .sessions
            .open(&Declared::default(), upstream_headers)
            .await?;
        let session = opened.session();
        server_info = translate::server_info(Some(session.init_result())).clone();
        let can_notify = match session {
            LegacySession::Http(h) => h.has_get_stream,
            _ => true,
        };
        if can_notify {
            let caps = session
                .init_result()
                .get("capabilities")
                .unwrap_or(&Value::Null);
            agreed = requested.agreed(caps);
        }
        if agreed.is_empty() {
            opened.close().await;
        } else {
            if let Err(rej) = subscribe(
                &mut opened,
                &agreed,
                &mut early,
                cfg.upstream.response_timeout,
            )
            .await
            {
                opened.close().await;
                return Err(rej);
            }
            feed = Some(opened);
        }
    }
    Ok(Opened {
        agreed,
        early,
        server_info,
        feed,
    })
}

/// One open listen stream, driven by the response body: dropping the body drops this, and
/// with it the legacy session (whose drop DELETEs it upstream).
struct ListenStream {
    id: Value,
    agreed: Filter,
    /// Frames due before anything else (the acknowledgement first).
    pending: VecDeque<Bytes>,
    /// `None` when nothing was agreed: only keep-alives and the final response then.
    feed: Option<Exchange>,
    keepalive: Interval,
    shutdown: CancellationToken,
    /// Session-wide notifications seen on this replica's other legacy sessions of the same
    /// caller (principal and forwarded credential).
    relayed: tokio::sync::broadcast::Receiver<Value>,
    /// Recently forwarded notifications and which path each came by (`true`: relayed from
    /// another session), to drop the second sighting of one change seen on both paths.
    recent: VecDeque<(Instant, Value, bool)>,
    server_info: Value,
    /// The final response has been sent.
    ended: bool,
    _place: StreamPlace,
}

async fn next_event(feed: &mut Option<Exchange>) -> Event {
    match feed {
        Some(exchange) => exchange.next().await,
        None => std::future::pending().await,
    }
}

impl ListenStream {
    /// The next bytes of the body; `None` ends it.
    async fn next_chunk(&mut self) -> Option<Bytes> {
        if let Some(b) = self.pending.pop_front() {
            return Some(b);
        }
        if self.ended {
            self.close("shutdown").await;
            return None;
        }
        loop {
            tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => {
                    self.ended = true;
                    let result = translate::complete(
                        json!({"_meta": {SUBSCRIPTION_ID: self.id}}),
                        &self.server_info,
                        None,
                    );
                    return Some(respond::sse_event(&jsonrpc::result_response(&self.id, result)));
                }
                relayed = self.relayed.recv(), if self.feed.is_some() => {
                    if let Ok(msg) = relayed
                        && self.agreed.admits(&msg)
                        && self.fresh(&msg, true)
                    {
                        self.keepalive.reset();
                        return Some(respond::sse_event(&tagged(msg, &self.id)));
                    }
                }
                event = next_event(&mut self.feed) => match event {
                    Event::Notification { msg, .. } if self.agreed.admits(&msg) && self.fresh(&msg, false) => {
                        self.keepalive.reset();
                        return Some(respond::sse_event(&tagged(msg, &self.id)));
                    }
                    Event::Request(msg) => {
                        if let Some(exchange) = &self.feed {
                            refuse_server_request(exchange, &msg).await;
                        }
                    }
                    Event::StreamEnded { error } => {
                        tracing::warn!(
                            subscription_id = %self.id,
                            error = error.as_deref().unwrap_or("closed"),
                            "the legacy session stopped delivering notifications; ending the listen stream without a final response (the client may listen again)"
                        );
                        self.close("legacy session ended").await;
                        return None;
                    }
                    Event::Closed => {
                        self.close("legacy session ended").await;
                        return None;
                    }
                    Event::Notification { .. } | Event::Response { .. } | Event::CallEnded { .. } | Event::Invalid(_) => {}
                },
                _ = self.keepalive.tick() => return Some(Bytes::from_static(KEEP_ALIVE)),
            }
        }
    }

    /// Whether `msg` is not the other sighting of a change just forwarded: a server that
    /// tells every session is heard both on this stream's own session and, relayed, from a
    /// call's session. Two sightings on the same path are two changes, and both go out.
    fn fresh(&mut self, msg: &Value, relayed: bool) -> bool {
        let now = Instant::now();
        while self
            .recent
            .front()
            .is_some_and(|(t, _, _)| now.duration_since(*t) > COALESCE)
        {
            self.recent.pop_front();
        }
        let key = json!({"method": msg.get("method"), "uri": msg.pointer("/params/uri")});
        if let Some(i) = self
            .recent
            .iter()
            .position(|(_, k, path)| *k == key && *path != relayed)
        {
            // Matched once: a third sighting is a new change again.
            self.recent.remove(i);
            return false;
        }
        self.recent.push_back((now, key, relayed));
        true
    }

    async fn close(&mut self, why: &str) {
        if let Some(exchange) = self.feed.take() {
            exchange.close().await;
        }
        tracing::info!(subscription_id = %self.id, why, "listen stream closed");
    }
}
