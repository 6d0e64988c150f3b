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
//!    `limit="max_listen_streams_per_principal"`), none once the shutdown has begun. A stream
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
use tokio::sync::mpsc;
use tokio::time::{Instant, Interval, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::deps::Front;
use super::long_lived::{self, StreamPlace, StreamRefusal};
use super::respond::{self, Body};
use crate::caller_scope::Caller;
use crate::caller_scope::CallerScope;
use crate::error::{Rejection, RejectionKind};
use crate::legacy::session::{Inbound, LegacySession, StreamTag};
use crate::legacy::upstream::Upstream;
use crate::legacy::wire::response_id;
use crate::translate;
use crate::upstream_error::session_rejection;
use mrtr_wire::capabilities::Declared;
use mrtr_wire::jsonrpc::{self, ErrorObject, MessageKind, codes};

/// The `_meta` key that ties a message to its listen stream.
pub const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";
const ACKNOWLEDGED: &str = "notifications/subscriptions/acknowledged";
/// Agreed notifications that arrive while the URIs are being subscribed are held (this many at
/// most) and sent right after the acknowledgement.
const EARLY_BACKLOG: usize = 64;
const KEEP_ALIVE: &[u8] = b": keep-alive\n\n";

/// The notifications a listen stream carries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    pub tools: bool,
    pub prompts: bool,
    pub resources: bool,
    /// Resource URIs for `notifications/resources/updated` (no duplicates, request order).
    pub uris: Vec<String>,
}

/// How long one change is coalesced across the sessions it is seen on.
const COALESCE: std::time::Duration = std::time::Duration::from_millis(500);

fn bad_filter(message: String) -> Rejection {
    Rejection::new(RejectionKind::InvalidListenFilter, message)
}

impl Filter {
    /// Reads `params.notifications`; every member is optional and off unless set.
    pub fn parse(params: &Value) -> Result<Filter, Rejection> {
        let Some(n) = params.get("notifications") else {
            return Err(bad_filter(
                "subscriptions/listen needs params.notifications (an object; each member opts in)"
                    .into(),
            ));
        };
        let Some(n) = n.as_object() else {
            return Err(bad_filter("params.notifications must be an object".into()));
        };
        let flag = |key: &str| match n.get(key) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(bad_filter(format!(
                "params.notifications.{key} must be a boolean"
            ))),
        };
        let mut uris: Vec<String> = Vec::new();
        match n.get("resourceSubscriptions") {
            None | Some(Value::Null) => {}
            Some(Value::Array(items)) => {
                for item in items {
                    match item.as_str() {
                        Some(u) if !u.is_empty() => {
                            if !uris.iter().any(|have| have == u) {
                                uris.push(u.to_string());
                            }
                        }
                        _ => {
                            return Err(bad_filter(
                                "params.notifications.resourceSubscriptions must hold non-empty URI strings"
                                    .into(),
                            ));
                        }
                    }
                }
            }
            Some(_) => {
                return Err(bad_filter(
                    "params.notifications.resourceSubscriptions must be an array of URIs".into(),
                ));
            }
        }
        Ok(Filter {
            tools: flag("toolsListChanged")?,
            prompts: flag("promptsListChanged")?,
            resources: flag("resourcesListChanged")?,
            uris,
        })
    }

    /// What of this filter a legacy server with `capabilities` can deliver.
    pub fn agreed(&self, capabilities: &Value) -> Filter {
        let declared = |section: &str, member: &str| {
            capabilities.pointer(&format!("/{section}/{member}")) == Some(&Value::Bool(true))
        };
        Filter {
            tools: self.tools && declared("tools", "listChanged"),
            prompts: self.prompts && declared("prompts", "listChanged"),
            resources: self.resources && declared("resources", "listChanged"),
            uris: if declared("resources", "subscribe") {
                self.uris.clone()
            } else {
                Vec::new()
            },
        }
    }

    pub fn is_empty(&self) -> bool {
        !self.tools && !self.prompts && !self.resources && self.uris.is_empty()
    }

    /// The wire form: only the members that are on.
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        for (key, on) in [
            ("toolsListChanged", self.tools),
            ("promptsListChanged", self.prompts),
            ("resourcesListChanged", self.resources),
        ] {
            if on {
                m.insert(key.into(), Value::Bool(true));
            }
        }
        if !self.uris.is_empty() {
            m.insert("resourceSubscriptions".into(), json!(self.uris));
        }
        Value::Object(m)
    }

    /// Whether the legacy notification `msg` belongs on the stream.
    pub fn admits(&self, msg: &Value) -> bool {
        match msg.get("method").and_then(Value::as_str) {
            Some("notifications/tools/list_changed") => self.tools,
            Some("notifications/prompts/list_changed") => self.prompts,
            Some("notifications/resources/list_changed") => self.resources,
            Some("notifications/resources/updated") => msg
                .pointer("/params/uri")
                .and_then(Value::as_str)
                .is_some_and(|u| self.uris.iter().any(|have| have == u)),
            _ => false,
        }
    }
}

/// Whether listen streams can be fed by this upstream (see the module docs).
pub fn supported(upstream: &Upstream) -> bool {
    !matches!(upstream, Upstream::Stdio(_))
}

/// `msg` with `params._meta[subscriptionId] = id`.
fn tagged(mut msg: Value, id: &Value) -> Value {
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

/// Answers a server request on a listen session: nobody can be asked, so it is refused.
async fn refuse_server_request(session: &LegacySession, msg: &Value) {
    let id = msg.get("id").cloned().unwrap_or(Value::Null);
    let method = msg
        .get("method")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let outcome = if method == "ping" {
        Ok(json!({}))
    } else {
        Err(ErrorObject::new(
            codes::INVALID_PARAMS,
            format!(
                "{method} cannot be answered on a subscriptions/listen session: no client request is waiting on it"
            ),
        ))
    };
    if let Err(e) = session.respond(&id, outcome).await {
        tracing::debug!(error = %e, %method, "could not answer a server request on a listen session");
    }
}

type Feed = (LegacySession, mpsc::Receiver<Inbound>);

/// Sends `resources/subscribe` for every agreed URI and waits for all the confirmations.
async fn subscribe(
    feed: &mut Feed,
    agreed: &Filter,
    early: &mut VecDeque<Value>,
    timeout: Duration,
) -> Result<(), Rejection> {
    let (session, inbound) = feed;
    let mut waiting: HashMap<i64, String> = HashMap::new();
    for uri in &agreed.uris {
        let id = session
            .request("resources/subscribe", Some(json!({"uri": uri})))
            .await
            .map_err(|e| session_rejection(&e))?;
        waiting.insert(id, uri.clone());
    }
    let deadline = Instant::now() + timeout;
    while !waiting.is_empty() {
        let item = tokio::time::timeout_at(deadline, inbound.recv())
            .await
            .map_err(|_| {
                Rejection::new(
                    RejectionKind::ListenSubscribeTimeout,
                    format!(
                        "the legacy server did not confirm resources/subscribe within upstream.response_timeout ({timeout:?})"
                    ),
                )
            })?;
        let Some(item) = item else {
            return Err(Rejection::new(
                RejectionKind::UpstreamStreamBroken,
                "the legacy session ended while subscribing",
            ));
        };
        match item {
            Inbound::Message(_, msg) => match jsonrpc::classify(&msg) {
                MessageKind::Response => {
                    let Some(uri) = response_id(&msg).and_then(|id| waiting.remove(&id)) else {
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
                MessageKind::Request => refuse_server_request(session, &msg).await,
                MessageKind::Notification => {
                    if agreed.admits(&msg) && early.len() < EARLY_BACKLOG {
                        early.push_back(msg);
                    }
                }
                MessageKind::Invalid => {}
            },
            Inbound::Ended {
                stream: StreamTag::Call(id),
                error,
            } if waiting.contains_key(&id) => {
                return Err(crate::upstream_error::concealed(
                    Rejection::new(
                        RejectionKind::UpstreamStreamBroken,
                        "the upstream MCP server ended resources/subscribe without an answer",
                    ),
                    error.as_deref().unwrap_or("no error reported"),
                ));
            }
            Inbound::Ended {
                stream: StreamTag::Get,
                error,
            } => {
                return Err(crate::upstream_error::concealed(
                    Rejection::new(
                        RejectionKind::UpstreamStreamBroken,
                        "the upstream MCP server stopped delivering notifications",
                    ),
                    error.as_deref().unwrap_or("no error reported"),
                ));
            }
            Inbound::Ended { .. } => {}
        }
    }
    Ok(())
}

/// Serves one `subscriptions/listen` request of `scope`: an error before streaming, or the
/// stream.
pub async fn serve(
    front: &Front,
    caller: &Caller,
    id: &Value,
    params: &Value,
    accepts_sse: bool,
    upstream_headers: HeaderMap,
    scope: &CallerScope,
) -> Result<Response<Body>, Rejection> {
    let cfg = front.config();
    let limits = &cfg.subscriptions;
    let requested = Filter::parse(params)?;
    if requested.uris.len() > limits.max_resource_subscriptions {
        front
            .metrics
            .limit_hits
            .with_label_values(&["max_resource_subscriptions"])
            .inc();
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
    let place = match front.long_lived.admit_listen(
        caller,
        limits.max_streams,
        limits.max_streams_per_principal,
    ) {
        Ok(place) => place,
        Err(StreamRefusal::Full) => {
            front
                .metrics
                .limit_hits
                .with_label_values(&["max_listen_streams"])
                .inc();
            return Err(Rejection::new(
                RejectionKind::MaxListenStreams,
                format!(
                    "this gateway replica holds its limit of {} listen streams (subscriptions.max_streams); retry shortly",
                    limits.max_streams
                ),
            ));
        }
        Err(StreamRefusal::CallerQuota) => {
            front
                .metrics
                .limit_hits
                .with_label_values(&["max_listen_streams_per_principal"])
                .inc();
            return Err(Rejection::new(
                RejectionKind::ListenStreamQuota,
                format!(
                    "you already hold {} listen streams on this replica (subscriptions.max_streams_per_principal); close one first",
                    limits.max_streams_per_principal
                ),
            ));
        }
    };

    let mut agreed = Filter::default();
    let mut early = VecDeque::new();
    let server_info;
    let mut feed: Option<Feed> = None;
    if !supported(&front.sessions.upstream()) {
        // No session of its own (see the module docs); the identity is still this caller's.
        let init = crate::discover::caller_init(
            &front.engine,
            scope,
            &Declared::default(),
            upstream_headers,
        )
        .await?;
        server_info = translate::server_info(Some(&init));
    } else {
        let (session, inbound) = front
            .sessions
            .open(&Declared::default(), upstream_headers)
            .await?;
        server_info = translate::server_info(Some(session.init_result()));
        let can_notify = match &session {
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
        let mut opened = (session, inbound);
        if agreed.is_empty() {
            opened.0.close().await;
        } else {
            if let Err(rej) = subscribe(
                &mut opened,
                &agreed,
                &mut early,
                cfg.upstream.response_timeout,
            )
            .await
            {
                opened.0.close().await;
                return Err(rej);
            }
            feed = Some(opened);
        }
    }
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
        shutdown: front.long_lived.shutdown().clone(),
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

/// One open listen stream, driven by the response body: dropping the body drops this, and
/// with it the legacy session (whose drop DELETEs it upstream).
struct ListenStream {
    id: Value,
    agreed: Filter,
    /// Frames due before anything else (the acknowledgement first).
    pending: VecDeque<Bytes>,
    /// `None` when nothing was agreed: only keep-alives and the final response then.
    feed: Option<Feed>,
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

async fn next_inbound(feed: &mut Option<Feed>) -> Option<Inbound> {
    match feed {
        Some((_, inbound)) => inbound.recv().await,
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
                item = next_inbound(&mut self.feed) => match item {
                    Some(Inbound::Message(_, msg)) => match jsonrpc::classify(&msg) {
                        MessageKind::Notification if self.agreed.admits(&msg) && self.fresh(&msg, false) => {
                            self.keepalive.reset();
                            return Some(respond::sse_event(&tagged(msg, &self.id)));
                        }
                        MessageKind::Request => {
                            if let Some((session, _)) = &self.feed {
                                refuse_server_request(session, &msg).await;
                            }
                        }
                        _ => {}
                    },
                    Some(Inbound::Ended { stream: StreamTag::Get, error }) => {
                        tracing::warn!(
                            subscription_id = %self.id,
                            error = error.as_deref().unwrap_or("closed"),
                            "the legacy session stopped delivering notifications; ending the listen stream without a final response (the client may listen again)"
                        );
                        self.close("legacy session ended").await;
                        return None;
                    }
                    Some(Inbound::Ended { .. }) => {}
                    None => {
                        self.close("legacy session ended").await;
                        return None;
                    }
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
        if let Some((session, _)) = self.feed.take() {
            session.close().await;
        }
        tracing::info!(subscription_id = %self.id, why, "listen stream closed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_parse_strictly_and_default_to_off() {
        let f = Filter::parse(&json!({"notifications": {
            "toolsListChanged": true, "promptsListChanged": false,
            "resourceSubscriptions": ["a://1", "a://2", "a://1"], "future": 1
        }}))
        .unwrap();
        assert!(f.tools && !f.prompts && !f.resources);
        assert_eq!(f.uris, ["a://1", "a://2"]);
        assert!(
            Filter::parse(&json!({"notifications": {}}))
                .unwrap()
                .is_empty()
        );
        for bad in [
            json!({}),
            json!({"notifications": []}),
            json!({"notifications": {"toolsListChanged": "yes"}}),
            json!({"notifications": {"resourceSubscriptions": "a://1"}}),
            json!({"notifications": {"resourceSubscriptions": [1]}}),
            json!({"notifications": {"resourceSubscriptions": [""]}}),
        ] {
            let e = Filter::parse(&bad).unwrap_err();
            assert_eq!(e.kind(), RejectionKind::InvalidListenFilter, "{bad}");
            let answer = crate::front::error_map::answer(&e);
            assert_eq!(answer.error.code, codes::INVALID_PARAMS, "{bad}");
        }
    }

    #[test]
    fn the_agreed_filter_is_what_the_server_declares() {
        let asked = Filter {
            tools: true,
            prompts: true,
            resources: true,
            uris: vec!["a://1".into()],
        };
        let caps = json!({"tools": {"listChanged": true}, "prompts": {"listChanged": false},
                          "resources": {"subscribe": true}});
        let agreed = asked.agreed(&caps);
        assert_eq!(
            agreed.to_json(),
            json!({"toolsListChanged": true, "resourceSubscriptions": ["a://1"]})
        );
        assert!(asked.agreed(&json!({})).is_empty());
    }

    #[test]
    fn only_agreed_notifications_pass_and_they_are_tagged() {
        let f = Filter {
            tools: true,
            uris: vec!["a://1".into()],
            ..Default::default()
        };
        let n = |m: &str, p: Value| json!({"jsonrpc": "2.0", "method": m, "params": p});
        assert!(f.admits(&n("notifications/tools/list_changed", json!({}))));
        assert!(!f.admits(&n("notifications/prompts/list_changed", json!({}))));
        assert!(f.admits(&n(
            "notifications/resources/updated",
            json!({"uri": "a://1"})
        )));
        assert!(!f.admits(&n(
            "notifications/resources/updated",
            json!({"uri": "a://2"})
        )));
        assert!(!f.admits(&n("notifications/progress", json!({"progressToken": 1}))));
        assert!(!f.admits(&n("notifications/message", json!({"level": "info"}))));
        let t = tagged(
            json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}),
            &json!("L1"),
        );
        assert_eq!(t["params"]["_meta"][SUBSCRIPTION_ID], "L1");
        let t = tagged(
            n(
                "notifications/resources/updated",
                json!({"uri": "a://1", "_meta": {"x": 1}}),
            ),
            &json!(7),
        );
        assert_eq!(t["params"]["_meta"], json!({"x": 1, SUBSCRIPTION_ID: 7}));
        assert_eq!(t["params"]["uri"], "a://1");
    }
}
