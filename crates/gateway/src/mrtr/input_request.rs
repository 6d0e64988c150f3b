//! Turning a legacy server request into an `inputRequests` entry.
//!
//! The entry is the request without its JSON-RPC envelope (`{method, params}`), with what has
//! no meaning on the modern side removed: `_meta` (the three request types define none;
//! the gateway's key hint lives there), `task` (legacy tasks), and a URL elicitation's
//! `elicitationId` (kept in the sealed state instead). A 2025-06-18 elicitation has no `mode`;
//! it is a form, and says so.

use serde_json::{Map, Value, json};

use crate::state::InputKind;
use mrtr_wire::capabilities::Declared;

/// The kind of a server request, or `None` if it is not one a client can be asked.
pub fn kind_of(method: &str, params: Option<&Value>) -> Option<InputKind> {
    match method {
        "elicitation/create" => {
            let mode = params.and_then(|p| p.get("mode")).and_then(Value::as_str);
            Some(if mode == Some("url") {
                InputKind::ElicitUrl
            } else {
                InputKind::ElicitForm
            })
        }
        "sampling/createMessage" => Some(InputKind::Sampling),
        "roots/list" => Some(InputKind::Roots),
        _ => None,
    }
}

/// The capability this request needs that `declared` lacks, as a `ClientCapabilities` object.
pub fn missing_capability(
    kind: InputKind,
    params: Option<&Value>,
    declared: &Declared,
) -> Option<Value> {
    match kind {
        InputKind::ElicitForm if !declared.elicit_form => {
            Some(json!({"elicitation": {"form": {}}}))
        }
        InputKind::ElicitUrl if !declared.elicit_url => Some(json!({"elicitation": {"url": {}}})),
        InputKind::Sampling if !declared.sampling => Some(json!({"sampling": {}})),
        InputKind::Sampling => {
            let wants_tools =
                params.is_some_and(|p| p.get("tools").is_some() || p.get("toolChoice").is_some());
            (wants_tools && !declared.sampling_tools).then(|| json!({"sampling": {"tools": {}}}))
        }
        InputKind::Roots if !declared.roots => Some(json!({"roots": {}})),
        _ => None,
    }
}

/// The `inputRequests` value for a server request, and a URL elicitation's id.
pub fn to_input_request(
    method: &str,
    params: Option<&Value>,
    kind: InputKind,
) -> (Value, Option<String>) {
    if kind == InputKind::Roots {
        return (json!({"method": method}), None);
    }
    let mut p: Map<String, Value> = params
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    p.remove("_meta");
    p.remove("task");
    let mut elicitation_id = None;
    match kind {
        InputKind::ElicitForm => {
            // A 2025-06-18 elicitation has no mode: it is a form. Any other mode is left for
            // the policy stage to refuse.
            p.entry("mode").or_insert_with(|| Value::from("form"));
        }
        InputKind::ElicitUrl => {
            elicitation_id = p
                .remove("elicitationId")
                .and_then(|v| v.as_str().map(str::to_string));
        }
        _ => {}
    }
    // Not `json!`: it would copy the params (it converts each value it is given).
    let mut entry = Map::new();
    entry.insert("method".into(), Value::from(method));
    entry.insert("params".into(), Value::Object(p));
    (Value::Object(entry), elicitation_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_and_private_members_are_removed() {
        let params = json!({"message":"m","requestedSchema":{"type":"object"},"_meta":{"io.mrtr-gateway/inputKey":"k"},"task":{"ttl":1}});
        let (v, id) = to_input_request("elicitation/create", Some(&params), InputKind::ElicitForm);
        assert_eq!(
            v,
            json!({"method":"elicitation/create","params":{"mode":"form","message":"m","requestedSchema":{"type":"object"}}})
        );
        assert_eq!(id, None);
        let url = json!({"mode":"url","url":"https://x","message":"m","elicitationId":"e1"});
        let (v, id) = to_input_request("elicitation/create", Some(&url), InputKind::ElicitUrl);
        assert_eq!(
            v["params"],
            json!({"mode":"url","url":"https://x","message":"m"})
        );
        assert_eq!(id.as_deref(), Some("e1"));
        let odd = json!({"mode":"wizard","message":"m"});
        let (v, _) = to_input_request("elicitation/create", Some(&odd), InputKind::ElicitForm);
        assert_eq!(
            v["params"]["mode"], "wizard",
            "an unknown mode stays visible to the policy stage"
        );
        let (v, _) = to_input_request("roots/list", Some(&json!({"_meta":{}})), InputKind::Roots);
        assert_eq!(v, json!({"method":"roots/list"}));
    }

    #[test]
    fn capability_gate() {
        let none = Declared::default();
        let all = Declared::from_modern(&json!({"roots":{},"sampling":{},"elicitation":{}}));
        assert_eq!(
            missing_capability(InputKind::ElicitForm, None, &none),
            Some(json!({"elicitation":{"form":{}}}))
        );
        assert_eq!(missing_capability(InputKind::ElicitForm, None, &all), None);
        assert_eq!(
            missing_capability(InputKind::ElicitUrl, None, &all),
            Some(json!({"elicitation":{"url":{}}}))
        );
        assert_eq!(
            missing_capability(InputKind::Roots, None, &none),
            Some(json!({"roots":{}}))
        );
        let with_tools = json!({"messages":[],"maxTokens":1,"tools":[]});
        assert_eq!(
            missing_capability(InputKind::Sampling, Some(&with_tools), &all),
            Some(json!({"sampling":{"tools":{}}}))
        );
        assert_eq!(missing_capability(InputKind::Sampling, None, &all), None);
    }
}
