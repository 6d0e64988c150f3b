//! Legacy error -32042 (`URLElicitationRequiredError`, 2025-11-25) as an MRTR round.
//!
//! A 2025-11-25 server may end a call with -32042 and `data.elicitations`: URL-mode
//! elicitations the user must complete before the call can succeed. 2026-07-28 has no such
//! error (and forbids emitting it); the same need is an `input_required` result whose
//! `inputRequests` are URL elicitations. The retry replays the call — by then the user has
//! been through the URL flow, so the server should proceed, or ask again (bounded by
//! `state.max_rounds`). A user who declined or cancelled one of them gets a clear error
//! instead of being asked forever. The legacy `elicitationId` stays in the sealed state.

use serde_json::{Map, Value, json};

use super::answers::AnswerBook;
use super::input_key::KeyMinter;
use super::input_request::{missing_capability, to_input_request};
use super::run::{Call, Question};
use super::shape::shape;
use crate::error::{Rejection, RejectionKind};
use crate::policy::Stage;
use crate::state::InputKind;
use mrtr_wire::capabilities::Declared;
use mrtr_wire::jsonrpc::codes;

/// The URL elicitations of a legacy -32042 error response, if `msg` is one.
pub fn url_elicitations(msg: &Value) -> Option<Vec<Value>> {
    let err = msg.get("error")?;
    if err.get("code").and_then(Value::as_i64) != Some(codes::LEGACY_URL_ELICITATION_REQUIRED) {
        return None;
    }
    let list = err.pointer("/data/elicitations")?.as_array()?;
    let items: Vec<Value> = list
        .iter()
        .filter(|e| e.get("url").is_some_and(Value::is_string))
        .cloned()
        .collect();
    (!items.is_empty()).then_some(items)
}

/// Questions for the client, one per URL elicitation. Each passes the policy stage first; the
/// server needs every one of them, so one refused ends the call with an error (which names the
/// policy's reason, never the URL).
pub fn questions(
    call: &Call,
    elicitations: Vec<Value>,
    minter: &mut KeyMinter,
    declared: &Declared,
    book: &AnswerBook,
    stage: &Stage<'_>,
) -> Result<Vec<Question>, Rejection> {
    let mut out = Vec::with_capacity(elicitations.len());
    for e in elicitations {
        let mut params: Map<String, Value> = e.as_object().cloned().unwrap_or_default();
        params.insert("mode".into(), json!("url"));
        let params = Value::Object(params);
        let method = "elicitation/create";
        let (request, elicitation_id) =
            to_input_request(method, Some(&params), InputKind::ElicitUrl);
        let request = stage
            .review(&call.method, call.target(), InputKind::ElicitUrl, request)
            .map_err(|refusal| {
                Rejection::policy_refused(
                    format!(
                        "{} needs the user to open a URL that the gateway's policy refuses ({})",
                        call.describe(),
                        refusal.detail
                    ),
                    refusal.reason.as_str(),
                )
            })?;
        if let Some(required) = missing_capability(InputKind::ElicitUrl, Some(&params), declared) {
            return Err(Rejection::missing_capability(
                required,
                &format!("{} requires a URL-mode elicitation", call.describe()),
            ));
        }
        let key = minter.mint(method, Some(&params));
        if let Some(answer) = book.peek(&key)
            && answer.get("action").and_then(Value::as_str) != Some("accept")
        {
            return Err(Rejection::new(
                RejectionKind::UrlElicitationDeclined,
                format!(
                    "{} needs the user to complete a URL step ({key}), which was declined or cancelled",
                    call.describe()
                ),
            ));
        }
        out.push(Question {
            key,
            kind: InputKind::ElicitUrl,
            request,
            elicitation_id,
            server_id: Value::Null,
            shape: shape(method, Some(&params)),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_32042_with_url_elicitations_counts() {
        let m = json!({"jsonrpc":"2.0","id":1,"error":{"code":-32042,"message":"m","data":{"elicitations":[
            {"mode":"url","elicitationId":"e1","url":"https://x/1","message":"go"}]}}});
        assert_eq!(url_elicitations(&m).unwrap().len(), 1);
        assert!(url_elicitations(&json!({"error":{"code":-32602,"message":"m"}})).is_none());
        assert!(
            url_elicitations(&json!({"error":{"code":-32042,"message":"m","data":{}}})).is_none()
        );
        assert!(url_elicitations(&json!({"result":{}})).is_none());
    }
}
