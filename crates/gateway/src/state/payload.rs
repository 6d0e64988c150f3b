//! What a sealed `requestState` carries.
//!
//! Field names are short because the payload travels on every retry; the meaning of each is
//! documented here and in `docs/architecture.md`. The format version lives in the token's
//! clear-text prefix (bound as associated data), not in the payload.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

/// The kind of input a pending key asks for; it decides how its answer is validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum InputKind {
    /// `elicitation/create` in form mode.
    #[serde(rename = "f")]
    ElicitForm,
    /// `elicitation/create` in URL mode.
    #[serde(rename = "u")]
    ElicitUrl,
    /// `sampling/createMessage`.
    #[serde(rename = "s")]
    Sampling,
    /// `roots/list`.
    #[serde(rename = "r")]
    Roots,
}

impl InputKind {
    pub fn as_str(self) -> &'static str {
        match self {
            InputKind::ElicitForm => "elicitation (form)",
            InputKind::ElicitUrl => "elicitation (url)",
            InputKind::Sampling => "sampling",
            InputKind::Roots => "roots",
        }
    }
}

/// One answer a state carries, kept as the JSON text it was first written as.
///
/// Carried answers travel through every later round unchanged, so they are never taken apart
/// on the way: a state is opened without building their trees, and sealed again by copying
/// their text (no re-escaping of what the user typed). The engine reads one as a [`Value`]
/// only when the legacy server asks for it ([`Answer::to_value`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Answer(Box<RawValue>);

impl Answer {
    /// An answer as the client sent it.
    pub fn from_value(value: &Value) -> Answer {
        Answer(serde_json::value::to_raw_value(value).expect("a JSON value serializes"))
    }

    /// The answer as a JSON value.
    pub fn to_value(&self) -> Value {
        serde_json::from_str(self.0.get()).expect("an answer's text is JSON (checked when read)")
    }

    /// The answer's JSON text.
    pub fn json(&self) -> &str {
        self.0.get()
    }
}

impl PartialEq for Answer {
    fn eq(&self, other: &Answer) -> bool {
        self.json() == other.json()
    }
}

impl From<Value> for Answer {
    fn from(value: Value) -> Answer {
        Answer::from_value(&value)
    }
}

/// One question the client was asked and has not answered yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pending {
    #[serde(rename = "k")]
    pub kind: InputKind,
    /// The legacy `elicitationId` of a URL-mode elicitation, kept out of the client's view.
    #[serde(rename = "e", default, skip_serializing_if = "Option::is_none")]
    pub elicitation_id: Option<String>,
    /// A short digest of the question with volatile content (digits, ids, timestamps) masked,
    /// to spot a server that re-asks the "same" question with changing details.
    #[serde(rename = "s", default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<String>,
}

/// Where a parked legacy call lives (a replica and a handle in its parking lot).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParkRef {
    #[serde(rename = "i")]
    pub instance: String,
    #[serde(rename = "h")]
    pub handle: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatePayload {
    /// Random 128-bit id (base64url): the single-use claim key.
    pub id: String,
    /// Issued at, Unix seconds.
    pub iat: u64,
    /// Expires at, Unix seconds.
    pub exp: u64,
    /// The principal the state is bound to.
    pub prn: String,
    /// Digest of the originating request (method + canonical params, see `mrtr::origin`).
    pub org: String,
    /// Rounds completed: 1 in the state of the first `input_required` result.
    pub rnd: u32,
    /// Answers gathered so far, by input key (bare result objects as the client sent them).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ans: BTreeMap<String, Answer>,
    /// Keys asked in the round this state belongs to, with what each asks for.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pnd: BTreeMap<String, Pending>,
    /// Parked legacy call, when the issuing replica kept one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub park: Option<ParkRef>,
    /// A state-only round: the call is still running, and `id` names the claim under which
    /// its outcome will be kept (`mrtr::long_call`). Such a state never runs anything.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub run: bool,
}

/// A fresh random id for a state (16 bytes, base64url).
pub fn random_id() -> String {
    use base64::Engine;
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).expect("the OS random source failed");
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn carried_answers_keep_their_text_and_read_back_as_the_same_values() {
        let v =
            json!({"action": "accept", "content": {"note": "a \"quoted\" line\nand é", "n": 1.5}});
        let a = Answer::from_value(&v);
        assert_eq!(a.to_value(), v);
        assert_eq!(a.json(), serde_json::to_string(&v).unwrap());
        // The payload's JSON is what earlier releases wrote (answers as plain JSON values), so
        // states sealed before this type existed open, and seal again to the same JSON.
        let written = json!({
            "id": "x", "iat": 1, "exp": 2, "prn": "p", "org": "o", "rnd": 1,
            "ans": {"elicit-1": v},
        });
        let bytes = serde_json::to_vec(&written).unwrap();
        let p: StatePayload = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(p.ans["elicit-1"].to_value(), v);
        let again: Value = serde_json::from_slice(&serde_json::to_vec(&p).unwrap()).unwrap();
        assert_eq!(again, written);
    }

    #[test]
    fn an_answer_that_is_not_json_makes_the_payload_unreadable() {
        let bad = br#"{"id":"x","iat":1,"exp":2,"prn":"p","org":"o","rnd":1,"ans":{"k":{"a":}}}"#;
        assert!(serde_json::from_slice::<StatePayload>(bad).is_err());
    }
}
