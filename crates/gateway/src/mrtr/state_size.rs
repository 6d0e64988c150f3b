//! A next `requestState` that would exceed `state.max_bytes`: whose fault it is, and what the
//! client is told.
//!
//! A state carries the answers the client gave (every answer used so far, so that a replay
//! elsewhere can answer the legacy server again) and the keys and shapes of the questions the
//! legacy server just asked. When the sealed token would be larger than `state.max_bytes`:
//! - if the same state **without the answers** would fit, the client's answers are what does
//!   not fit: kind `input_response_too_large` (HTTP 413, JSON-RPC -32602, fault `client`),
//!   with data naming the limit and the largest answer's key. The client can answer with less
//!   data; the operator can raise `state.max_bytes` (and `listen.max_body_bytes` with it).
//! - otherwise the legacy server's questions alone are too large: kind `state_too_large`
//!   (HTTP 502, fault `upstream`).
//!
//! Either way the call cannot continue: the legacy call is cancelled by the caller.

use serde_json::json;

use crate::error::{Rejection, RejectionKind};
use crate::state::{StateCodec, StatePayload, TooLarge};

/// The rejection for a `payload` whose sealed form is `too_large`; `what` names the call
/// ("tool \"x\"").
pub fn rejection(
    codec: &StateCodec,
    what: &str,
    payload: &StatePayload,
    too_large: TooLarge,
) -> Rejection {
    let TooLarge { size, limit } = too_large;
    let largest = payload
        .ans
        .iter()
        .map(|(key, answer)| (key, answer.json().len()))
        .max_by_key(|(_, len)| *len);
    let without_answers = StatePayload {
        ans: Default::default(),
        ..payload.clone()
    };
    match largest {
        Some((key, answer_bytes)) if codec.seal(&without_answers).is_ok() => Rejection::new(
            RejectionKind::InputResponseTooLarge,
            format!(
                "cannot continue {what}: the answers it must carry into the next round make its \
                 requestState {size} bytes, above state.max_bytes ({limit}); the largest is \
                 inputResponses[{key:?}] ({answer_bytes} bytes of JSON). Start the call again \
                 with a shorter answer, or ask the operator to raise state.max_bytes"
            ),
        )
        .with_data(json!({
            "limit": "state.max_bytes",
            "maxBytes": limit,
            "stateBytes": size,
            "key": key,
            "answerBytes": answer_bytes,
        })),
        _ => Rejection::new(
            RejectionKind::StateTooLarge,
            format!(
                "cannot continue {what}: the legacy server's questions make its requestState \
                 {size} bytes, above state.max_bytes ({limit})"
            ),
        )
        .with_data(json!({"limit": "state.max_bytes", "maxBytes": limit, "stateBytes": size})),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::StateKeySpec;
    use crate::error::Fault;
    use crate::front::error_map::answer;
    use crate::state::{InputKind, Pending};
    use http::StatusCode;
    use mrtr_wire::jsonrpc::codes;
    use std::time::Duration;

    fn codec(max_bytes: usize) -> StateCodec {
        StateCodec::new(
            &[StateKeySpec {
                id: "k1".into(),
                secret: [7; 32],
            }],
            Duration::from_secs(600),
            max_bytes,
        )
    }

    fn pending(shape: String) -> Pending {
        Pending {
            kind: InputKind::ElicitForm,
            elicitation_id: None,
            shape: Some(shape),
        }
    }

    #[test]
    fn answers_that_do_not_fit_are_the_clients_fault_and_named() {
        let c = codec(2048);
        let mut p = c.fresh_payload("anonymous", "origin", 1_000);
        p.ans
            .insert("small".into(), json!({"action": "accept"}).into());
        p.ans.insert(
            "elicit-big".into(),
            json!({"text": "x".repeat(4000)}).into(),
        );
        p.pnd.insert("elicit-next".into(), pending("s".into()));
        let e = c.seal(&p).unwrap_err();
        let rej = rejection(&c, "tool \"t\"", &p, e);
        assert_eq!(rej.fault(), Fault::Client);
        assert_eq!(rej.reason(), "input_response_too_large");
        let r = answer(&rej);
        assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(r.error.code, codes::INVALID_PARAMS);
        assert!(r.error.message.contains("state.max_bytes (2048)"));
        assert!(r.error.message.contains("inputResponses[\"elicit-big\"]"));
        let data = r.error.data.unwrap();
        assert_eq!(data["key"], "elicit-big");
        assert_eq!(data["maxBytes"], 2048);
    }

    #[test]
    fn questions_that_do_not_fit_are_the_upstreams_fault() {
        let c = codec(1024);
        let mut p = c.fresh_payload("anonymous", "origin", 1_000);
        p.ans.insert("a".into(), json!("short").into());
        p.pnd.insert("elicit-q".into(), pending("q".repeat(3000)));
        let e = c.seal(&p).unwrap_err();
        let r = rejection(&c, "tool \"t\"", &p, e);
        assert_eq!(answer(&r).status, StatusCode::BAD_GATEWAY);
        assert_eq!(r.fault(), Fault::Upstream);
        assert_eq!(r.reason(), "state_too_large");
    }
}
