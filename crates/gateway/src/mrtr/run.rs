//! One legacy call in flight, and the capture loop that reads it.
//!
//! A [`Run`] owns the exchange (a legacy session and its reader, [`crate::legacy::exchange`])
//! with the modern request's call sent on it. [`Run::capture`] takes the exchange's events —
//! the call's stream and the GET stream alike, `ping` already answered — until the call's
//! response arrives (`Captured::Final`) or the client must answer something
//! (`Captured::NeedInput`). A run can also be rebuilt from a parked call ([`Run::resumed`]);
//! its capture then starts with what arrived while it was parked.

use std::collections::HashMap;
use std::time::Instant;

use serde_json::Value;
use tokio::time::sleep_until;
use tokio_util::sync::CancellationToken;

use super::answers::AnswerBook;
pub use super::call::{Call, Sink};
use super::deps::Engine;
use super::gather::Gather;
use super::input_key::KeyMinter;
use super::input_request::{kind_of, missing_capability, to_input_request};
use super::parking::{ParkedCall, Resumed};
use super::round_shapes::ShapeKey;
use super::shape::shape;
pub use super::start::{Start, StartError};
use crate::error::{Rejection, RejectionKind};
use crate::legacy::exchange::{Event, Exchange, Reader};
use crate::legacy::pool::{Lease, PoolKey};
use crate::legacy::roots_refresh;
use crate::legacy::server_request::ServerRequest;
use crate::legacy::session::LegacySession;
use crate::policy::Stage;
use crate::state::InputKind;
use crate::upstream_error::session_rejection;
use mrtr_wire::capabilities::Declared;
use mrtr_wire::jsonrpc::{ErrorObject, codes};
use mrtr_wire::protocol::meta::log_level_rank;

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
        /// Which round this capture gathers (1 for the first).
        round: u32,
    },
    Forward,
}

pub enum Captured {
    /// The legacy JSON-RPC response to the call.
    Final(Value),
    /// Questions the client must answer.
    NeedInput(Vec<Question>),
}

/// What became of one server request.
pub(super) enum Handled {
    /// Answered upstream from the answers book (`ping` never gets here: the exchange answers it).
    Answered,
    /// Refused upstream: unknown, out of place (a list, not a call), or by the policy.
    Refused,
    /// The client must answer it.
    Asked(Question),
}

/// A legacy session with the modern request's call in flight.
pub struct Run<'g> {
    pub(super) engine: &'g Engine,
    /// Where the session goes back after a clean completion.
    pub(super) pool_key: PoolKey,
    /// The session and its reader; `None` once the run has let go of it.
    pub(super) exchange: Option<Exchange>,
    pub(super) call_id: i64,
    /// The server has asked this session for roots (it may have cached them).
    pub(super) roots_asked: bool,
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
                exchange: Some(Exchange::new(session, r.reader)),
                call_id,
                roots_asked,
            },
            waiting,
            minter,
        )
    }

    pub(super) fn exchange_mut(&mut self) -> &mut Exchange {
        self.exchange
            .as_mut()
            .expect("session is open while the run lives")
    }

    fn session(&self) -> &LegacySession {
        self.exchange
            .as_ref()
            .expect("session is open while the run lives")
            .session()
    }

    pub(super) fn session_mut(&mut self) -> &mut LegacySession {
        self.exchange_mut().session_mut()
    }

    /// Ends a session on which no call was sent.
    pub(super) async fn close(&mut self) {
        if let Some(x) = self.exchange.take() {
            x.close().await;
        }
    }

    /// Drops a session the server has already forgotten.
    pub(super) fn discard_expired(&mut self) {
        if let Some(x) = self.exchange.take() {
            x.into_parts().0.discard_expired();
        }
    }

    pub fn init_result(&self) -> &Value {
        self.session().init_result()
    }

    /// The session's `InitializeResult`, shared with the session.
    pub fn init_shared(&self) -> std::sync::Arc<Value> {
        self.session().init_shared()
    }

    /// Ends the legacy call: tells the server to stop, then ends the session.
    pub async fn abandon(&mut self, reason: &str) {
        if let Some(x) = self.exchange.take() {
            let _ = x.session().cancel(self.call_id, reason).await;
            x.close().await;
        }
    }

    /// After a clean completion: the session goes back to the pool (or is closed, per
    /// `pool.mode`).
    pub async fn finish(mut self) {
        if let Some(exchange) = self.exchange.take() {
            let lease = Lease {
                exchange,
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
    ) -> (ParkedCall, Reader) {
        let (session, reader) = self
            .exchange
            .take()
            .expect("session is open while the run lives")
            .into_parts();
        let call = ParkedCall {
            session,
            call_id: self.call_id,
            waiting,
            minter,
            what,
            pool_key: self.pool_key.clone(),
            roots_asked: self.roots_asked,
        };
        (call, reader)
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
        let shape_key = self.shape_key(call, mode, cfg.mrtr.learned_rounds_max);
        let expected = shape_key
            .as_ref()
            .and_then(|k| self.engine.round_shapes.expected(k));
        let mut gather = Gather::new(
            cfg.mrtr.gather_window,
            cfg.mrtr.gather_quiet,
            roots_may_lag,
            expected,
        );
        for q in &questions {
            gather.asked(q.kind);
        }
        let deadline = tokio::time::Instant::from_std(deadline);
        loop {
            let due = gather.due();
            // The round is due and nothing else is waiting to be read: close it now (a timer
            // would add its own millisecond).
            if due.is_some_and(|d| d <= tokio::time::Instant::now())
                && !self.exchange_mut().reader_mut().has_ready()
            {
                self.round_closed(&gather, shape_key);
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
                event = self.exchange_mut().next() => match event {
                    Event::Request(msg) => {
                        if roots_refresh::is_roots_request(&msg) {
                            self.roots_asked = true;
                            // Answered, refused or asked: the lagging one has come.
                            gather.roots_arrived();
                        }
                        // Boxed: a server request's handling is the largest state a
                        // capture can be in, and a plain call never enters it.
                        let handled = Box::pin(self.on_server_request(call, &msg, mode)).await?;
                        if let Handled::Asked(q) = handled {
                            gather.asked(q.kind);
                            questions.push(q);
                        }
                    }
                    Event::Notification { method, msg } => {
                        // Relaying waits for the client to read; one that never does must not
                        // hold the legacy call past its deadline.
                        let relayed = tokio::select! {
                            biased;
                            _ = cancel.cancelled() => return Err(client_gone()),
                            _ = sleep_until(deadline) => return Err(call_timeout(call)),
                            relayed = self.on_notification(call, &method, msg, sink) => relayed,
                        };
                        if !relayed {
                            return Err(client_gone());
                        }
                    }
                    Event::Response { id, msg } if id == self.call_id => {
                        return Ok(Captured::Final(msg));
                    }
                    Event::CallEnded { id, error } if id == self.call_id => {
                        // How it ended (stderr, exit status) is for the log only.
                        return Err(crate::upstream_error::concealed(
                            Rejection::new(
                                RejectionKind::UpstreamStreamBroken,
                                format!("the upstream MCP server ended the {} stream without a response", call.method),
                            ),
                            error.as_deref().unwrap_or("no error reported"),
                        ));
                    }
                    Event::StreamEnded { error } => {
                        tracing::debug!(?error, "legacy GET stream ended");
                    }
                    Event::Closed => {
                        return Err(Rejection::new(RejectionKind::UpstreamStreamBroken, "the legacy session ended unexpectedly"));
                    }
                    // Leftovers of earlier requests on this session.
                    Event::Response { .. } | Event::CallEnded { .. } | Event::Invalid(_) => {}
                },
                _ = gather_timer => {
                    self.round_closed(&gather, shape_key);
                    return Ok(Captured::NeedInput(questions));
                }
                _ = sleep_until(deadline) => return Err(call_timeout(call)),
            }
        }
    }

    /// Which learned round this capture is, for an MRTR request while learning is on.
    fn shape_key(&self, call: &Call, mode: &Mode<'_>, max: usize) -> Option<ShapeKey> {
        let Mode::Mrtr {
            declared, round, ..
        } = mode
        else {
            return None;
        };
        (max > 0).then(|| ShapeKey {
            scope: call.scope(),
            method: call.method.clone(),
            target: call.target().map(str::to_string),
            round: *round,
            roots_declared: declared.roots,
        })
    }

    /// A round closed: counts what closed it and remembers what it asked.
    fn round_closed(&self, gather: &Gather, key: Option<ShapeKey>) {
        let metrics = &self.engine.metrics;
        metrics.round_closed(gather.closed_by());
        if let Some(key) = key {
            let max = self.engine.config().mrtr.learned_rounds_max;
            let kept = self.engine.round_shapes.learn(key, gather.shape(), max);
            metrics.learned_rounds(kept);
        }
    }

    /// Handles one server request. Returns a question when the client must answer it.
    pub(super) async fn on_server_request(
        &self,
        call: &Call,
        msg: &Value,
        mode: &mut Mode<'_>,
    ) -> Result<Handled, Rejection> {
        let request = ServerRequest::of(msg);
        let (id, method, params) = (request.id.clone(), request.method, request.params);
        tracing::debug!(%method, server_request_id = %id, "legacy server request");
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
            ..
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
            metrics: self.engine.metrics.policy(),
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
            self.engine.metrics.volatile_question(&call.method);
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
    async fn on_notification(&self, call: &Call, method: &str, msg: Value, sink: &Sink) -> bool {
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
