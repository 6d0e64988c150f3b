//! What a sealed `requestState` carries.
//!
//! Field names are short because the payload travels on every retry; the meaning of each is
//! documented here and in `docs/architecture.md`. The format version lives in the token's
//! clear-text prefix (bound as associated data), not in the payload.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

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
    pub ans: BTreeMap<String, Value>,
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
