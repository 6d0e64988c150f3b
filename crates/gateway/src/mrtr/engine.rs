//! The MRTR engine: one modern request, served through one legacy call.
//!
//! The request path, top to bottom ([`serve_mrtr`]):
//! 1. **Open the presented state** (if any) and check it is bound to this request and caller:
//!    nothing reaches the legacy server until the state is proven good.
//! 2. **Validate `inputResponses`** for the keys the state asked; the rest are checked when
//!    (if) the legacy server asks for them.
//! 3. **Resume or start.** If the state points at a call parked on this replica, take it
//!    back and answer the questions it is blocked on (no re-execution). Otherwise open a
//!    legacy session declaring exactly this request's capabilities and send the call (a
//!    replay, when this is a retry) — unless the call is `park-only`, which must not run twice.
//! 4. **Capture** ([`Run::capture`]): answer what can be answered, relay progress and logs,
//!    gather new questions for a short window.
//! 5. **Finish**: the legacy response becomes the final result; collected questions become an
//!    `input_required` result with a freshly sealed state, and the legacy call is parked (when
//!    the policy and the lot allow) or cancelled.
//!
//! Non-MRTR methods ([`serve_forward`]) take steps 3–5 with every server request refused
//! upstream, so they can never end in `input_required`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::answers::AnswerBook;
use super::at_most_once::{self, Claimed, Guard, Render};
use super::deps::Engine;
use super::input_key::KeyMinter;
use super::long_call;
use super::origin;
use super::parking::{ParkLimits, Refused};
use super::round::{Round, asked, max_rounds, seal_round};
use super::run::{Captured, Mode, Question, Run, Start};
use super::url_required;
use crate::config::{CacheHint, ParkPolicy};
use crate::error::{Rejection, RejectionKind};
use crate::metrics::{Retry, method_label};
use crate::single_use::Policy as SingleUsePolicy;
use crate::state::{StateError, StatePayload};
use crate::telemetry::spans;
use crate::translate;
use mrtr_wire::capabilities::Declared;
use mrtr_wire::protocol::methods::{Route, route};

pub use super::run::{Call, Sink};

/// Opens and checks a presented `requestState`.
fn open_prior(
    engine: &Engine,
    call: &Call,
    origin: &origin::Lazy,
    now: u64,
) -> Result<Option<StatePayload>, Rejection> {
    let Some(raw) = call.params.get("requestState") else {
        return Ok(None);
    };
    let result = match raw {
        Value::String(token) => engine.codec.open(token, now).and_then(|(payload, _kid)| {
            if payload.org != origin.of(&call.method, &call.params) {
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
            engine.metrics.state_opened();
            Ok(Some(p))
        }
        Err(e) => {
            engine.metrics.state_refused(e.reason());
            tracing::warn!(reason = e.reason(), method = %call.method, "refused a requestState");
            Err(Rejection::bad_state(e.kind()))
        }
    }
}

fn input_responses(params: &Value) -> Result<Map<String, Value>, Rejection> {
    match params.get("inputResponses") {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(m)) => Ok(m.clone()),
        Some(_) => Err(Rejection::new(
            RejectionKind::BadInputResponse,
            "inputResponses must be an object keyed like inputRequests",
        )),
    }
}

fn park_only_lost(call: &Call) -> Rejection {
    Rejection::new(
        RejectionKind::ParkOnlyLost,
        format!(
            "{} is park-only (it must not run twice), and its parked call is gone: it expired, \
             was evicted, or is held by another replica. Nothing was re-executed; start the call again.",
            call.describe()
        ),
    )
}

/// Serves `tools/call`, `prompts/get` or `resources/read`. `render` is how the front answers an
/// error: a claimed retry keeps its outcome in that form for its duplicates.
pub async fn serve_mrtr(
    engine: &Arc<Engine>,
    call: &Arc<Call>,
    sink: &Sink,
    cancel: &CancellationToken,
    render: Render,
) -> Result<Value, Rejection> {
    let now = engine.clock.now_secs();
    let cfg = engine.config();
    let origin = origin::Lazy::default();
    let prior = open_prior(engine, call, &origin, now)?;
    if let Some(p) = prior.as_ref().filter(|p| p.run) {
        // A state-only round's state: the call runs (or ran) already; collect its outcome.
        let token = call
            .params
            .get("requestState")
            .and_then(Value::as_str)
            .unwrap_or_default();
        spans::record_round(p.rnd + 1, "following");
        return Box::pin(long_call::follow(engine, call, p, token, sink, cancel)).await;
    }
    let responses = input_responses(&call.params)?;
    let book = AnswerBook::new(prior.as_ref(), &responses)?;
    let is_retry = prior.is_some() || !responses.is_empty();

    // At most once per state: claim its id before anything can run. A duplicate gets the
    // first presentation's outcome, or is told to wait, or that the state is spent.
    let claim = match &prior {
        Some(p)
            if cfg.single_use.policy_for(&call.method, call.target())
                == SingleUsePolicy::Always =>
        {
            // Boxed: only a retry presenting a state claims, and every other call's future
            // (held by the request's) would otherwise be as large as the claim's.
            match Box::pin(at_most_once::claim(engine, &call.caller, p, now)).await? {
                Claimed::Owned(guard) => Some(guard),
                Claimed::Duplicate(outcome) => return outcome,
            }
        }
        _ => None,
    };
    let presented = Presented {
        prior,
        book,
        is_retry,
        origin,
        now,
    };
    let owed = Owed { claim, render };
    if let Some(after) = cfg.long_calls.round_after_for(&call.method, call.target()) {
        let serving = Serving {
            engine,
            call,
            sink,
            cancel,
        };
        // Inline: what waits here is small (the call's own future is boxed within).
        return long_call::serve(engine, call, &serving, owed, presented, after).await;
    }
    // A claimed retry outlives its client (see `at_most_once`): the client going away neither
    // cancels it nor fails it for a notification that cannot be delivered.
    let outliving = owed
        .claim
        .as_ref()
        .map(|guard| (guard.run_cancel(), sink.outliving_client()));
    let (run_cancel, run_sink) = match &outliving {
        Some((token, sink)) => (token, sink),
        None => (cancel, sink),
    };
    let serving = Serving {
        engine,
        call,
        sink: run_sink,
        cancel: run_cancel,
    };
    // Boxed: the call's state machine is large (several KB), and every future holding it
    // inline is that large too, and is copied as it is spawned and moved. The block owns what
    // the call is presented and owes, once: the run borrows them.
    let (mut presented, mut owed) = (presented, owed);
    Box::pin(async move { execute_and_settle(&serving, cancel, &mut presented, &mut owed).await })
        .await
}

/// What a presentation owes when its call ends: the claim it holds (if any) settled with the
/// outcome, an error kept as `render` answers it.
pub(super) struct Owed {
    pub(super) claim: Option<Guard>,
    pub(super) render: Render,
}

/// Runs the call ([`execute`]) and settles what the presentation owes; `client` tells whether
/// its client went away.
///
/// `presented` and `owed` are borrowed, not taken: the future that awaits this one owns them,
/// so its state holds them once (an `async fn` keeps what it takes by value for its whole
/// life, beside whatever it passes them on to).
pub(super) async fn execute_and_settle(
    s: &Serving<'_>,
    client: &CancellationToken,
    presented: &mut Presented,
    owed: &mut Owed,
) -> Result<Value, Rejection> {
    let mut may_have_run = false;
    // The legacy call's client span, under the request's server span.
    let legacy = spans::legacy_call(
        method_label(&s.call.method),
        s.call.target(),
        s.engine.config().upstream.transport.as_str(),
    );
    let outcome = execute(s, presented, &mut may_have_run).await;
    spans::end_legacy(&legacy, outcome.as_ref().err());
    drop(legacy);
    if let Some(guard) = owed.claim.take() {
        guard
            .settle(&outcome, owed.render, may_have_run, client.is_cancelled())
            .await;
    }
    outcome
}

/// What the presented request brought besides its params: the state it carried (opened and
/// checked), the answers it may use, and what binds a new state to it.
pub(super) struct Presented {
    pub(super) prior: Option<StatePayload>,
    pub(super) book: AnswerBook,
    /// A state or answers came with it (a resource read is then not cacheable).
    pub(super) is_retry: bool,
    /// What binds a state to this request (made when a state is opened or sealed).
    pub(super) origin: origin::Lazy,
    pub(super) now: u64,
}

/// The request in flight: the call, where its notifications go, and what cancels it.
pub(super) struct Serving<'a> {
    pub(super) engine: &'a Engine,
    pub(super) call: &'a Call,
    pub(super) sink: &'a Sink,
    pub(super) cancel: &'a CancellationToken,
}

/// Where a call resumed or (re)started.
enum Begun<'e> {
    /// The legacy call is running; the questions a resumed call is still blocked on.
    Running(Box<Run<'e>>, Vec<Question>),
    /// Before the call could go out, a reused session's server asked for this client's roots:
    /// that is the whole round.
    Asked(Question, Value),
}

/// What the capture left to answer: the questions, and whether a legacy call is still blocked
/// on them (a -32042 error ended the call; there is nothing to park).
struct Open {
    questions: Vec<Question>,
    parkable: bool,
}

/// Runs (or resumes) the call and turns what the legacy server did into the modern result,
/// in the order it happens: resume or start, answer what a resumed call waits on, capture,
/// conclude (a final result, or questions), then park or cancel the blocked call and seal the
/// round's state. `may_have_run` tells the single-use claim whether the tool may have run.
async fn execute(
    s: &Serving<'_>,
    presented: &mut Presented,
    may_have_run: &mut bool,
) -> Result<Value, Rejection> {
    let (engine, call) = (s.engine, s.call);
    let started = Instant::now();
    let cfg = engine.config();
    let declared = Declared::from_modern(&call.meta.client_capabilities);
    let policy = cfg.parking.policy_for(&call.method, call.target());

    let (resumed, minter) = take_parked(s, presented.prior.as_ref(), policy).await?;
    let round = presented.prior.as_ref().map_or(0, |p| p.rnd) + 1;
    let path = match (&resumed, &presented.prior) {
        (Some(_), _) => "resumed",
        (None, Some(_)) => "replayed",
        (None, None) => "fresh",
    };
    spans::record_round(round, path);
    let mut mode = Mode::Mrtr {
        book: &mut presented.book,
        declared: &declared,
        minter,
        prior_shapes: prior_shapes(presented.prior.as_ref()),
        round,
    };
    let begun = match resumed {
        Some(running) => running,
        None => match Run::start(engine, call, &declared, &mut mode).await {
            Ok(Start::Sent(run)) => Begun::Running(run, Vec::new()),
            Ok(Start::Asked {
                question,
                server_info,
            }) => Begun::Asked(question, server_info),
            Err(e) => {
                *may_have_run = e.call_sent;
                return Err(e.rejection);
            }
        },
    };
    let (mut run, waiting) = match begun {
        Begun::Running(run, waiting) => (*run, waiting),
        Begun::Asked(question, server_info) => {
            // Nothing ran, nothing is parked.
            drop(mode);
            let round = Round {
                asked: asked(std::slice::from_ref(&question)),
                parked: None,
            };
            return Box::pin(seal_round(s, presented, round, &server_info)).await;
        }
    };
    *may_have_run = true;
    let Mode::Mrtr { book: answers, .. } = &mut mode else {
        unreachable!("the mode stays MRTR")
    };
    let waiting = match run.answer_waiting(waiting, answers).await {
        Ok(w) => w,
        Err(rej) => {
            run.abandon(rej.reason()).await;
            return Err(rej);
        }
    };
    let captured = run
        .capture(
            call,
            &mut mode,
            s.sink,
            s.cancel,
            started + cfg.upstream.call_timeout,
            waiting,
        )
        .await;
    let Mode::Mrtr { mut minter, .. } = mode else {
        unreachable!("the mode stays MRTR")
    };
    // The session's own `InitializeResult`, shared: the run is finished, abandoned or parked
    // below while the server info is still in use.
    let init = run.init_shared();
    let server_info = translate::server_info(Some(&init));
    engine
        .metrics
        .upstream_time(&call.method, started.elapsed());
    let open = match conclude(s, captured, &mut minter, &declared, presented, server_info) {
        Concluded::Final(outcome) => {
            run.finish().await;
            return outcome;
        }
        Concluded::Open(open) => open,
        Concluded::Failed { rejection, clean } => {
            if clean {
                run.finish().await;
            } else {
                run.abandon(rejection.reason()).await;
            }
            return Err(rejection);
        }
    };

    let round_no = presented.prior.as_ref().map_or(0, |p| p.rnd) + 1;
    if round_no > cfg.state.max_rounds {
        run.abandon("max_rounds").await;
        return Err(max_rounds(engine, call, cfg.state.max_rounds));
    }
    let asked = asked(&open.questions);
    // Boxed: only a round that asks gets here, and the call's future, made and moved on every
    // call, would otherwise be as large as this step.
    let parked = Box::pin(park_or_cancel(s, run, open, minter, policy)).await?;
    spans::record_parked(parked.is_some());
    // Boxed, as `park_or_cancel`: only a round that asks seals a state.
    Box::pin(seal_round(
        s,
        presented,
        Round { asked, parked },
        server_info,
    ))
    .await
}

/// Takes back the call parked on this replica for this state, if it is here. A park-only call
/// whose parked call is gone must not run again.
async fn take_parked<'e>(
    s: &Serving<'e>,
    prior: Option<&StatePayload>,
    policy: ParkPolicy,
) -> Result<(Option<Begun<'e>>, KeyMinter), Rejection> {
    let engine = s.engine;
    let park_ref = prior.and_then(|p| p.park.as_ref());
    let resumed = match park_ref {
        Some(r) if r.instance == engine.instance_id => {
            Box::pin(engine.parking.take(&r.handle, &s.call.principal)).await
        }
        _ => None,
    };
    match resumed {
        Some(r) => {
            engine.metrics.retried(Retry::Parked);
            let (run, waiting, minter) = Run::resumed(engine, r);
            Ok((Some(Begun::Running(Box::new(run), waiting)), minter))
        }
        None => {
            if park_ref.is_some() && policy == ParkPolicy::ParkOnly {
                return Err(park_only_lost(s.call));
            }
            if prior.is_some() {
                engine.metrics.retried(Retry::Replayed);
            }
            Ok((None, KeyMinter::new()))
        }
    }
}

/// Shapes of the questions the previous round asked, by shape → key.
fn prior_shapes(prior: Option<&StatePayload>) -> HashMap<String, String> {
    prior
        .map(|p| {
            p.pnd
                .iter()
                .filter_map(|(k, v)| v.shape.clone().map(|s| (s, k.clone())))
                .collect()
        })
        .unwrap_or_default()
}

enum Concluded {
    /// The call ended: its result, or the legacy server's error (the session is clean).
    Final(Result<Value, Rejection>),
    Open(Open),
    /// The round cannot go on; `clean` when the legacy call had ended (the session can be
    /// given back), otherwise it is abandoned.
    Failed {
        rejection: Rejection,
        clean: bool,
    },
}

/// What the capture ended with: a final result, the questions of a -32042 URL step, or the
/// questions the legacy call is blocked on.
fn conclude(
    s: &Serving<'_>,
    captured: Result<Captured, Rejection>,
    minter: &mut KeyMinter,
    declared: &Declared,
    presented: &Presented,
    server_info: &Value,
) -> Concluded {
    let (engine, call) = (s.engine, s.call);
    let cfg = engine.config();
    match captured {
        Err(rejection) => Concluded::Failed {
            rejection,
            clean: false,
        },
        Ok(Captured::Final(msg)) if url_required::url_elicitations(&msg).is_some() => {
            let list = url_required::url_elicitations(&msg).unwrap_or_default();
            let stage = crate::policy::Stage {
                policy: &cfg.policy,
                metrics: engine.metrics.policy(),
            };
            match url_required::questions(call, list, minter, declared, &presented.book, &stage) {
                Ok(questions) => Concluded::Open(Open {
                    questions,
                    parkable: false,
                }),
                Err(rejection) => Concluded::Failed {
                    rejection,
                    clean: true,
                },
            }
        }
        Ok(Captured::Final(msg)) => {
            let hint = (call.method == "resources/read").then(|| {
                if presented.is_retry {
                    translate::NO_CACHE
                } else {
                    caller_hint(engine, cfg.caching.read)
                }
            });
            Concluded::Final(final_result(engine, msg, call, server_info, hint))
        }
        Ok(Captured::NeedInput(questions)) => Concluded::Open(Open {
            questions,
            parkable: true,
        }),
    }
}

/// Parks the blocked call when the policy and the lot allow, otherwise cancels it (a call
/// that already ended goes back to the pool). Returns the parking handle.
async fn park_or_cancel(
    s: &Serving<'_>,
    run: Run<'_>,
    open: Open,
    minter: KeyMinter,
    policy: ParkPolicy,
) -> Result<Option<String>, Rejection> {
    let (engine, call) = (s.engine, s.call);
    let cfg = engine.config();
    let Open {
        questions,
        parkable,
    } = open;
    let mut run = run;
    let parked = if !parkable {
        // The call already ended (-32042): its session is clean and reusable.
        run.finish().await;
        None
    } else if policy != ParkPolicy::Replay && cfg.parking.max_calls > 0 {
        let (parked_call, reader) = run.into_parked(questions, minter, call.describe());
        let limits = ParkLimits {
            ttl: cfg.parking.ttl,
            share: cfg.parking.call_share,
            max_buffered_bytes: cfg.parking.max_buffered_bytes,
            max_stdio: cfg
                .upstream
                .stdio
                .max_children
                .saturating_sub(cfg.parking.stdio_reserved_children),
        };
        match engine
            .parking
            .park(parked_call, reader, &call.principal, &call.caller, &limits)
        {
            Ok(handle) => Some(handle),
            Err(refused) => {
                let Refused {
                    call: parked_call,
                    reason,
                    ..
                } = *refused;
                engine.limits.hit(reason.limit());
                let _ = parked_call
                    .session
                    .cancel(parked_call.call_id, "not parked")
                    .await;
                parked_call.session.close().await;
                if policy == ParkPolicy::ParkOnly {
                    return Err(reason.park_only_rejection(&call.describe()));
                }
                None
            }
        }
    } else {
        run.abandon("the client must answer questions first").await;
        None
    };
    Ok(parked)
}

/// Serves a method that is forwarded as is (lists, completion).
pub async fn serve_forward(
    engine: &Engine,
    call: &Call,
    sink: &Sink,
    cancel: &CancellationToken,
) -> Result<Value, Rejection> {
    let started = Instant::now();
    let cfg = engine.config();
    // A session declaring what this request declares, so the server shows this client what
    // it shows a legacy client declaring the same (servers register tools per capability);
    // any server request during a list is still refused (Forward mode).
    let declared = Declared::from_modern(&call.meta.client_capabilities);
    let legacy = spans::legacy_call(
        method_label(&call.method),
        None,
        cfg.upstream.transport.as_str(),
    );
    let outcome = forward(engine, call, &declared, sink, cancel, started).await;
    spans::end_legacy(&legacy, outcome.as_ref().err());
    outcome
}

/// [`serve_forward`]'s exchange with the legacy server.
async fn forward(
    engine: &Engine,
    call: &Call,
    declared: &Declared,
    sink: &Sink,
    cancel: &CancellationToken,
    started: Instant,
) -> Result<Value, Rejection> {
    let cfg = engine.config();
    let mut run = match Run::start(engine, call, declared, &mut Mode::Forward).await {
        Ok(Start::Sent(run)) => *run,
        Ok(Start::Asked { .. }) => unreachable!("forward mode refreshes no roots"),
        Err(e) => return Err(e.rejection),
    };
    let captured = run
        .capture(
            call,
            &mut Mode::Forward,
            sink,
            cancel,
            started + cfg.upstream.call_timeout,
            Vec::new(),
        )
        .await;
    // The session's own `InitializeResult`, shared: the run is finished, abandoned or parked
    // below while the server info is still in use.
    let init = run.init_shared();
    let server_info = translate::server_info(Some(&init));
    engine
        .metrics
        .upstream_time(&call.method, started.elapsed());
    match captured {
        Ok(Captured::Final(msg)) => {
            run.finish().await;
            let hint = mrtr_wire::protocol::methods::is_cacheable(&call.method)
                .then(|| caller_hint(engine, cfg.caching.list));
            final_result(engine, msg, call, server_info, hint)
        }
        Ok(Captured::NeedInput(_)) => unreachable!("forward mode collects no questions"),
        Err(rej) => {
            run.abandon(rej.reason()).await;
            Err(rej)
        }
    }
}

/// `hint`, made private when what the legacy server answers depends on the caller (see
/// [`crate::auth::Authenticator::answers_depend_on_caller`]): a shared cache must not hand one
/// caller's answer to another.
pub fn caller_hint(engine: &Engine, hint: CacheHint) -> CacheHint {
    translate::scoped_hint(hint, engine.auth().answers_depend_on_caller())
}

fn final_result(
    engine: &Engine,
    msg: Value,
    call: &Call,
    server_info: &Value,
    hint: Option<crate::config::CacheHint>,
) -> Result<Value, Rejection> {
    let mut msg = match msg {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    // Taken out of the response, not copied: a result can be large.
    if let Some(result) = msg.remove("result") {
        let (result, dropped) = translate::from_legacy(result, server_info, hint);
        if !dropped.is_empty() {
            for field in &dropped {
                engine.metrics.policy().field_dropped(field);
            }
            tracing::warn!(
                call = %call.describe(),
                fields = ?dropped,
                "dropped members of a legacy result that only the gateway may set"
            );
        }
        return Ok(result);
    }
    let mut err = msg.remove("error").unwrap_or_else(|| json!({}));
    drop_unsafe_error_data(engine, call, &mut err);
    Err(translate::legacy_error(
        &err,
        &call.params,
        RejectionKind::LegacyError,
    ))
}

/// A legacy error's `data` reaches the client as it is: when it carries a URL the policy
/// refuses (`policy.url.review_text`), it is dropped (the code and message still go through).
fn drop_unsafe_error_data(engine: &Engine, call: &Call, err: &mut Value) {
    let cfg = engine.config();
    let Some(refused) = crate::policy::text_urls::drop_unsafe_error_data(err, &cfg.policy.url)
    else {
        return;
    };
    engine.metrics.policy().error_data_refused();
    tracing::warn!(
        call = %call.describe(),
        reason = refused.refusal.reason(),
        url_host = refused.origin.as_ref().map_or("", |o| o.host.as_str()),
        "dropped a legacy error's data: it carries a URL the policy refuses"
    );
}

/// Dispatches a routed method to its server (`render`: see [`serve_mrtr`]).
pub async fn serve(
    engine: &Arc<Engine>,
    call: &Arc<Call>,
    sink: &Sink,
    cancel: &CancellationToken,
    render: Render,
) -> Result<Value, Rejection> {
    match route(&call.method) {
        Route::Mrtr => serve_mrtr(engine, call, sink, cancel, render).await,
        Route::Forward => Box::pin(serve_forward(engine, call, sink, cancel)).await,
        _ => Err(Rejection::method_not_found(&call.method)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::future_size;

    #[test]
    fn a_calls_execution_holds_what_it_is_presented_once() {
        // Every call's execution is boxed, and its size is copied into the box. Taking the
        // presentation by value, `execute_and_settle` kept it beside `execute`'s future, which
        // kept it again: 5,656 bytes (release build) around a 4,248-byte `execute` (whose
        // presentation is 336 bytes).
        let settle = future_size::returned4(execute_and_settle);
        let execute = future_size::returned3(execute);
        let presented = std::mem::size_of::<Presented>();
        assert!(
            settle < execute + presented,
            "a call's execution is {settle} bytes around a {execute}-byte run ({presented}-byte presentation)"
        );
    }
}
