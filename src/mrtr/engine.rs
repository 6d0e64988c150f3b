//! The MRTR engine: one modern request, served through one legacy session.
//!
//! The request path, top to bottom ([`serve_mrtr`]):
//! 1. **Open the presented state** (if any) and check it is bound to this request and caller:
//!    nothing reaches the legacy server until the state is proven good.
//! 2. **Validate `inputResponses`** for the keys the state asked; the rest are checked when
//!    (if) the legacy server asks for them.
//! 3. **Open a legacy session** declaring exactly this request's capabilities, and **send the
//!    call** (re-initializing once if the server forgot the session).
//! 4. **Capture**: read the call stream and the GET stream together. A server request whose
//!    key has an answer is answered at once; a new one is collected, and a short gather window
//!    lets its siblings arrive too. Progress and (if asked) logs go to the client's stream.
//! 5. **Finish**: the legacy response becomes the final result; collected questions become an
//!    `input_required` result with a freshly sealed state, and the legacy call is cancelled.
//!
//! Non-MRTR methods ([`serve_forward`]) take steps 3–5 with every server request refused
//! upstream, so they can never end in `input_required`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use http::{HeaderMap, StatusCode};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;
use tokio::time::sleep_until;
use tokio_util::sync::CancellationToken;

use super::input_key::KeyMinter;
use super::input_request::{kind_of, missing_capability, to_input_request};
use super::input_response::validate;
use super::origin;
use crate::error::{Fault, Rejection};
use crate::gateway::{Gateway, session_rejection};
use crate::jsonrpc::{self, ErrorObject, MessageKind, codes};
use crate::legacy::capabilities::Declared;
use crate::legacy::session::{Inbound, LegacySession, SessionError, StreamTag};
use crate::metrics::method_label;
use crate::protocol::meta::{RequestMeta, log_level_rank};
use crate::protocol::methods::{Route, route};
use crate::state::{InputKind, Pending, StateError, StatePayload, now_secs};
use crate::translate;

/// One modern request, as the engine needs it.
pub struct Call {
    pub id: Value,
    pub method: String,
    pub params: Value,
    pub meta: RequestMeta,
    pub principal: String,
    /// Headers to send on every upstream request of this call (credentials, trace context).
    pub upstream_headers: HeaderMap,
}

/// Where request-scoped notifications go: the client's SSE response, if it can take one.
pub struct Sink {
    tx: Option<mpsc::Sender<Value>>,
}

impl Sink {
    pub fn new(tx: Option<mpsc::Sender<Value>>) -> Sink {
        Sink { tx }
    }

    /// Sends a notification; `false` when the client has gone away.
    async fn send(&self, msg: Value) -> bool {
        match &self.tx {
            Some(tx) => tx.send(msg).await.is_ok(),
            None => true,
        }
    }
}

/// One question collected from the legacy server.
struct Question {
    key: String,
    kind: InputKind,
    request: Value,
    elicitation_id: Option<String>,
}

/// The answers available to this execution, and which of them it used.
struct AnswerBook {
    known: BTreeMap<String, Value>,
    validated: BTreeSet<String>,
    /// Answers to carry into the next state even if this execution did not reach them.
    keep: BTreeSet<String>,
    consumed: BTreeSet<String>,
}

impl AnswerBook {
    fn new(
        prior: Option<&StatePayload>,
        responses: &Map<String, Value>,
    ) -> Result<AnswerBook, Rejection> {
        let mut book = AnswerBook {
            known: BTreeMap::new(),
            validated: BTreeSet::new(),
            keep: BTreeSet::new(),
            consumed: BTreeSet::new(),
        };
        if let Some(p) = prior {
            for (k, v) in &p.ans {
                book.known.insert(k.clone(), v.clone());
                book.validated.insert(k.clone());
                book.keep.insert(k.clone());
            }
        }
        for (key, answer) in responses {
            // An answer already in the state cannot be changed afterwards.
            if book.known.contains_key(key) {
                continue;
            }
            if let Some(pending) = prior.and_then(|p| p.pnd.get(key)) {
                validate(pending.kind, answer).map_err(|m| bad_answer(key, &m))?;
                book.validated.insert(key.clone());
                book.keep.insert(key.clone());
            }
            book.known.insert(key.clone(), answer.clone());
        }
        Ok(book)
    }

    /// The answer for `key`, validated as `kind`; `Ok(None)` when the client has not answered.
    fn answer(&mut self, key: &str, kind: InputKind) -> Result<Option<Value>, Rejection> {
        let Some(answer) = self.known.get(key) else {
            return Ok(None);
        };
        if !self.validated.contains(key) {
            validate(kind, answer).map_err(|m| bad_answer(key, &m))?;
            self.validated.insert(key.to_string());
        }
        self.consumed.insert(key.to_string());
        Ok(Some(answer.clone()))
    }

    /// Answers the next state carries.
    fn carry(&self) -> BTreeMap<String, Value> {
        self.known
            .iter()
            .filter(|(k, _)| self.consumed.contains(*k) || self.keep.contains(*k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

fn bad_answer(key: &str, message: &str) -> Rejection {
    Rejection::invalid_params(
        format!("inputResponses[{key:?}]: {message}"),
        "bad_input_response",
    )
}

/// What to do with server requests during capture.
enum Mode<'a> {
    Mrtr {
        book: &'a mut AnswerBook,
        declared: &'a Declared,
        minter: KeyMinter,
    },
    Forward,
}

enum Captured {
    /// The legacy JSON-RPC response to the call.
    Final(Value),
    /// Questions the client must answer.
    NeedInput(Vec<Question>),
}

/// A legacy session with the modern request's call in flight.
struct Run<'g> {
    gw: &'g Gateway,
    session: Option<LegacySession>,
    inbound: mpsc::Receiver<Inbound>,
    call_id: i64,
}

/// The call's params as the legacy server should see them: no MRTR members, and of `_meta`
/// only what legacy servers understand (progress token, trace context).
fn legacy_params(params: &Value) -> Value {
    let mut p = params.as_object().cloned().unwrap_or_default();
    p.remove("inputResponses");
    p.remove("requestState");
    if let Some(Value::Object(meta)) = p.remove("_meta") {
        let kept: Map<String, Value> = meta
            .into_iter()
            .filter(|(k, _)| {
                matches!(
                    k.as_str(),
                    "progressToken" | "traceparent" | "tracestate" | "baggage"
                )
            })
            .collect();
        if !kept.is_empty() {
            p.insert("_meta".into(), Value::Object(kept));
        }
    }
    Value::Object(p)
}

impl<'g> Run<'g> {
    async fn start(
        gw: &'g Gateway,
        call: &Call,
        declared: &Declared,
    ) -> Result<Run<'g>, Rejection> {
        let params = legacy_params(&call.params);
        for attempt in 0..2 {
            let (mut session, inbound) = gw
                .open_session(declared, call.upstream_headers.clone())
                .await?;
            if let Some(level) = &call.meta.log_level {
                let logs = session
                    .init_result()
                    .pointer("/capabilities/logging")
                    .is_some();
                if logs {
                    // Per-call session: a session-wide level is this request's level.
                    let _ = session
                        .request("logging/setLevel", Some(json!({"level": level})))
                        .await;
                }
            }
            match session.request(&call.method, Some(params.clone())).await {
                Ok(call_id) => {
                    return Ok(Run {
                        gw,
                        session: Some(session),
                        inbound,
                        call_id,
                    });
                }
                Err(SessionError::Expired) if attempt == 0 => {
                    tracing::info!("legacy session expired before the call; re-initializing once");
                    session.discard_expired();
                }
                Err(e) => {
                    session.close().await;
                    return Err(session_rejection(&e));
                }
            }
        }
        Err(Rejection::upstream(
            "the legacy server expired two fresh sessions in a row",
            "upstream_session_expired",
        ))
    }

    fn session(&self) -> &LegacySession {
        self.session
            .as_ref()
            .expect("session is open while the run lives")
    }

    fn init_result(&self) -> &Value {
        self.session().init_result()
    }

    /// Ends the legacy call: tells the server to stop, then DELETEs the session.
    async fn abandon(&mut self, reason: &str) {
        if let Some(s) = self.session.take() {
            let _ = s.cancel(self.call_id, reason).await;
            s.close().await;
        }
    }

    async fn finish(&mut self) {
        if let Some(s) = self.session.take() {
            s.close().await;
        }
    }

    async fn answer(
        &self,
        id: &Value,
        outcome: Result<Value, ErrorObject>,
    ) -> Result<(), Rejection> {
        self.session()
            .respond(id, outcome)
            .await
            .map_err(|e| session_rejection(&e))
    }

    async fn capture(
        &mut self,
        call: &Call,
        mode: &mut Mode<'_>,
        sink: &Sink,
        cancel: &CancellationToken,
        deadline: Instant,
    ) -> Result<Captured, Rejection> {
        let gather_window = self.gw.config().mrtr.gather_window;
        let mut questions: Vec<Question> = Vec::new();
        let mut gather_until: Option<tokio::time::Instant> = None;
        let deadline = tokio::time::Instant::from_std(deadline);
        loop {
            let gather = async {
                match gather_until {
                    Some(t) => sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                _ = cancel.cancelled() => {
                    return Err(Rejection::new(StatusCode::BAD_REQUEST, codes::INTERNAL_ERROR,
                        "the client closed the request", Fault::Client, "client_cancelled"));
                }
                item = self.inbound.recv() => {
                    let Some(item) = item else {
                        return Err(Rejection::upstream("the legacy session ended unexpectedly", "upstream_stream_broken"));
                    };
                    match item {
                        Inbound::Message(_, msg) => match jsonrpc::classify(&msg) {
                            MessageKind::Request => {
                                if let Some(q) = self.on_server_request(call, &msg, mode).await? {
                                    questions.push(q);
                                    gather_until.get_or_insert_with(|| tokio::time::Instant::now() + gather_window);
                                }
                            }
                            MessageKind::Notification => {
                                if !self.on_notification(call, msg, sink).await {
                                    return Err(Rejection::new(StatusCode::BAD_REQUEST, codes::INTERNAL_ERROR,
                                        "the client closed the request", Fault::Client, "client_cancelled"));
                                }
                            }
                            MessageKind::Response => {
                                if msg.get("id") == Some(&json!(self.call_id)) {
                                    return Ok(Captured::Final(msg));
                                }
                            }
                            MessageKind::Invalid => {
                                tracing::warn!("ignoring a message from the legacy server that is not JSON-RPC");
                            }
                        },
                        Inbound::Ended { stream: StreamTag::Call(id), error } if id == self.call_id => {
                            let detail = error.map(|e| format!(": {e}")).unwrap_or_default();
                            return Err(Rejection::upstream(
                                format!("the legacy server ended the {} stream without a response{detail}", call.method),
                                "upstream_stream_broken",
                            ));
                        }
                        Inbound::Ended { stream: StreamTag::Get, error } => {
                            tracing::debug!(?error, "legacy GET stream ended");
                        }
                        Inbound::Ended { .. } => {}
                    }
                }
                _ = gather => return Ok(Captured::NeedInput(questions)),
                _ = sleep_until(deadline) => {
                    return Err(Rejection::upstream_timeout(
                        format!("the legacy server did not finish {} within upstream.call_timeout", call.method),
                        "call_timeout",
                    ));
                }
            }
        }
    }

    /// Handles one server request. Returns a question when the client must answer it.
    async fn on_server_request(
        &self,
        call: &Call,
        msg: &Value,
        mode: &mut Mode<'_>,
    ) -> Result<Option<Question>, Rejection> {
        let id = msg.get("id").cloned().unwrap_or(Value::Null);
        let method = msg
            .get("method")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let params = msg.get("params");
        tracing::debug!(%method, server_request_id = %id, "legacy server request");
        if method == "ping" {
            self.answer(&id, Ok(json!({}))).await?;
            return Ok(None);
        }
        let Some(kind) = kind_of(method, params) else {
            self.answer(
                &id,
                Err(ErrorObject::new(
                    codes::METHOD_NOT_FOUND,
                    format!("method not found: {method}"),
                )),
            )
            .await?;
            return Ok(None);
        };
        let Mode::Mrtr {
            book,
            declared,
            minter,
        } = mode
        else {
            let refusal = ErrorObject::new(
                codes::INVALID_PARAMS,
                format!(
                    "{method} cannot be answered during {}: the client can only be asked during tools/call, prompts/get and resources/read",
                    call.method
                ),
            );
            self.answer(&id, Err(refusal)).await?;
            return Ok(None);
        };
        if let Some(required) = missing_capability(kind, params, declared) {
            let refusal = ErrorObject::new(
                codes::INVALID_PARAMS,
                "the client did not declare this capability",
            );
            let _ = self.answer(&id, Err(refusal)).await;
            return Err(Rejection::missing_capability(
                required,
                &format!("the legacy server sent {method} ({})", kind.as_str()),
            ));
        }
        let key = minter.mint(method, params);
        if let Some(answer) = book.answer(&key, kind)? {
            self.answer(&id, Ok(answer)).await?;
            return Ok(None);
        }
        let (request, elicitation_id) = to_input_request(method, params, kind);
        Ok(Some(Question {
            key,
            kind,
            request,
            elicitation_id,
        }))
    }

    /// Relays request-scoped notifications. Returns `false` if the client has gone.
    async fn on_notification(&self, call: &Call, msg: Value, sink: &Sink) -> bool {
        let method = msg
            .get("method")
            .and_then(Value::as_str)
            .unwrap_or_default();
        match method {
            "notifications/progress" => {
                let token = msg.pointer("/params/progressToken");
                if call.meta.progress_token.is_some() && token == call.meta.progress_token.as_ref()
                {
                    return sink.send(msg).await;
                }
            }
            "notifications/message" => {
                let Some(min) = call.meta.log_level.as_deref().and_then(log_level_rank) else {
                    return true; // no logLevel in the request: no log messages at all
                };
                let level = msg
                    .pointer("/params/level")
                    .and_then(Value::as_str)
                    .and_then(log_level_rank);
                if level.is_some_and(|l| l >= min) {
                    return sink.send(msg).await;
                }
            }
            // Session-wide notifications (list_changed, resources/updated) are not this request's;
            // notifications/elicitation/complete has no modern counterpart.
            _ => {}
        }
        true
    }
}

/// Opens and checks a presented `requestState`.
fn open_prior(
    gw: &Gateway,
    call: &Call,
    origin: &str,
    now: u64,
) -> Result<Option<StatePayload>, Rejection> {
    let Some(raw) = call.params.get("requestState") else {
        return Ok(None);
    };
    let result = match raw {
        Value::String(token) => gw.codec.open(token, now).and_then(|(payload, _kid)| {
            if payload.org != origin {
                Err(StateError::WrongOrigin)
            } else if payload.prn != call.principal {
                Err(StateError::WrongPrincipal)
            } else {
                Ok(payload)
            }
        }),
        _ => Err(StateError::NotAString),
    };
    match result {
        Ok(p) => {
            gw.metrics.state_opens.with_label_values(&["ok"]).inc();
            Ok(Some(p))
        }
        Err(e) => {
            gw.metrics
                .state_opens
                .with_label_values(&[e.reason()])
                .inc();
            tracing::warn!(reason = e.reason(), method = %call.method, "refused a requestState");
            Err(Rejection::bad_state(e.reason()))
        }
    }
}

fn input_responses(params: &Value) -> Result<Map<String, Value>, Rejection> {
    match params.get("inputResponses") {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(m)) => Ok(m.clone()),
        Some(_) => Err(Rejection::invalid_params(
            "inputResponses must be an object keyed like inputRequests",
            "bad_input_response",
        )),
    }
}

/// Serves `tools/call`, `prompts/get` or `resources/read`.
pub async fn serve_mrtr(
    gw: &Gateway,
    call: &Call,
    sink: &Sink,
    cancel: &CancellationToken,
) -> Result<Value, Rejection> {
    let started = Instant::now();
    let now = now_secs();
    let origin = origin::digest(&call.method, &call.params);
    let prior = open_prior(gw, call, &origin, now)?;
    let responses = input_responses(&call.params)?;
    let mut book = AnswerBook::new(prior.as_ref(), &responses)?;
    let is_retry = prior.is_some() || !responses.is_empty();
    if prior.is_some() {
        gw.metrics.retries.with_label_values(&["replayed"]).inc();
    }
    let declared = Declared::from_modern(&call.meta.client_capabilities);

    let mut run = Run::start(gw, call, &declared).await?;
    let mut mode = Mode::Mrtr {
        book: &mut book,
        declared: &declared,
        minter: KeyMinter::new(),
    };
    let captured = run
        .capture(
            call,
            &mut mode,
            sink,
            cancel,
            started + gw.config().upstream.call_timeout,
        )
        .await;
    let server_info = translate::server_info(Some(run.init_result()));
    gw.metrics
        .upstream_duration
        .with_label_values(&[method_label(&call.method)])
        .observe(started.elapsed().as_secs_f64());
    match captured {
        Err(rej) => {
            run.abandon(rej.reason).await;
            Err(rej)
        }
        Ok(Captured::Final(msg)) => {
            run.finish().await;
            let hint = if call.method == "resources/read" {
                Some(if is_retry {
                    translate::NO_CACHE
                } else {
                    gw.config().caching.read
                })
            } else {
                None
            };
            final_result(msg, call, &server_info, hint)
        }
        Ok(Captured::NeedInput(questions)) => {
            run.abandon("the client must answer questions first").await;
            let round = prior.as_ref().map_or(0, |p| p.rnd) + 1;
            if round > gw.config().state.max_rounds {
                gw.metrics
                    .max_rounds_exceeded
                    .with_label_values(&[method_label(&call.method)])
                    .inc();
                let what = call_target(call);
                return Err(Rejection::upstream(
                    format!(
                        "{what} asked for input in more than {} rounds (state.max_rounds); the legacy server does not converge, often because its questions change on every execution",
                        gw.config().state.max_rounds
                    ),
                    "max_rounds",
                ));
            }
            let mut payload = gw.codec.fresh_payload(&call.principal, &origin, now);
            payload.rnd = round;
            payload.ans = book.carry();
            let mut input_requests = Map::new();
            for q in questions {
                payload.pnd.insert(
                    q.key.clone(),
                    Pending {
                        kind: q.kind,
                        elicitation_id: q.elicitation_id,
                    },
                );
                input_requests.insert(q.key, q.request);
            }
            let (token, kid) = gw.codec.seal(&payload).map_err(|e| {
                gw.metrics.limit_hits.with_label_values(&["state_max_bytes"]).inc();
                Rejection::internal(
                    format!(
                        "cannot continue {}: its requestState would be {} bytes, above state.max_bytes ({})",
                        call_target(call),
                        e.size,
                        e.limit
                    ),
                    "state_too_large",
                )
            })?;
            gw.metrics.state_seals.with_label_values(&[&kid]).inc();
            gw.metrics.state_bytes.observe(token.len() as f64);
            gw.metrics
                .input_required
                .with_label_values(&[method_label(&call.method)])
                .inc();
            Ok(translate::input_required(
                input_requests,
                token,
                &server_info,
            ))
        }
    }
}

/// "tool \"x\"", "prompt \"y\"", "resource \"z\"" for messages.
fn call_target(call: &Call) -> String {
    let (what, member) = match call.method.as_str() {
        "tools/call" => ("tool", "name"),
        "prompts/get" => ("prompt", "name"),
        "resources/read" => ("resource", "uri"),
        other => (other, "name"),
    };
    let name = call
        .params
        .get(member)
        .and_then(Value::as_str)
        .unwrap_or("?");
    format!("{what} {name:?}")
}

/// Serves a method that is forwarded as is (lists, completion).
pub async fn serve_forward(
    gw: &Gateway,
    call: &Call,
    sink: &Sink,
    cancel: &CancellationToken,
) -> Result<Value, Rejection> {
    let started = Instant::now();
    // Declare nothing: a well-behaved legacy server then asks nothing.
    let mut run = Run::start(gw, call, &Declared::default()).await?;
    let captured = run
        .capture(
            call,
            &mut Mode::Forward,
            sink,
            cancel,
            started + gw.config().upstream.call_timeout,
        )
        .await;
    let server_info = translate::server_info(Some(run.init_result()));
    gw.metrics
        .upstream_duration
        .with_label_values(&[method_label(&call.method)])
        .observe(started.elapsed().as_secs_f64());
    match captured {
        Ok(Captured::Final(msg)) => {
            run.finish().await;
            let hint = crate::protocol::methods::is_cacheable(&call.method)
                .then_some(gw.config().caching.list);
            final_result(msg, call, &server_info, hint)
        }
        Ok(Captured::NeedInput(_)) => unreachable!("forward mode collects no questions"),
        Err(rej) => {
            run.abandon(rej.reason).await;
            Err(rej)
        }
    }
}

fn final_result(
    msg: Value,
    call: &Call,
    server_info: &Value,
    hint: Option<crate::config::CacheHint>,
) -> Result<Value, Rejection> {
    if let Some(result) = msg.get("result") {
        return Ok(translate::complete(result.clone(), server_info, hint));
    }
    let err = msg.get("error").cloned().unwrap_or_else(|| json!({}));
    let mapped = translate::map_legacy_error(&err, &call.params);
    let status = if mapped.code == codes::METHOD_NOT_FOUND {
        StatusCode::NOT_FOUND
    } else {
        StatusCode::OK
    };
    Err(Rejection {
        status,
        error: mapped,
        fault: Fault::Upstream,
        reason: "legacy_error",
        headers: Vec::new(),
    })
}

/// Dispatches a routed method to its server.
pub async fn serve(
    gw: &Gateway,
    call: &Call,
    sink: &Sink,
    cancel: &CancellationToken,
) -> Result<Value, Rejection> {
    match route(&call.method) {
        Route::Mrtr => serve_mrtr(gw, call, sink, cancel).await,
        Route::Forward => serve_forward(gw, call, sink, cancel).await,
        _ => Err(Rejection::method_not_found(&call.method)),
    }
}
