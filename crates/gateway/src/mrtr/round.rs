//! One `input_required` round: the questions asked, the state sealed for the retry, and the
//! limit on how many rounds a call may take.

use serde_json::{Map, Value};

use super::deps::Engine;
use super::engine::{Presented, Serving};
use super::run::{Call, Question};
use super::state_size;
use crate::error::{Rejection, RejectionKind};
use crate::metrics::Limit;
use crate::state::{ParkRef, Pending};
use crate::translate;

/// The questions of one `input_required` round, and where the blocked call waits, if it does.
pub(super) struct Round {
    /// Key, what the state remembers of the question, and the `inputRequests` entry.
    pub(super) asked: Vec<(String, Pending, Value)>,
    /// The parking handle of the blocked legacy call.
    pub(super) parked: Option<String>,
}

pub(super) fn asked(questions: &[Question]) -> Vec<(String, Pending, Value)> {
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

pub(super) fn max_rounds(engine: &Engine, call: &Call, limit: u32) -> Rejection {
    engine.metrics.max_rounds_exceeded(&call.method);
    Rejection::new(
        RejectionKind::MaxRounds,
        format!(
            "{} asked for input in more than {limit} rounds (state.max_rounds); the legacy server does not converge, often because its questions change on every execution",
            call.describe(),
        ),
    )
}

/// Seals the round's state (the answers so far, the questions asked, where the blocked call
/// waits) and shapes the `input_required` result. Past `state.max_rounds` the call ends instead;
/// a state over `state.max_bytes` ends it too, releasing the parked call.
pub(super) async fn seal_round(
    s: &Serving<'_>,
    presented: &Presented,
    round: Round,
    server_info: &Value,
) -> Result<Value, Rejection> {
    let (engine, call) = (s.engine, s.call);
    let (prior, book, origin, now) = (
        presented.prior.as_ref(),
        &presented.book,
        presented.origin.of(&call.method, &call.params),
        presented.now,
    );
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
            engine.limits.hit(Limit::StateMaxBytes);
            return Err(state_size::rejection(
                &engine.codec,
                &call.describe(),
                &payload,
                e,
            ));
        }
    };
    engine.metrics.state_sealed(&kid, token.len());
    engine.metrics.input_required(&call.method);
    Ok(translate::input_required(
        input_requests,
        token,
        server_info,
    ))
}
