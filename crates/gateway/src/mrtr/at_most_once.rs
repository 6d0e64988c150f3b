//! At most once per `requestState`: the claim before a retry runs anything, and the outcome
//! recorded after it, for every duplicate presentation of the same state.
//!
//! The store's protocol (claim → start → complete, with leases) is in [`crate::single_use`];
//! this module is the engine's side of it:
//!
//! - **How long a claim lives.** A replica accepts a state while its clock reads at most
//!   `exp + clock_skew` (whole seconds, so until `exp + clock_skew + 1`), and its clock may be
//!   up to `clock_skew` behind this replica's. The claim therefore lives until
//!   `exp + 2·clock_skew + 1` by this replica's clock: no replica can accept the state after
//!   its claim has gone. (Redis expiry runs on Redis's own clock, from a relative `PX`.)
//! - **Unknown outcomes are resolved.** A claim or start that failed in a way that may still
//!   have landed (a store stall past its command timeout) is given back in the background:
//!   this presentation never runs the call. If that cannot land either, the claim lease lets
//!   a later presentation take the claim over. An outcome that cannot be recorded is retried
//!   in the background until it lands or the claim expires.
//! - **A claimed retry outlives its client.** Once a retry has claimed its state, the state is
//!   spent: if the client went away and the call were cancelled, the answers it carried would
//!   be lost with it and the user would have to start over. So a client disconnect does not
//!   cancel a claimed retry: the legacy call goes on (bounded by `upstream.call_timeout`; it
//!   holds no request slot; a drain waits for it up to `drain.deadline` and otherwise records
//!   its outcome as lost at once, see [`super::claimed_runs`]), its notifications are dropped,
//!   and its outcome — the final result,
//!   an error, or the next `input_required` with its new state — is kept for the next
//!   presentation of the same state, which gets it (or "in progress" until it is there).
//!   This departs from the spec's advice to stop work for a cancelled request on purpose, for
//!   this one case: stopping would turn a dropped connection into lost user input. A first
//!   round (no state) and calls under `single_use` policy `never` are still cancelled.
//! - **Fairness.** An owner counts against its caller's share of the memory store
//!   (`single_use.max_entries_per_principal`): the principal, or for anonymous callers
//!   (`auth.mode = "none"`) the source address ([`Caller`]).

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use serde_json::Value;

use super::claimed_runs::Registration;
use super::deps::Engine;
use crate::caller_scope::Caller;
use crate::error::{Fault, Recorded, Rejection, RejectionKind};
use crate::metrics::Limit;
use crate::single_use::{self, Claim, Owner, SingleUseStore, StoreError};
use crate::state::StatePayload;
use mrtr_wire::jsonrpc::ErrorObject;

/// How the front answers an error: its HTTP status and JSON-RPC error. A kept outcome records
/// them, so that every duplicate presentation is answered as the first one was; this layer
/// chooses neither, so the front passes its table in.
pub type Render = fn(&Rejection) -> (StatusCode, ErrorObject);

/// A claim this presentation owns and has started: it must be settled.
pub struct Guard {
    store: Arc<SingleUseStore>,
    id: String,
    owner: Owner,
    /// When the claim expires (by the monotonic clock).
    until: tokio::time::Instant,
    /// On this replica's list of claimed runs until settled (a drain waits for it).
    registration: Registration,
}

/// What a claim attempt decided.
pub enum Claimed {
    /// This presentation runs the call.
    Owned(Guard),
    /// A duplicate: the first presentation's outcome.
    Duplicate(Result<Value, Rejection>),
}

/// What a duplicate presentation receives: the first one's result or error, kept as JSON.
#[derive(serde::Serialize, serde::Deserialize)]
struct KeptOutcome {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<ErrorObject>,
    #[serde(default)]
    status: u16,
    /// Whose fault the kept error was (`Fault::as_str`), so its duplicates are counted the
    /// same way; outcomes kept before this field existed read as upstream faults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fault: Option<String>,
}

/// How long the claim of a state expiring at `exp` must live, from `now` (Unix seconds):
/// until no replica whose clock is within `skew` of this one can still accept the state.
pub fn claim_ttl(exp: u64, skew: Duration, now: u64) -> Duration {
    let last_accepted = exp
        .saturating_add(skew.as_secs().saturating_mul(2))
        .saturating_add(1);
    Duration::from_secs(last_accepted.saturating_sub(now).max(1))
}

/// Why a claim or start failed, as the client hears it; a failure that may still have landed
/// is given back in the background (this presentation will not run; the claim lease covers a
/// give-back that fails too).
fn refused(engine: &Engine, guard: &Pending, e: StoreError) -> Rejection {
    match e {
        StoreError::PrincipalQuota { .. } => {
            engine.limits.hit(Limit::SingleUseMaxEntriesPerPrincipal);
        }
        StoreError::NewcomerReserve { .. } => engine.limits.hit(Limit::SingleUseNewcomerReserve),
        _ => {}
    }
    if e.may_have_landed() {
        let (store, id, owner, until) = (
            guard.store.clone(),
            guard.id.clone(),
            guard.owner.clone(),
            guard.until,
        );
        tokio::spawn(async move { store.release_eventually(&id, &owner, until).await });
    }
    Rejection::from(e)
}

/// A claim on an id, asked for but not started yet.
struct Pending {
    store: Arc<SingleUseStore>,
    id: String,
    owner: Owner,
    /// When the claim expires (by the monotonic clock).
    until: tokio::time::Instant,
}

/// A claim on `id` by `caller` for a state expiring at `exp`, not yet made.
fn prospective(
    engine: &Engine,
    caller: &Caller,
    id: &str,
    exp: u64,
    now: u64,
) -> (Pending, Duration) {
    let ttl = claim_ttl(exp, engine.codec.limits().clock_skew, now);
    let guard = Pending {
        store: engine.single_use(),
        id: id.to_owned(),
        owner: Owner::new(caller.as_str()),
        until: tokio::time::Instant::now() + ttl,
    };
    (guard, ttl)
}

/// Moves `guard`'s claim to started: from here on the call may reach the legacy server and
/// never runs again. The run lease covers the call's longest life and the recording of its
/// outcome.
/// The started claim is registered on this replica's claimed runs, so a drain waits for it.
async fn start(engine: &Engine, guard: Pending) -> Result<Guard, Rejection> {
    let cfg = engine.config();
    let run_lease = cfg.upstream.call_timeout + cfg.single_use.claim_lease;
    match guard.store.start(&guard.id, &guard.owner, run_lease).await {
        Ok(true) => Ok(Guard {
            registration: engine.claimed_runs.register(
                guard.store.clone(),
                &guard.id,
                &guard.owner,
            ),
            store: guard.store,
            id: guard.id,
            owner: guard.owner,
            until: guard.until,
        }),
        // Another presentation took the claim over while this one was slow to start.
        Ok(false) => Err(single_use::in_progress()),
        Err(e) => Err(refused(engine, &guard, e)),
    }
}

/// The longest a claim can live when states live `ttl` and clocks differ by up to `skew`:
/// [`claim_ttl`] for a state presented the moment it was sealed (whose `exp`, in whole seconds,
/// may round up by one).
pub fn longest_claim(ttl: Duration, skew: Duration) -> Duration {
    let exp = ttl.as_secs().saturating_add(1);
    claim_ttl(exp, skew, 0)
}

/// Claims the state `prior` for this presentation by `caller`, or answers as a duplicate.
pub async fn claim(
    engine: &Engine,
    caller: &Caller,
    prior: &StatePayload,
    now: u64,
) -> Result<Claimed, Rejection> {
    let (guard, ttl) = prospective(engine, caller, &prior.id, prior.exp, now);
    match guard.store.claim(&guard.id, &guard.owner, ttl).await {
        Err(e) => return Err(refused(engine, &guard, e)),
        Ok(Claim::InProgress) => return Err(single_use::in_progress()),
        Ok(Claim::DoneNotKept) => return Err(single_use::already_used()),
        Ok(Claim::Lost) => return Err(single_use::outcome_lost()),
        Ok(Claim::Done(bytes)) => return Ok(Claimed::Duplicate(replay(&bytes))),
        Ok(Claim::Acquired | Claim::TakenOver) => {}
    }
    start(engine, guard).await.map(Claimed::Owned)
}

/// Claims a fresh `id` for a call that is already running and is about to end its request with
/// a state-only round (`mrtr::long_call`): claimed and started at once, so that its outcome is
/// kept under `id` for whoever presents the state, on any replica sharing the store.
pub(super) async fn claim_running(
    engine: &Engine,
    caller: &Caller,
    id: &str,
    exp: u64,
    now: u64,
) -> Result<Guard, Rejection> {
    let (guard, ttl) = prospective(engine, caller, id, exp, now);
    match guard.store.claim(&guard.id, &guard.owner, ttl).await {
        Err(e) => return Err(refused(engine, &guard, e)),
        Ok(Claim::Acquired) => {}
        // A random 128-bit id someone else holds: nothing this call may write over.
        Ok(_) => return Err(single_use::in_progress()),
    }
    start(engine, guard).await
}

/// The answer a duplicate gets from a kept outcome.
pub(super) fn replay(bytes: &[u8]) -> Result<Value, Rejection> {
    let kept: KeptOutcome = serde_json::from_slice(bytes).map_err(|_| {
        Rejection::new(
            RejectionKind::SingleUseCorrupt,
            "a kept single-use outcome is unreadable",
        )
    })?;
    match (kept.result, kept.error) {
        (Some(result), _) => Ok(result),
        (None, Some(error)) => {
            let first = Recorded {
                status: kept.status,
                code: error.code,
                fault: kept
                    .fault
                    .as_deref()
                    .and_then(Fault::from_label)
                    .unwrap_or(Fault::Upstream),
            };
            let rejection = Rejection::new(RejectionKind::DuplicateOfError(first), error.message);
            Err(match error.data {
                Some(data) => rejection.with_data(data),
                None => rejection,
            })
        }
        (None, None) => Err(single_use::already_used()),
    }
}

impl Guard {
    /// What cancels the claimed run: the drain giving it up, never its client leaving.
    pub fn run_cancel(&self) -> tokio_util::sync::CancellationToken {
        self.registration.cancel().clone()
    }

    /// Records `outcome` for duplicates (an error as `render` answers it), or gives the claim
    /// back when nothing can have run (`may_have_run` false). `client_left`: the client went
    /// away during the call, which was finished anyway (counted).
    pub async fn settle(
        self,
        outcome: &Result<Value, Rejection>,
        render: Render,
        may_have_run: bool,
        client_left: bool,
    ) {
        if self.registration.given_up() {
            // The drain recorded this outcome as lost and cancelled the call: what the
            // cancelled call ended with is not the outcome.
            return;
        }
        if !may_have_run {
            self.store
                .release_eventually(&self.id, &self.owner, self.until)
                .await;
            return;
        }
        if client_left {
            self.store.metrics().detached_run();
            tracing::info!(
                "the client went away during a claimed retry; the call was finished and its \
                 outcome kept for the next presentation of the state"
            );
        }
        let bytes = kept(outcome, render);
        self.store
            .complete_eventually(&self.id, &self.owner, Some(bytes), self.until)
            .await;
    }
}

/// What is kept of `outcome` for duplicates: the result, or the error as `render` answers it.
fn kept(outcome: &Result<Value, Rejection>, render: Render) -> Vec<u8> {
    let kept = match outcome {
        Ok(result) => KeptOutcome {
            result: Some(result.clone()),
            error: None,
            status: 200,
            fault: None,
        },
        Err(rej) => {
            let (status, error) = render(rej);
            KeptOutcome {
                result: None,
                error: Some(error),
                status: status.as_u16(),
                fault: Some(rej.fault().as_str().to_owned()),
            }
        }
    };
    serde_json::to_vec(&kept).expect("outcomes serialize")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_outlives_every_replica_that_could_still_accept_the_state() {
        let skew = Duration::from_secs(30);
        // Issued at 1000 with a 600 s ttl; claimed at once.
        assert_eq!(claim_ttl(1600, skew, 1000), Duration::from_secs(661));
        // A replica 30 s behind accepts until its clock passes 1630, i.e. 1660 by ours (plus
        // the second its whole-second clock lags): the claim must outlive that.
        let claimed_at = 1629;
        let expires = claimed_at + claim_ttl(1600, skew, claimed_at).as_secs();
        assert!(expires > 1600 + 30 + 30, "{expires}");
        // Never zero, even for a state at the very end of its life.
        assert_eq!(claim_ttl(1600, skew, 5000), Duration::from_secs(1));
    }

    #[test]
    fn kept_errors_replay_with_their_status_and_fault() {
        let kept = serde_json::to_vec(&KeptOutcome {
            result: None,
            error: Some(ErrorObject::new(-32602, "too big")),
            status: 413,
            fault: Some("client".into()),
        })
        .unwrap();
        let r = replay(&kept).unwrap_err();
        let answer = crate::front::error_map::answer(&r);
        assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(answer.error, ErrorObject::new(-32602, "too big"));
        assert_eq!(r.fault(), Fault::Client);
        assert_eq!(r.reason(), "duplicate_of_error");
        // Kept before the fault was recorded: upstream, as it used to be.
        let old = br#"{"error":{"code":-32603,"message":"x"},"status":502}"#;
        assert_eq!(replay(old).unwrap_err().fault(), Fault::Upstream);
        assert!(replay(b"not json").is_err());
    }

    #[test]
    fn a_duplicate_is_answered_as_the_first_presentation_was() {
        let render: Render = crate::front::error_map::status_and_error;
        for first in [
            Rejection::new(RejectionKind::StateTooLarge, "questions too large")
                .with_data(serde_json::json!({"maxBytes": 10})),
            Rejection::new(RejectionKind::LegacyError(-32601), "no such method"),
            Rejection::new(RejectionKind::InputResponseTooLarge, "answer too large"),
        ] {
            let again = replay(&kept(&Err(first.clone()), render)).unwrap_err();
            assert_eq!(render(&again), render(&first), "{first:?}");
            assert_eq!(again.fault(), first.fault(), "{first:?}");
            assert_eq!(again.reason(), "duplicate_of_error");
        }
        let result = serde_json::json!({"content": []});
        assert_eq!(replay(&kept(&Ok(result.clone()), render)).unwrap(), result);
    }
}
