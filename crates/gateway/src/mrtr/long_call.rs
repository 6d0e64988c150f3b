//! Calls that outlive every front timeout: state-only rounds.
//!
//! A legacy tool that runs for minutes is a blocking call behind the gateway, and every hop in
//! front of it (ingress, mesh, client library) has a timeout of its own. So a call whose legacy
//! response has not come within `long_calls.round_after` ends its HTTP request with an
//! `input_required` result that asks nothing: a `requestState` and no `inputRequests`. The
//! client retries at once with that state; the call goes on meanwhile.
//!
//! - **Detach** (`serve`): the call runs in a task of its own from the start. When
//!   `round_after` passes without an outcome, a fresh claim id is claimed *and started* in the
//!   single-use store for the running call, the request ends with a state naming that id
//!   (`run` set), and the task records the call's outcome under the id when it ends (the final
//!   result, an error, or the next round of questions with its own state). If the store
//!   refuses the claim, the request simply keeps waiting: correctness never depends on it.
//! - **Follow** (`follow`): a retry presenting such a state never runs anything. It waits up
//!   to `round_after` for the outcome under the id (in the store, so any replica sharing a Redis
//!   store can answer it; on the replica running the call it is woken at once and its
//!   notifications, progress among them, go to this retry's response while it waits), and then
//!   returns the outcome, or the same state again. The state's id is a claim the running call
//!   owns, so presenting the state again and again is safe: the tool body runs once.
//! - **Lifetime.** The state lives at least `state.ttl`, and a minute beyond the latest end of
//!   the call (`upstream.call_timeout`), so its outcome can be collected after the call ends.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dashmap::DashMap;
use serde_json::{Map, Value};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::at_most_once::{self, Render};
use super::call::{Listener, Sink};
use super::deps::Engine;
use super::engine::{self, Owed, Presented, Serving};
use super::run::Call;
use crate::caller_scope::Caller;
use crate::config::LongCallsConfig;
use crate::error::{Rejection, RejectionKind};
use crate::metrics::{Limit, StateOnly};
use crate::request_id::RequestId;
use crate::single_use::{self, Claim};
use crate::state::StatePayload;
use crate::translate;

/// How long a collected outcome stays collectable after the latest end of its call.
const COLLECT_GRACE: Duration = Duration::from_secs(60);
/// First and longest pause between two looks at the store while following a call that runs on
/// another replica.
const POLL_FIRST: Duration = Duration::from_millis(25);
const POLL_MAX: Duration = Duration::from_millis(500);

/// This replica's calls that ended their request with a state-only round and still run, by
/// claim id: a retry that reaches this replica is woken the moment its call ends, and takes
/// its notifications while it waits.
///
/// Detached calls hold no request slot, so they are bounded here instead
/// (`long_calls.max_running`, and `max_running_per_principal` for one caller's share): past
/// either, a long call is not detached and keeps its request (and its slot) as before.
#[derive(Default)]
pub struct RunningCalls {
    calls: DashMap<String, Arc<Running>>,
    counts: Mutex<Counts>,
}

#[derive(Default)]
struct Counts {
    total: usize,
    per_caller: HashMap<Caller, usize>,
}

struct Running {
    listener: Listener,
    /// Becomes true once the outcome is recorded.
    done: watch::Sender<bool>,
}

impl RunningCalls {
    /// How many detached calls run on this replica now.
    pub fn len(&self) -> usize {
        self.counts().total
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts one more detached call for `caller`, or names the limit it would pass.
    fn reserve(&self, caller: &Caller, cfg: &LongCallsConfig) -> Result<(), Limit> {
        let mut c = self.counts();
        if c.total >= cfg.max_running {
            return Err(Limit::LongCallsMaxRunning);
        }
        let mine = c.per_caller.get(caller).copied().unwrap_or(0);
        if mine >= cfg.max_running_per_principal {
            return Err(Limit::LongCallsPerPrincipal);
        }
        c.total += 1;
        c.per_caller.insert(caller.clone(), mine + 1);
        Ok(())
    }

    fn release(&self, caller: &Caller) {
        let mut c = self.counts();
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.per_caller.get_mut(caller) {
            *n -= 1;
            if *n == 0 {
                c.per_caller.remove(caller);
            }
        }
    }
}

/// Serves a call that may end its request with a state-only round after `after`: everything
/// [`engine::serve_mrtr`] does past the claim, in a task that outlives the request. `s` is the
/// request (its engine is `engine`, its call `shared`).
///
/// Not an `async fn`: what the call is presented and owes moves into the call's own future
/// here, before anything waits, so the future returned holds neither (an `async fn` would keep
/// both, beside the call's future that took them).
pub(super) fn serve<'a>(
    engine: &'a Arc<Engine>,
    shared: &Arc<Call>,
    s: &'a Serving<'a>,
    owed: Owed,
    presented: Presented,
    after: Duration,
) -> impl Future<Output = Result<Value, Rejection>> + Send + 'a {
    let (call, sink, cancel) = (s.call, s.sink, s.cancel);
    let listener = Listener::default();
    listener.follow(sink.sender(), call.meta.progress_token.clone());
    // A claimed retry outlives its client already (`at_most_once`): only a drain giving it up
    // cancels it. A first round is cancelled with its client until it is detached, and after
    // that by a drain giving up the claim it is detached under.
    let run_cancel = owed
        .claim
        .as_ref()
        .map_or_else(CancellationToken::new, |g| g.run_cancel());
    let detachable = Detachable {
        render: owed.render,
        claimed: owed.claim.is_some(),
        rnd: presented.prior.as_ref().map_or(0, |p| p.rnd),
        listener: listener.clone(),
        run_cancel: run_cancel.clone(),
    };
    // The call is polled in the request's own task until `round_after` passes; only a call
    // still running then moves into a task of its own (most calls end first, and cross no
    // extra task). One box: the call's future, and what it is presented and owes, once.
    let work = {
        let (engine, call, client, sink) = (
            engine.clone(),
            // The call itself is shared, not copied: its params can be large.
            Arc::clone(shared),
            cancel.clone(),
            Sink::moving(listener),
        );
        let (mut presented, mut owed) = (presented, owed);
        Box::pin(RequestId::carry(
            async move {
                let serving = Serving {
                    engine: &engine,
                    call: &call,
                    sink: &sink,
                    cancel: &run_cancel,
                };
                engine::execute_and_settle(&serving, &client, &mut presented, &mut owed).await
            }
            .instrument(tracing::Span::current()),
        ))
    };
    wait_or_detach(engine, call, cancel, work, detachable, after)
}

/// The call's future, running in the request's task until it ends or is detached.
type Work = Pin<Box<dyn Future<Output = Result<Value, Rejection>> + Send>>;

/// What detaching a call needs besides the call's future.
struct Detachable {
    render: Render,
    /// The presentation holds a claim: its call outlives its client already.
    claimed: bool,
    /// The round the presented state was in (0 for a first presentation).
    rnd: u32,
    listener: Listener,
    run_cancel: CancellationToken,
}

/// Polls `work` until it ends, or until `after` passes and the call is detached.
async fn wait_or_detach(
    engine: &Arc<Engine>,
    call: &Call,
    cancel: &CancellationToken,
    mut work: Work,
    d: Detachable,
    after: Duration,
) -> Result<Value, Rejection> {
    let mut cancel_follows = !d.claimed;
    let timer = tokio::time::sleep(after);
    tokio::pin!(timer);
    loop {
        tokio::select! {
            outcome = &mut work => return outcome,
            () = cancel.cancelled(), if cancel_follows => {
                d.run_cancel.cancel();
                cancel_follows = false;
            }
            () = &mut timer => break,
        }
    }
    if cancel.is_cancelled() && !d.claimed {
        // The client went away before the call was detached: it ends with it.
        d.run_cancel.cancel();
        return work.await;
    }
    // Boxed: only a call still running after `round_after` gets here, and this step (a claim
    // in the store, a sealed state) would otherwise make every long-call-enabled request's
    // future as large as itself.
    Box::pin(detach(engine, call, work, d, after)).await
}

/// Moves a call still running after `after` into a task of its own, claims an id for its
/// outcome, and ends the request with a state-only round naming it; or, past a limit or if the
/// claim fails, keeps the request waiting.
async fn detach(
    engine: &Arc<Engine>,
    call: &Call,
    work: Work,
    d: Detachable,
    after: Duration,
) -> Result<Value, Rejection> {
    let Detachable {
        render,
        rnd,
        listener,
        run_cancel,
        ..
    } = d;
    let mut task = tokio::spawn(work);
    let now = engine.clock.now_secs();
    let cfg = engine.config();
    let latest_end = cfg.upstream.call_timeout.saturating_sub(after) + COLLECT_GRACE;
    let exp = now + cfg.state.ttl.max(latest_end).as_secs().max(1);
    let id = crate::state::payload::random_id();
    // Digested here, only for a call that is detached (the presentation's lazy digest went
    // with the work).
    let origin = super::origin::digest(&call.method, &call.params);
    let mut payload = engine.codec.fresh_payload(&call.principal, &origin, now);
    payload.id = id.clone();
    payload.exp = exp;
    payload.rnd = rnd;
    payload.run = true;
    // Detached calls hold no request slot: they are bounded here. Past a limit the request
    // keeps waiting, holding its slot, as before state-only rounds.
    if let Err(limit) = engine.running.reserve(&call.caller, &cfg.long_calls) {
        engine.limits.hit(limit);
        return kept_waiting(engine, call, limit.label(), task).await;
    }
    // Sealed before the claim: a state that cannot be sealed (a `state.max_bytes` below the
    // size of an empty state) must not leave a claim behind.
    let claimed_run = match engine.codec.seal(&payload) {
        Ok(sealed) => at_most_once::claim_running(engine, &call.caller, &id, exp, now)
            .await
            .map(|guard| (guard, sealed))
            .map_err(|rej| rej.reason()),
        Err(_) => Err("state_too_large"),
    };
    let (guard, (token, kid)) = match claimed_run {
        Ok(both) => both,
        Err(reason) => {
            engine.running.release(&call.caller);
            return kept_waiting(engine, call, reason, task).await;
        }
    };

    let (done, _) = watch::channel(false);
    let running = Arc::new(Running {
        listener: listener.clone(),
        done,
    });
    engine.running.calls.insert(id.clone(), running.clone());
    // The request ends here: nothing more goes to its response.
    listener.follow(None, None);
    let settle = {
        let (engine, caller) = (engine.clone(), call.caller.clone());
        async move {
            let given_up = guard.run_cancel();
            let joined = tokio::select! {
                joined = &mut task => joined,
                () = given_up.cancelled() => {
                    // The drain gave the claim up (and recorded the outcome as lost): the call
                    // ends now.
                    run_cancel.cancel();
                    task.await
                }
            };
            let outcome = joined.unwrap_or_else(|_| Err(panicked()));
            guard.settle(&outcome, render, true, false).await;
            running.done.send_replace(true);
            engine.running.calls.remove(&id);
            engine.running.release(&caller);
        }
    };
    tokio::spawn(RequestId::carry(settle.in_current_span()));

    engine.metrics.state_sealed(&kid, token.len());
    engine.metrics.state_only(StateOnly::Detached);
    tracing::info!(
        call = %call.describe(),
        after_ms = after.as_millis() as u64,
        "a long call ended its request with a state-only round; it runs on"
    );
    Ok(state_only(token))
}

/// The call could not be detached (`reason`): its request waits for it, as without
/// state-only rounds.
async fn kept_waiting(
    engine: &Engine,
    call: &Call,
    reason: &str,
    task: tokio::task::JoinHandle<Result<Value, Rejection>>,
) -> Result<Value, Rejection> {
    engine.metrics.state_only(StateOnly::NotDetached);
    tracing::warn!(
        call = %call.describe(),
        reason,
        "a long call could not be detached; its request keeps waiting"
    );
    task.await.unwrap_or_else(|_| Err(panicked()))
}

/// Serves a retry presenting a state-only state (`prior.run`): waits up to `round_after` for the
/// outcome of the call it names, and returns it, or the same state again. Never runs anything.
pub(super) async fn follow(
    engine: &Engine,
    call: &Call,
    prior: &StatePayload,
    token: &str,
    sink: &Sink,
    cancel: &CancellationToken,
) -> Result<Value, Rejection> {
    let cfg = engine.config();
    let after = cfg
        .long_calls
        .round_after_for(&call.method, call.target())
        .unwrap_or(Duration::from_secs(20));
    let deadline = Instant::now() + after;
    let here = engine
        .running
        .calls
        .get(&prior.id)
        .map(|r| r.value().clone());
    let taken = here.as_ref().and_then(|r| {
        let tx = sink.sender()?;
        r.listener
            .follow(Some(tx.clone()), call.meta.progress_token.clone());
        Some(tx)
    });
    let outcome = watch_outcome(engine, &prior.id, here.as_ref(), deadline, cancel).await;
    if let (Some(r), Some(tx)) = (&here, taken) {
        give_back(&r.listener, &tx);
    }
    let step = match &outcome {
        Watched::Done(_) => StateOnly::Collected,
        Watched::Lost(_) => StateOnly::Lost,
        Watched::Running => StateOnly::StillRunning,
    };
    engine.metrics.state_only(step);
    match outcome {
        Watched::Done(result) => result,
        Watched::Lost(rejection) => Err(rejection),
        Watched::Running => Ok(state_only(token.to_owned())),
    }
}

/// Stops sending the call's notifications to `tx`, unless another retry took them meanwhile.
fn give_back(listener: &Listener, tx: &mpsc::Sender<Value>) {
    listener.stop_following(tx);
}

enum Watched {
    /// The kept outcome (the call's result or error).
    Done(Result<Value, Rejection>),
    /// Nothing to collect, ever: why.
    Lost(Rejection),
    /// Still running at the deadline (or the client went away).
    Running,
}

/// Looks for the outcome under `id` until it is there, it is known lost, `deadline` passes or
/// the client goes away.
async fn watch_outcome(
    engine: &Engine,
    id: &str,
    here: Option<&Arc<Running>>,
    deadline: Instant,
    cancel: &CancellationToken,
) -> Watched {
    let store = engine.single_use();
    let mut done = here.map(|r| r.done.subscribe());
    let mut pause = POLL_FIRST;
    loop {
        match store.peek(id).await {
            Ok(Some(Claim::Done(bytes))) => return Watched::Done(at_most_once::replay(&bytes)),
            Ok(Some(Claim::DoneNotKept)) => return Watched::Lost(single_use::already_used()),
            Ok(Some(Claim::Lost) | None) => return Watched::Lost(single_use::outcome_lost()),
            Ok(Some(_)) => {}
            // The store is unreachable: this retry cannot tell, so it is refused (the call
            // runs on; the same state can be presented again).
            Err(e) => return Watched::Done(Err(Rejection::from(e))),
        }
        if Instant::now() >= deadline {
            return Watched::Running;
        }
        let wake = (Instant::now() + pause).min(deadline);
        pause = (pause * 2).min(POLL_MAX);
        match &mut done {
            // On the replica running the call: woken when its outcome is recorded; the store
            // is still read now and then in case that replica's record went elsewhere.
            Some(rx) => tokio::select! {
                _ = rx.wait_for(|d| *d) => {}
                () = tokio::time::sleep_until(wake) => {}
                () = cancel.cancelled() => return Watched::Running,
            },
            None => tokio::select! {
                () = tokio::time::sleep_until(wake) => {}
                () = cancel.cancelled() => return Watched::Running,
            },
        }
        if done.as_ref().is_some_and(|rx| *rx.borrow()) {
            // Recorded: the next look finds it.
            done = None;
        }
    }
}

/// `input_required` with a state and no questions.
fn state_only(token: String) -> Value {
    translate::input_required(Map::new(), token, &Value::Null)
}

fn panicked() -> Rejection {
    Rejection::new(
        RejectionKind::InternalPanic,
        "the gateway failed while serving this request",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::future_size;

    #[test]
    fn a_long_call_keeps_only_its_wait_in_the_requests_future() {
        // Every call of a method with `round_after` waits here, inline in the request's
        // future. As an `async fn` taking what the call is presented and owes, `serve` kept
        // both beside the call's future that took them, and the detaching step inline: 3,104
        // bytes (release build) against 416 now.
        let serve = future_size::returned6(serve);
        let wait = future_size::returned6(wait_or_detach);
        assert!(
            serve <= wait + 16,
            "a long call's future is {serve} bytes around a {wait}-byte wait"
        );
        // Detaching (a claim in the store, a sealed state) is boxed: only a call still running
        // after `round_after` takes that step.
        let detach = future_size::returned5(detach);
        assert!(
            wait < detach,
            "a long call's wait is {wait} bytes; its detaching {detach}"
        );
    }
}
