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
use std::time::Instant;

use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::answers::AnswerBook;
use super::at_most_once::{self, Claimed, Render};
use super::deps::Engine;
use super::input_key::KeyMinter;
use super::origin;
use super::parking::{ParkLimits, Refused};
use super::run::{Captured, Mode, Question, Run, Start};
use super::state_size;
use super::url_required;
use crate::config::{CacheHint, ParkPolicy};
use crate::error::{Rejection, RejectionKind};
use crate::metrics::method_label;
use crate::single_use::Policy as SingleUsePolicy;
use crate::state::{ParkRef, Pending, StateError, StatePayload};
use crate::translate;
use mrtr_wire::capabilities::Declared;
use mrtr_wire::protocol::methods::{Route, route};

pub use super::run::{Call, Sink};

/// Opens and checks a presented `requestState`.
fn open_prior(
    engine: &Engine,
    call: &Call,
    origin: &str,
    now: u64,
) -> Result<Option<StatePayload>, Rejection> {
    let Some(raw) = call.params.get("requestState") else {
        return Ok(None);
    };
    let result = match raw {
        Value::String(token) => engine.codec.open(token, now).and_then(|(payload, _kid)| {
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
            engine.metrics.state_opens.with_label_values(&["ok"]).inc();
            Ok(Some(p))
        }
        Err(e) => {
            engine
                .metrics
                .state_opens
                .with_label_values(&[e.reason()])
                .inc();
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
    engine: &Engine,
    call: &Call,
    sink: &Sink,
    cancel: &CancellationToken,
    render: Render,
) -> Result<Value, Rejection> {
    let now = engine.clock.now_secs();
    let cfg = engine.config();
    let origin = origin::digest(&call.method, &call.params);
    let prior = open_prior(engine, call, &origin, now)?;
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
            match at_most_once::claim(engine, &call.caller, p, now).await? {
                Claimed::Owned(guard) => Some(guard),
                Claimed::Duplicate(outcome) => return outcome,
            }
        }
        _ => None,
    };
    // A claimed retry outlives its client (see `at_most_once`): the client going away neither
    // cancels it nor fails it for a notification that cannot be delivered.
    let outliving = claim
        .as_ref()
        .map(|_| (CancellationToken::new(), sink.outliving_client()));
    let (run_cancel, run_sink) = match &outliving {
        Some((token, sink)) => (token, sink),
        None => (cancel, sink),
    };
    let mut may_have_run = false;
    let outcome = execute(
        engine,
        call,
        run_sink,
        run_cancel,
        prior,
        book,
        is_retry,
        &origin,
        now,
        &mut may_have_run,
    )
    .await;
    if let Some(guard) = claim {
        guard
            .settle(&outcome, render, may_have_run, cancel.is_cancelled())
            .await;
    }
    outcome
}

/// Runs (or resumes) the call and turns what the legacy server did into the modern result.
#[allow(clippy::too_many_arguments)]
async fn execute(
    engine: &Engine,
    call: &Call,
    sink: &Sink,
    cancel: &CancellationToken,
    prior: Option<StatePayload>,
    mut book: AnswerBook,
    is_retry: bool,
    origin: &str,
    now: u64,
    may_have_run: &mut bool,
) -> Result<Value, Rejection> {
    let started = Instant::now();
    let cfg = engine.config();
    let declared = Declared::from_modern(&call.meta.client_capabilities);
    let policy = cfg.parking.policy_for(&call.method, call.target());

    // Resume the parked call if it is here, otherwise (re)start the tool.
    let park_ref = prior.as_ref().and_then(|p| p.park.as_ref());
    let resumed = match park_ref {
        Some(r) if r.instance == engine.instance_id => {
            engine.parking.take(&r.handle, &call.principal).await
        }
        _ => None,
    };
    let prior_shapes: HashMap<String, String> = prior
        .as_ref()
        .map(|p| {
            p.pnd
                .iter()
                .filter_map(|(k, v)| v.shape.clone().map(|s| (s, k.clone())))
                .collect()
        })
        .unwrap_or_default();
    let (resumed, waiting, minter) = match resumed {
        Some(r) => {
            engine.metrics.retries.with_label_values(&["parked"]).inc();
            let (run, waiting, minter) = Run::resumed(engine, r);
            (Some(run), waiting, minter)
        }
        None => {
            if park_ref.is_some() && policy == ParkPolicy::ParkOnly {
                return Err(park_only_lost(call));
            }
            if prior.is_some() {
                engine
                    .metrics
                    .retries
                    .with_label_values(&["replayed"])
                    .inc();
            }
            (None, Vec::new(), KeyMinter::new())
        }
    };
    let mut mode = Mode::Mrtr {
        book: &mut book,
        declared: &declared,
        minter,
        prior_shapes,
    };
    let mut run = match resumed {
        Some(run) => run,
        None => match Run::start(engine, call, &declared, &mut mode).await {
            Ok(Start::Sent(run)) => *run,
            Ok(Start::Asked {
                question,
                server_info,
            }) => {
                // The reused session's server wants this client's roots before the call can
                // go out: that is the whole round. Nothing ran, nothing is parked.
                drop(mode);
                let round = Round {
                    asked: asked(std::slice::from_ref(&question)),
                    parked: None,
                };
                return input_round(engine, call, prior.as_ref(), &book, origin, now, round)
                    .await
                    .map(|(requests, token)| {
                        translate::input_required(requests, token, &server_info)
                    });
            }
            Err(e) => {
                *may_have_run = e.call_sent;
                return Err(e.rejection);
            }
        },
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
            sink,
            cancel,
            started + cfg.upstream.call_timeout,
            waiting,
        )
        .await;
    let Mode::Mrtr { mut minter, .. } = mode else {
        unreachable!("the mode stays MRTR")
    };
    let server_info = translate::server_info(Some(run.init_result()));
    engine
        .metrics
        .upstream_duration
        .with_label_values(&[method_label(&call.method)])
        .observe(started.elapsed().as_secs_f64());
    // `parkable`: whether a legacy call is still blocked on the questions (a -32042 error
    // ended the call; there is nothing to park).
    let (questions, parkable) = match captured {
        Err(rej) => {
            run.abandon(rej.reason()).await;
            return Err(rej);
        }
        Ok(Captured::Final(msg)) if url_required::url_elicitations(&msg).is_some() => {
            let list = url_required::url_elicitations(&msg).unwrap_or_default();
            let stage = crate::policy::Stage {
                policy: &cfg.policy,
                metrics: &engine.metrics.policy,
            };
            match url_required::questions(call, list, &mut minter, &declared, &book, &stage) {
                Ok(q) => (q, false),
                Err(rej) => {
                    run.finish().await;
                    return Err(rej);
                }
            }
        }
        Ok(Captured::Final(msg)) => {
            run.finish().await;
            let hint = (call.method == "resources/read").then(|| {
                if is_retry {
                    translate::NO_CACHE
                } else {
                    caller_hint(engine, cfg.caching.read)
                }
            });
            return final_result(engine, msg, call, &server_info, hint);
        }
        Ok(Captured::NeedInput(questions)) => (questions, true),
    };

    let round_no = prior.as_ref().map_or(0, |p| p.rnd) + 1;
    if round_no > cfg.state.max_rounds {
        run.abandon("max_rounds").await;
        return Err(max_rounds(engine, call, cfg.state.max_rounds));
    }

    // Park the blocked call when the policy and the lot allow; otherwise cancel it.
    let asked = asked(&questions);
    let parked = if !parkable {
        // The call already ended (-32042): its session is clean and reusable.
        run.finish().await;
        None
    } else if policy != ParkPolicy::Replay && cfg.parking.max_calls > 0 {
        let (parked_call, inbound) = run.into_parked(questions, minter, call.describe());
        let limits = ParkLimits {
            ttl: cfg.parking.ttl,
            max_calls: cfg.parking.max_calls,
            max_per_principal: cfg.parking.max_per_principal,
            max_buffered_bytes: cfg.parking.max_buffered_bytes,
            max_stdio: cfg
                .upstream
                .stdio
                .max_children
                .saturating_sub(cfg.parking.stdio_reserved_children),
        };
        match engine
            .parking
            .park(parked_call, inbound, &call.principal, &call.caller, &limits)
        {
            Ok(handle) => Some(handle),
            Err(refused) => {
                let Refused {
                    call: parked_call,
                    reason,
                    ..
                } = *refused;
                engine
                    .metrics
                    .limit_hits
                    .with_label_values(&[reason.limit()])
                    .inc();
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
    let round = Round { asked, parked };
    let (requests, token) =
        input_round(engine, call, prior.as_ref(), &book, origin, now, round).await?;
    Ok(translate::input_required(requests, token, &server_info))
}

/// The questions of one `input_required` round, and where the blocked call waits, if it does.
struct Round {
    /// Key, what the state remembers of the question, and the `inputRequests` entry.
    asked: Vec<(String, Pending, Value)>,
    /// The parking handle of the blocked legacy call.
    parked: Option<String>,
}

fn asked(questions: &[Question]) -> Vec<(String, Pending, Value)> {
    questions
        .iter()
        .map(|q| {
            let pending = Pending {
                kind: q.kind,
                elicitation_id: q.elicitation_id.clone(),
                shape: Some(q.shape.clone()),
            };
            (q.key.clone(), pending, q.request.clone())
        })
        .collect()
}

fn max_rounds(engine: &Engine, call: &Call, limit: u32) -> Rejection {
    engine
        .metrics
        .max_rounds_exceeded
        .with_label_values(&[method_label(&call.method)])
        .inc();
    Rejection::new(
        RejectionKind::MaxRounds,
        format!(
            "{} asked for input in more than {limit} rounds (state.max_rounds); the legacy server does not converge, often because its questions change on every execution",
            call.describe(),
        ),
    )
}

/// Seals the round's state and builds its `inputRequests`; returns them with the token.
async fn input_round(
    engine: &Engine,
    call: &Call,
    prior: Option<&StatePayload>,
    book: &AnswerBook,
    origin: &str,
    now: u64,
    round: Round,
) -> Result<(Map<String, Value>, String), Rejection> {
    let cfg = engine.config();
    let round_no = prior.map_or(0, |p| p.rnd) + 1;
    if round_no > cfg.state.max_rounds {
        return Err(max_rounds(engine, call, cfg.state.max_rounds));
    }
    let mut payload = engine.codec.fresh_payload(&call.principal, origin, now);
    payload.rnd = round_no;
    payload.ans = book.carry();
    let mut input_requests = Map::new();
    for (key, pending, request) in round.asked {
        payload.pnd.insert(key.clone(), pending);
        input_requests.insert(key, request);
    }
    payload.park = round.parked.clone().map(|handle| ParkRef {
        instance: engine.instance_id.clone(),
        handle,
    });

    let (token, kid) = match engine.codec.seal(&payload) {
        Ok(t) => t,
        Err(e) => {
            if let Some(handle) = round.parked
                && let Some(r) = engine.parking.take(&handle, &call.principal).await
            {
                let _ = r
                    .call
                    .session
                    .cancel(r.call.call_id, "state too large")
                    .await;
                r.call.session.close().await;
            }
            engine
                .metrics
                .limit_hits
                .with_label_values(&["state_max_bytes"])
                .inc();
            return Err(state_size::rejection(
                &engine.codec,
                &call.describe(),
                &payload,
                e,
            ));
        }
    };
    engine.metrics.state_seals.with_label_values(&[&kid]).inc();
    engine.metrics.state_bytes.observe(token.len() as f64);
    engine
        .metrics
        .input_required
        .with_label_values(&[method_label(&call.method)])
        .inc();
    Ok((input_requests, token))
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
    let mut run = match Run::start(engine, call, &declared, &mut Mode::Forward).await {
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
    let server_info = translate::server_info(Some(run.init_result()));
    engine
        .metrics
        .upstream_duration
        .with_label_values(&[method_label(&call.method)])
        .observe(started.elapsed().as_secs_f64());
    match captured {
        Ok(Captured::Final(msg)) => {
            run.finish().await;
            let hint = mrtr_wire::protocol::methods::is_cacheable(&call.method)
                .then(|| caller_hint(engine, cfg.caching.list));
            final_result(engine, msg, call, &server_info, hint)
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
    if let Some(result) = msg.get("result") {
        let (result, dropped) = translate::from_legacy(result.clone(), server_info, hint);
        if !dropped.is_empty() {
            for field in &dropped {
                engine
                    .metrics
                    .policy
                    .result_fields_dropped
                    .with_label_values(&[field])
                    .inc();
            }
            tracing::warn!(
                call = %call.describe(),
                fields = ?dropped,
                "dropped members of a legacy result that only the gateway may set"
            );
        }
        return Ok(result);
    }
    let err = msg.get("error").cloned().unwrap_or_else(|| json!({}));
    Err(translate::legacy_error(
        &err,
        &call.params,
        RejectionKind::LegacyError,
    ))
}

/// Dispatches a routed method to its server (`render`: see [`serve_mrtr`]).
pub async fn serve(
    engine: &Engine,
    call: &Call,
    sink: &Sink,
    cancel: &CancellationToken,
    render: Render,
) -> Result<Value, Rejection> {
    match route(&call.method) {
        Route::Mrtr => serve_mrtr(engine, call, sink, cancel, render).await,
        Route::Forward => serve_forward(engine, call, sink, cancel).await,
        _ => Err(Rejection::method_not_found(&call.method)),
    }
}
