//! One legacy call in flight, and the capture loop that reads it.
//!
//! A [`Run`] owns a legacy session with the modern request's call sent on it. [`Run::capture`]
//! reads everything the session delivers — the call's stream and the GET stream, through one
//! channel — until the call's response arrives (`Captured::Final`) or the client must answer
//! something (`Captured::NeedInput`). A run can also be rebuilt from a parked call
//! ([`Run::resumed`]); its capture then starts with what arrived while it was parked.

use std::collections::HashMap;
use std::time::Instant;

use serde_json::{Map, Value, json};
use tokio::sync::mpsc;
use tokio::time::sleep_until;
use tokio_util::sync::CancellationToken;

use super::answers::AnswerBook;
use super::deps::Engine;
use super::input_key::KeyMinter;
use super::input_request::{kind_of, missing_capability, to_input_request};
use super::parking::{ParkedCall, Resumed};
use super::shape::shape;
use crate::caller_scope::CallerScope;
use crate::error::{Rejection, RejectionKind};
use crate::legacy::http::HttpError;
use crate::legacy::pool::{Lease, PoolKey};
use crate::legacy::roots_refresh::{self, Observed};
use crate::legacy::session::{Inbound, LegacySession, SessionError, StreamTag};
use crate::metrics::method_label;
use crate::policy::Stage;
use crate::state::InputKind;
use crate::upstream_error::session_rejection;
use mrtr_wire::capabilities::Declared;
use mrtr_wire::jsonrpc::{self, ErrorObject, MessageKind, codes};
use mrtr_wire::protocol::meta::{RequestMeta, log_level_rank};
use mrtr_wire::protocol::methods::required_server_capability;

/// One modern request, as the engine needs it.
pub struct Call {
    pub id: Value,
    pub method: String,
    pub params: Value,
    pub meta: RequestMeta,
    pub principal: String,
    /// Whom this call's quotas count against (parked calls, single-use entries).
    pub caller: crate::caller_scope::Caller,
    /// Headers to send on every upstream request of this call (credentials, trace context).
    pub upstream_headers: http::HeaderMap,
    /// A digest of the credential forwarded upstream ("" when none is): part of the key
    /// under which warm sessions are shared.
    pub credential: String,
}

impl Call {
    /// Whom the legacy sessions of this call work for.
    pub fn scope(&self) -> CallerScope {
        CallerScope::new(self.principal.clone(), self.credential.clone())
    }

    /// The tool or prompt name, or the resource URI.
    pub fn target(&self) -> Option<&str> {
        let member = match self.method.as_str() {
            "resources/read" => "uri",
            _ => "name",
        };
        self.params.get(member).and_then(Value::as_str)
    }

    /// "tool \"x\"", "prompt \"y\"", "resource \"z\"" for messages.
    pub fn describe(&self) -> String {
        let what = match self.method.as_str() {
            "tools/call" => "tool",
            "prompts/get" => "prompt",
            "resources/read" => "resource",
            other => other,
        };
        format!("{what} {:?}", self.target().unwrap_or("?"))
    }
}

/// Where request-scoped notifications go: the client's SSE response, if it can take one.
pub struct Sink {
    tx: Option<mpsc::Sender<Value>>,
    /// The call goes on without the client: a notification it can no longer take is dropped.
    outlives_client: bool,
}

impl Sink {
    pub fn new(tx: Option<mpsc::Sender<Value>>) -> Sink {
        Sink {
            tx,
            outlives_client: false,
        }
    }

    /// The same destination, for a call that must finish even if the client goes away (a
    /// claimed retry, see `mrtr::at_most_once`).
    pub fn outliving_client(&self) -> Sink {
        Sink {
            tx: self.tx.clone(),
            outlives_client: true,
        }
    }

    /// Sends a notification; `false` when the client has gone away (and the call should
    /// stop with it).
    async fn send(&self, msg: Value) -> bool {
        match &self.tx {
            Some(tx) => tx.send(msg).await.is_ok() || self.outlives_client,
            None => true,
        }
    }
}

/// One question the legacy server is waiting on.
pub struct Question {
    pub key: String,
    pub kind: InputKind,
    /// The `inputRequests` entry.
    pub request: Value,
    pub elicitation_id: Option<String>,
    /// The server's id for this request (needed to answer it if the call is parked).
    pub server_id: Value,
    pub shape: String,
}

/// What to do with server requests during capture.
pub enum Mode<'a> {
    Mrtr {
        book: &'a mut AnswerBook,
        declared: &'a Declared,
        minter: KeyMinter,
        /// Shapes of the questions the previous round asked, by shape → key.
        prior_shapes: HashMap<String, String>,
    },
    Forward,
}

pub enum Captured {
    /// The legacy JSON-RPC response to the call.
    Final(Value),
    /// Questions the client must answer.
    NeedInput(Vec<Question>),
}

/// When a round of questions closes (see `[mrtr] gather_window` / `gather_quiet`): once the
/// server has been quiet for `quiet` since the last new question, but never later than
/// `window` after the first — and, while a lagging `roots/list` may still come, not before.
struct Gather {
    window: std::time::Duration,
    quiet: std::time::Duration,
    first: Option<tokio::time::Instant>,
    last: Option<tokio::time::Instant>,
    /// The client declared roots, the session has a GET stream, and no `roots/list` has come.
    awaiting_roots: bool,
}

impl Gather {
    fn asked(&mut self, kind: InputKind) {
        let now = tokio::time::Instant::now();
        self.first.get_or_insert(now);
        self.last = Some(now);
        if kind == InputKind::Roots {
            self.awaiting_roots = false;
        }
    }

    /// A `roots/list` came, whatever becomes of it (answered, refused by the policy, asked).
    fn roots_arrived(&mut self) {
        self.awaiting_roots = false;
    }

    /// When the round closes, if a question is pending.
    fn due(&self) -> Option<tokio::time::Instant> {
        let first = self.first?;
        let by_window = first + self.window;
        if self.awaiting_roots {
            return Some(by_window);
        }
        Some(by_window.min(self.last.unwrap_or(first) + self.quiet))
    }
}

/// How a run began.
pub enum Start<'g> {
    /// The call is on its way.
    Sent(Box<Run<'g>>),
    /// Before the call went out, the reused session's server asked for roots that this
    /// request's client must give (see [`crate::legacy::roots_refresh`]): that is the round's
    /// question. The call was never sent and the session is closed, so nothing is parked.
    Asked {
        question: Question,
        /// The identity of the server that asked.
        server_info: Value,
    },
}

/// The call id of a run whose call has not been sent yet.
const NO_CALL: i64 = i64::MIN;

/// Why a run could not start.
pub struct StartError {
    pub rejection: Rejection,
    /// Whether the call may have reached the legacy server (then it may have run).
    pub call_sent: bool,
}

/// Why the roots refresh before a call failed.
enum Refresh {
    Session(SessionError),
    /// The server's `roots/list` could not be answered (a bad answer in the book).
    Refused(Rejection),
    /// The server's `roots/list` was refused (the policy, or a request the call may not make):
    /// the server still holds the earlier client's roots, so this session must not serve the
    /// call.
    Stale,
}

/// What became of one server request.
enum Handled {
    /// Answered upstream: `ping`, or from the answers book.
    Answered,
    /// Refused upstream: unknown, out of place (a list, not a call), or by the policy.
    Refused,
    /// The client must answer it.
    Asked(Question),
}

/// A legacy session with the modern request's call in flight.
pub struct Run<'g> {
    engine: &'g Engine,
    /// Where the session goes back after a clean completion.
    pool_key: PoolKey,
    session: Option<LegacySession>,
    inbound: mpsc::Receiver<Inbound>,
    call_id: i64,
    backlog: std::collections::VecDeque<Inbound>,
    /// The server has asked this session for roots (it may have cached them).
    roots_asked: bool,
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

fn call_timeout(call: &Call) -> Rejection {
    Rejection::new(
        RejectionKind::CallTimeout,
        format!(
            "the legacy server did not finish {} within upstream.call_timeout",
            call.method
        ),
    )
}

fn client_gone() -> Rejection {
    Rejection::new(
        RejectionKind::ClientCancelled,
        "the client closed the request",
    )
}

impl<'g> Run<'g> {
    /// Takes a session declaring `declared` (a warm one, or a new one), checks that its server
    /// offers the method, makes a reused session ask for this client's roots when it may hold
    /// an earlier client's (MRTR methods only; the server's `roots/list` is handled as `mode`
    /// handles any server request), and sends the call — on one fresh session if the server
    /// forgot the first before the call arrived. On failure, says whether the call may have
    /// reached the legacy server.
    pub async fn start(
        engine: &'g Engine,
        call: &Call,
        declared: &Declared,
        mode: &mut Mode<'_>,
    ) -> Result<Start<'g>, StartError> {
        let params = legacy_params(&call.params);
        let pool_key = PoolKey::new(&call.scope(), declared);
        let not_sent = |rejection| StartError {
            rejection,
            call_sent: false,
        };
        for attempt in 0..2 {
            // A warm session first; after a 404, always a fresh one.
            let lease = if attempt == 0 {
                engine
                    .sessions
                    .checkout(&pool_key, declared, call.upstream_headers.clone())
                    .await
            } else {
                engine
                    .sessions
                    .open(declared, call.upstream_headers.clone())
                    .await
                    .map(|(session, inbound)| Lease::fresh(session, inbound))
            }
            .map_err(not_sent)?;
            let mut run = Run {
                engine,
                pool_key: pool_key.clone(),
                roots_asked: lease.roots_asked,
                session: Some(lease.session),
                inbound: lease.inbound,
                call_id: NO_CALL,
                backlog: Default::default(),
            };
            // Routing: the method must be offered by the session that would serve it — this
            // caller's own — not by whatever another caller's session once answered.
            if let Some(cap) = required_server_capability(&call.method)
                && run
                    .init_result()
                    .pointer(&format!("/capabilities/{cap}"))
                    .is_none()
            {
                run.finish().await;
                return Err(not_sent(Rejection::method_not_found(&call.method)));
            }
            if let Some(level) = &call.meta.log_level
                && run.init_result().pointer("/capabilities/logging").is_some()
            {
                // Per-call session: a session-wide level is this request's level.
                let _ = run
                    .session_mut()
                    .request("logging/setLevel", Some(json!({"level": level})))
                    .await;
            }
            match run.refresh_roots(call, declared, mode).await {
                Ok(None) => {}
                Ok(Some(question)) => {
                    let server_info = crate::translate::server_info(Some(run.init_result()));
                    run.close().await;
                    return Ok(Start::Asked {
                        question,
                        server_info,
                    });
                }
                Err(Refresh::Session(SessionError::Expired)) if attempt == 0 => {
                    tracing::info!("legacy session expired before the call; re-initializing once");
                    run.discard_expired();
                    continue;
                }
                Err(Refresh::Session(e)) => {
                    run.close().await;
                    return Err(not_sent(session_rejection(&e)));
                }
                Err(Refresh::Refused(rejection)) => {
                    run.close().await;
                    return Err(not_sent(rejection));
                }
                Err(Refresh::Stale) if attempt == 0 => {
                    // The server kept the earlier client's roots: serve this call on a fresh
                    // session, which has none.
                    tracing::info!(
                        "a reused legacy session's roots/list was refused; the call goes to a fresh session"
                    );
                    run.close().await;
                    continue;
                }
                Err(Refresh::Stale) => {
                    run.close().await;
                    return Err(not_sent(Rejection::new(
                        RejectionKind::UpstreamProtocolError,
                        "a fresh legacy session still needed its roots refreshed",
                    )));
                }
            }
            match run
                .session_mut()
                .request(&call.method, Some(params.clone()))
                .await
            {
                Ok(call_id) => {
                    run.call_id = call_id;
                    return Ok(Start::Sent(Box::new(run)));
                }
                Err(SessionError::Expired) if attempt == 0 => {
                    tracing::info!("legacy session expired before the call; re-initializing once");
                    run.discard_expired();
                }
                Err(e) => {
                    run.close().await;
                    // A refused connection never carried the call; anything later might have.
                    let call_sent = !matches!(
                        e,
                        SessionError::Http(HttpError::Connect(_) | HttpError::Tls { .. })
                    );
                    return Err(StartError {
                        rejection: session_rejection(&e),
                        call_sent,
                    });
                }
            }
        }
        Err(not_sent(Rejection::new(
            RejectionKind::UpstreamSessionExpired,
            "the legacy server expired two fresh sessions in a row",
        )))
    }

    /// Before the call of an MRTR request declaring roots, on a reused session whose server
    /// has asked an earlier client for roots: `notifications/roots/list_changed`, then (unless
    /// this upstream was learned to ignore it) a bounded wait for the server's `roots/list`,
    /// which is answered from the answers book or becomes this request's question.
    async fn refresh_roots(
        &mut self,
        call: &Call,
        declared: &Declared,
        mode: &mut Mode<'_>,
    ) -> Result<Option<Question>, Refresh> {
        if !(self.roots_asked && declared.roots && matches!(mode, Mode::Mrtr { .. })) {
            return Ok(None);
        }
        let cfg = self.engine.config();
        let memory = self.engine.sessions.pool().roots_memory();
        let probes = cfg.pool.roots_refresh_probes;
        let wait = if memory.should_wait(probes) {
            cfg.pool.roots_refresh_wait
        } else {
            std::time::Duration::ZERO
        };
        let session = self
            .session
            .as_ref()
            .expect("session is open while the run lives");
        let asked =
            roots_refresh::notify_and_wait(session, &mut self.inbound, &mut self.backlog, wait)
                .await
                .map_err(Refresh::Session)?;
        let counter = &self.engine.metrics.roots_refreshes;
        let Some(msg) = asked else {
            if wait.is_zero() {
                counter.with_label_values(&["not_waited"]).inc();
            } else {
                counter.with_label_values(&["timeout"]).inc();
                if memory.record(Observed::Timeout, probes) {
                    tracing::info!(
                        waits = probes,
                        "the legacy server never asked for roots again after notifications/roots/list_changed; \
                         no longer waiting for it on reused sessions (until the next reload). If it caches \
                         roots per session, use pool.mode = \"per-call\""
                    );
                }
            }
            return Ok(None);
        };
        counter.with_label_values(&["reasked"]).inc();
        memory.record(Observed::Reasked, probes);
        match self
            .on_server_request(call, &msg, mode)
            .await
            .map_err(Refresh::Refused)?
        {
            Handled::Answered => Ok(None),
            Handled::Asked(question) => Ok(Some(question)),
            Handled::Refused => Err(Refresh::Stale),
        }
    }

    /// A run rebuilt from a parked call; returns it with the questions the server is still
    /// waiting on and the key minter of that execution.
    pub fn resumed(engine: &'g Engine, r: Resumed) -> (Run<'g>, Vec<Question>, KeyMinter) {
        let ParkedCall {
            session,
            call_id,
            waiting,
            minter,
            pool_key,
            roots_asked,
            ..
        } = r.call;
        (
            Run {
                engine,
                pool_key,
                session: Some(session),
                inbound: r.inbound,
                call_id,
                backlog: r.backlog.into(),
                roots_asked,
            },
            waiting,
            minter,
        )
    }

    fn session(&self) -> &LegacySession {
        self.session
            .as_ref()
            .expect("session is open while the run lives")
    }

    fn session_mut(&mut self) -> &mut LegacySession {
        self.session
            .as_mut()
            .expect("session is open while the run lives")
    }

    /// Ends a session on which no call was sent.
    async fn close(&mut self) {
        if let Some(s) = self.session.take() {
            s.close().await;
        }
    }

    /// Drops a session the server has already forgotten.
    fn discard_expired(&mut self) {
        if let Some(s) = self.session.take() {
            s.discard_expired();
        }
    }

    pub fn init_result(&self) -> &Value {
        self.session().init_result()
    }

    /// Ends the legacy call: tells the server to stop, then ends the session.
    pub async fn abandon(&mut self, reason: &str) {
        if let Some(s) = self.session.take() {
            let _ = s.cancel(self.call_id, reason).await;
            s.close().await;
        }
    }

    /// After a clean completion: the session goes back to the pool (or is closed, per
    /// `pool.mode`).
    pub async fn finish(mut self) {
        if let Some(session) = self.session.take() {
            let inbound = std::mem::replace(&mut self.inbound, mpsc::channel(1).1);
            let lease = Lease {
                session,
                inbound,
                roots_asked: self.roots_asked,
            };
            self.engine
                .sessions
                .give_back(self.pool_key.clone(), lease)
                .await;
        }
    }

    /// Hands the live call over for parking.
    pub fn into_parked(
        mut self,
        waiting: Vec<Question>,
        minter: KeyMinter,
        what: String,
    ) -> (ParkedCall, mpsc::Receiver<Inbound>) {
        let session = self
            .session
            .take()
            .expect("session is open while the run lives");
        let call = ParkedCall {
            session,
            call_id: self.call_id,
            waiting,
            minter,
            what,
            pool_key: self.pool_key.clone(),
            roots_asked: self.roots_asked,
        };
        (call, self.inbound)
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

    /// Answers the questions a resumed call was waiting on from `book`; returns those still
    /// unanswered.
    pub async fn answer_waiting(
        &self,
        waiting: Vec<Question>,
        book: &mut AnswerBook,
    ) -> Result<Vec<Question>, Rejection> {
        let mut still = Vec::new();
        for q in waiting {
            match book.answer(&q.key, q.kind)? {
                Some(answer) => self.answer(&q.server_id, Ok(answer)).await?,
                None => still.push(q),
            }
        }
        Ok(still)
    }

    async fn next_item(&mut self) -> Option<Inbound> {
        match self.backlog.pop_front() {
            Some(item) => Some(item),
            None => self.inbound.recv().await,
        }
    }

    /// Reads until the call's response or until questions for the client are gathered.
    /// `questions` may start non-empty (a resumed call still waiting on some): the gather
    /// window then starts at once.
    pub async fn capture(
        &mut self,
        call: &Call,
        mode: &mut Mode<'_>,
        sink: &Sink,
        cancel: &CancellationToken,
        deadline: Instant,
        mut questions: Vec<Question>,
    ) -> Result<Captured, Rejection> {
        let cfg = self.engine.config();
        // A `roots/list` may still be on its way on the GET stream (Python SDK servers send
        // it there, tens of milliseconds behind the call stream's requests).
        let roots_may_lag = matches!(mode, Mode::Mrtr { declared, .. } if declared.roots)
            && self.session().has_get_stream();
        let mut gather = Gather {
            window: cfg.mrtr.gather_window,
            quiet: cfg.mrtr.gather_quiet,
            first: None,
            last: None,
            awaiting_roots: roots_may_lag,
        };
        for q in &questions {
            gather.asked(q.kind);
        }
        let deadline = tokio::time::Instant::from_std(deadline);
        loop {
            let due = gather.due();
            // The round is due and nothing else is waiting to be read: close it now (a timer
            // would add its own millisecond).
            if due.is_some_and(|d| d <= tokio::time::Instant::now())
                && self.backlog.is_empty()
                && self.inbound.is_empty()
            {
                return Ok(Captured::NeedInput(questions));
            }
            let gather_timer = async {
                match due {
                    Some(t) => sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return Err(client_gone()),
                item = self.next_item() => {
                    let Some(item) = item else {
                        return Err(Rejection::new(RejectionKind::UpstreamStreamBroken, "the legacy session ended unexpectedly"));
                    };
                    match item {
                        Inbound::Message(_, msg) => match jsonrpc::classify(&msg) {
                            MessageKind::Request => {
                                if roots_refresh::is_roots_request(&msg) {
                                    self.roots_asked = true;
                                    // Answered, refused or asked: the lagging one has come.
                                    gather.roots_arrived();
                                }
                                if let Handled::Asked(q) = self.on_server_request(call, &msg, mode).await? {
                                    gather.asked(q.kind);
                                    questions.push(q);
                                }
                            }
                            MessageKind::Notification => {
                                // Relaying waits for the client to read; one that never does
                                // must not hold the legacy call past its deadline.
                                let relayed = tokio::select! {
                                    biased;
                                    _ = cancel.cancelled() => return Err(client_gone()),
                                    _ = sleep_until(deadline) => return Err(call_timeout(call)),
                                    relayed = self.on_notification(call, msg, sink) => relayed,
                                };
                                if !relayed {
                                    return Err(client_gone());
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
                            // How it ended (stderr, exit status) is for the log only.
                            return Err(crate::upstream_error::concealed(
                                Rejection::new(
                                    RejectionKind::UpstreamStreamBroken,
                                    format!("the upstream MCP server ended the {} stream without a response", call.method),
                                ),
                                error.as_deref().unwrap_or("no error reported"),
                            ));
                        }
                        Inbound::Ended { stream: StreamTag::Get, error } => {
                            tracing::debug!(?error, "legacy GET stream ended");
                        }
                        Inbound::Ended { .. } => {}
                    }
                }
                _ = gather_timer => return Ok(Captured::NeedInput(questions)),
                _ = sleep_until(deadline) => return Err(call_timeout(call)),
            }
        }
    }

    /// Handles one server request. Returns a question when the client must answer it.
    async fn on_server_request(
        &self,
        call: &Call,
        msg: &Value,
        mode: &mut Mode<'_>,
    ) -> Result<Handled, Rejection> {
        let id = msg.get("id").cloned().unwrap_or(Value::Null);
        let method = msg
            .get("method")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let params = msg.get("params").filter(|p| !p.is_null());
        tracing::debug!(%method, server_request_id = %id, "legacy server request");
        if method == "ping" {
            self.answer(&id, Ok(json!({}))).await?;
            return Ok(Handled::Answered);
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
            return Ok(Handled::Refused);
        };
        let Mode::Mrtr {
            book,
            declared,
            minter,
            prior_shapes,
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
            return Ok(Handled::Refused);
        };
        // The policy stage first: a question it refuses is never shown, so the client needs no
        // capability for it and the call goes on with the legacy server's next step.
        let (request, elicitation_id) = to_input_request(method, params, kind);
        let cfg = self.engine.config();
        let stage = Stage {
            policy: &cfg.policy,
            metrics: &self.engine.metrics.policy,
        };
        let request = match stage.review(&call.method, call.target(), kind, request) {
            Ok(request) => request,
            Err(refusal) => {
                self.answer(&id, refusal.legacy_answer()).await?;
                return Ok(Handled::Refused);
            }
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
            return Ok(Handled::Answered);
        }
        let shape = shape(method, params);
        if let Some(previous) = prior_shapes.get(&shape)
            && *previous != key
        {
            self.engine
                .metrics
                .volatile_questions
                .with_label_values(&[method_label(&call.method)])
                .inc();
            tracing::warn!(
                call = %call.describe(),
                previous_key = %previous,
                new_key = %key,
                "the legacy server re-asked last round's question with different volatile details \
                 (a timestamp, counter or id?); replay cannot converge until its questions are deterministic"
            );
        }
        Ok(Handled::Asked(Question {
            key,
            kind,
            request,
            elicitation_id,
            server_id: id,
            shape,
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
            // Session-wide notifications are not this request's: they go to the listen streams
            // of this caller on this replica. notifications/elicitation/complete has no modern
            // counterpart.
            m if crate::legacy::relay::is_session_wide(m) => {
                self.engine.relay.publish(&call.scope(), &msg)
            }
            _ => {}
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn gather(awaiting_roots: bool) -> Gather {
        Gather {
            window: Duration::from_millis(100),
            quiet: Duration::from_millis(2),
            first: None,
            last: None,
            awaiting_roots,
        }
    }

    #[test]
    fn a_round_closes_after_the_quiet_period_unless_roots_may_still_come() {
        let mut g = gather(false);
        assert!(g.due().is_none(), "no question, no round");
        g.asked(InputKind::ElicitForm);
        let first = g.first.unwrap();
        assert_eq!(g.due(), Some(first + Duration::from_millis(2)));

        let mut g = gather(true);
        g.asked(InputKind::ElicitForm);
        let first = g.first.unwrap();
        assert_eq!(
            g.due(),
            Some(first + Duration::from_millis(100)),
            "waits for a lagging roots/list"
        );
        g.asked(InputKind::Roots);
        let last = g.last.unwrap();
        assert_eq!(
            g.due(),
            Some((last + Duration::from_millis(2)).min(first + Duration::from_millis(100)))
        );

        // A roots/list that never becomes a question (refused by the policy, or answered
        // from an earlier round) also ends the wait for it.
        let mut g = gather(true);
        g.asked(InputKind::ElicitForm);
        let first = g.first.unwrap();
        g.roots_arrived();
        assert_eq!(g.due(), Some(first + Duration::from_millis(2)));
    }
}
