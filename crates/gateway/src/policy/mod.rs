//! The policy stage: what a legacy server may ask the client.
//!
//! Every question a legacy server asks — a server request on the call stream or the standalone
//! GET stream, or a URL elicitation carried by a legacy -32042 error; in a first round, a
//! replay or a resumed parked call alike — passes through [`Stage::review`] after capture and
//! before it can become an `inputRequests` entry. The dual-era front puts the questions
//! relayed to passed-through legacy clients through the same stage
//! (`front::passthrough_review`; [`Stage::review_unattributed`] where the asking call is
//! unknown). The review, in order:
//!
//! 1. **Rules** (`[[policy.rules]]`, first match on method and tool/prompt name or resource
//!    URI): a kind the call may not ask is refused (`kind_not_allowed`).
//! 2. **Shape**: the entry must be a valid 2026-07-28 `InputRequest` (`question_schema`);
//!    otherwise it is refused as `malformed`.
//! 3. **URL safety** (URL-mode elicitation): [`url::judge`] against `[policy.url]`; a URL
//!    that passes is rewritten to the normalised form that was judged.
//! 4. **Sampling cap**: a `maxTokens` above `policy.sampling.max_tokens` is lowered to it (the
//!    question passes, rewritten).
//!
//! A refused question never reaches the client. [`Refusal::legacy_answer`] is the truthful
//! answer for the legacy server, so its call can go on: `{"action":"decline"}` for an
//! elicitation, a JSON-RPC error saying the gateway's policy refused it for sampling and
//! roots, -32602 for a malformed question. Every refusal is counted
//! (`policy_refusals_total{kind,reason}`) and logged at WARN with the call's method and
//! name, the kind, the reason, and for URLs only the scheme and host. The stage reads the
//! configuration in force when the question arrives, so a reload applies to new questions.
//!
//! The decision is a pure function of the configuration and the question ([`decide`]), so a
//! question gets the same outcome whether its call was parked and resumed or replayed.

pub mod config;
mod host_pattern;
mod metrics;
mod question_schema;
pub mod text_urls;
pub mod url;

use serde_json::{Value, json};

pub use config::PolicyConfig;
pub use host_pattern::HostPattern;
pub use metrics::PolicyMetrics;

use crate::state::InputKind;
use mrtr_wire::jsonrpc::{ErrorObject, codes};
use url::{UrlOrigin, UrlRefusal};

/// The JSON-RPC code of a policy refusal of a sampling or roots request: the code the MCP
/// sampling page uses for a client that rejects a request (outside the reserved ranges).
pub const POLICY_REFUSED: i64 = -1;

/// Why a question was refused; `as_str()` is the metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalReason {
    /// `[[policy.rules]]` do not let this call ask this kind.
    KindNotAllowed,
    /// Not a valid 2026-07-28 `InputRequest`.
    Malformed,
    /// A URL elicitation whose URL the URL policy refuses.
    Url(UrlRefusal),
    /// A URL the URL policy refuses, written in the question's text (`policy.url.review_text`).
    UrlInText(UrlRefusal),
}

impl RefusalReason {
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::KindNotAllowed => "kind_not_allowed",
            RefusalReason::Malformed => "malformed",
            RefusalReason::Url(u) => u.reason(),
            RefusalReason::UrlInText(_) => "url_in_text",
        }
    }
}

/// The metric / log label of a question kind.
pub fn kind_label(kind: InputKind) -> &'static str {
    match kind {
        InputKind::ElicitForm => "elicitation_form",
        InputKind::ElicitUrl => "elicitation_url",
        InputKind::Sampling => "sampling",
        InputKind::Roots => "roots",
    }
}

/// The `kind` label of a legacy error's `data` dropped for a URL it carries.
pub const ERROR_DATA_KIND: &str = "error_data";

/// Every `(kind, reason)` pair `policy_refusals_total` can count: each question kind can be
/// refused by the rules or as malformed, a URL elicitation by any URL rule, and a URL in text
/// (form and URL elicitations, legacy error data) as `url_in_text`.
pub fn refusal_labels() -> Vec<(&'static str, &'static str)> {
    let kinds = [
        InputKind::ElicitForm,
        InputKind::ElicitUrl,
        InputKind::Sampling,
        InputKind::Roots,
    ];
    let in_text = RefusalReason::UrlInText(UrlRefusal::Invalid).as_str();
    let mut pairs = Vec::new();
    for kind in kinds {
        for reason in [RefusalReason::KindNotAllowed, RefusalReason::Malformed] {
            pairs.push((kind_label(kind), reason.as_str()));
        }
    }
    for kind in [InputKind::ElicitForm, InputKind::ElicitUrl] {
        pairs.push((kind_label(kind), in_text));
    }
    pairs.push((ERROR_DATA_KIND, in_text));
    for url in UrlRefusal::ALL {
        pairs.push((
            kind_label(InputKind::ElicitUrl),
            RefusalReason::Url(*url).as_str(),
        ));
    }
    pairs
}

/// A question the policy holds back from the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub kind: InputKind,
    pub reason: RefusalReason,
    /// For operators and the legacy server: which rule refused, never the URL's path or query.
    pub detail: String,
    /// A refused URL's scheme and host, when it had them.
    pub url: Option<UrlOrigin>,
}

impl Refusal {
    /// What the legacy server is told, so its call can finish.
    pub fn legacy_answer(&self) -> Result<Value, ErrorObject> {
        match (self.reason, self.kind) {
            (RefusalReason::Malformed, _) => Err(ErrorObject::new(
                codes::INVALID_PARAMS,
                format!("mrtr-gateway refused a malformed request: {}", self.detail),
            )),
            (_, InputKind::ElicitForm | InputKind::ElicitUrl) => Ok(json!({"action": "decline"})),
            _ => Err(ErrorObject::new(
                POLICY_REFUSED,
                format!("refused by the gateway's policy: {}", self.detail),
            )
            .with_data(json!({"reason": self.reason.as_str()}))),
        }
    }
}

/// A question that passes, possibly rewritten.
#[derive(Debug, Clone, PartialEq)]
pub struct Passed {
    /// The `inputRequests` entry to show the client.
    pub request: Value,
    /// `maxTokens` as the legacy server asked, when the cap lowered it.
    pub clamped_from: Option<u64>,
}

/// The policy's decision on one question: `request` is its `inputRequests` entry, `method`
/// and `name` the modern call it belongs to (tool/prompt name or resource URI).
pub fn decide(
    policy: &PolicyConfig,
    method: &str,
    name: Option<&str>,
    kind: InputKind,
    request: Value,
) -> Result<Passed, Refusal> {
    let allowed = policy.allowed_for(method, name);
    decide_as(policy, allowed, method, name, kind, request)
}

/// [`decide`] with the kinds the call may ask already known.
fn decide_as(
    policy: &PolicyConfig,
    allowed: config::Allowed,
    method: &str,
    name: Option<&str>,
    kind: InputKind,
    mut request: Value,
) -> Result<Passed, Refusal> {
    let refuse = |reason, detail: String, url| {
        Err(Refusal {
            kind,
            reason,
            detail,
            url,
        })
    };
    if !allowed.allows(kind) {
        let what = match kind {
            InputKind::ElicitForm | InputKind::ElicitUrl => "elicitation",
            InputKind::Sampling => "sampling",
            InputKind::Roots => "roots",
        };
        return refuse(
            RefusalReason::KindNotAllowed,
            format!("[[policy.rules]] do not allow {method} {name:?} to ask for {what}"),
            None,
        );
    }
    if let Err(why) = question_schema::validate(&request) {
        return refuse(RefusalReason::Malformed, why, None);
    }
    if policy.url.review_text && matches!(kind, InputKind::ElicitForm | InputKind::ElicitUrl) {
        for (field, text) in text_urls::elicitation_texts(&request) {
            if let Some(refused) = text_urls::first_refused(text, &policy.url) {
                return refuse(
                    RefusalReason::UrlInText(refused.refusal),
                    format!(
                        "a URL in {field}: {}",
                        refused.refusal.describe(&policy.url)
                    ),
                    refused.origin,
                );
            }
        }
    }
    if kind == InputKind::ElicitUrl {
        let raw = request
            .pointer("/params/url")
            .and_then(Value::as_str)
            .unwrap_or_default();
        match url::judge(raw, &policy.url) {
            Err(refused) => {
                return refuse(
                    RefusalReason::Url(refused.refusal),
                    refused.refusal.describe(&policy.url),
                    refused.origin,
                );
            }
            // The client is shown the text that was judged, not the text that was sent.
            Ok(judged) => {
                if let Some(slot) = request.pointer_mut("/params/url") {
                    *slot = Value::String(judged.shown);
                }
            }
        }
    }
    let mut clamped_from = None;
    if kind == InputKind::Sampling
        && let Some(cap) = policy.max_tokens
        && let Some(slot) = request.pointer_mut("/params/maxTokens")
        && let Some(asked) = slot.as_u64()
        && asked > cap
    {
        *slot = Value::from(cap);
        clamped_from = Some(asked);
    }
    Ok(Passed {
        request,
        clamped_from,
    })
}

/// The stage as the capture loop uses it: the policy in force and where its refusals count.
pub struct Stage<'a> {
    pub policy: &'a PolicyConfig,
    pub metrics: &'a PolicyMetrics,
}

impl Stage<'_> {
    /// Reviews one question ([`decide`]); a refusal is counted and logged before it is
    /// returned, a lowered `maxTokens` counted.
    pub fn review(
        &self,
        method: &str,
        name: Option<&str>,
        kind: InputKind,
        request: Value,
    ) -> Result<Value, Refusal> {
        let decided = decide(self.policy, method, name, kind, request);
        self.record(method, name, decided)
    }

    /// Reviews a question whose call is unknown (a passed-through legacy client's GET
    /// stream, or a request that is not a call): it may be only a kind every
    /// `[[policy.rules]]` entry allows ([`PolicyConfig::allowed_for_any_call`]).
    pub fn review_unattributed(&self, kind: InputKind, request: Value) -> Result<Value, Refusal> {
        let allowed = self.policy.allowed_for_any_call();
        let method = "(no call)";
        let decided = decide_as(self.policy, allowed, method, None, kind, request);
        self.record(method, None, decided)
    }

    /// Counts and logs a decision.
    fn record(
        &self,
        method: &str,
        name: Option<&str>,
        decided: Result<Passed, Refusal>,
    ) -> Result<Value, Refusal> {
        match decided {
            Ok(passed) => {
                if let Some(asked) = passed.clamped_from {
                    self.metrics.max_tokens_clamped();
                    tracing::info!(
                        %method,
                        tool = name.unwrap_or("?"),
                        asked,
                        cap = self.policy.max_tokens,
                        "lowered a sampling request's maxTokens to policy.sampling.max_tokens"
                    );
                }
                Ok(passed.request)
            }
            Err(refusal) => {
                self.metrics
                    .refused(kind_label(refusal.kind), refusal.reason.as_str());
                let (url_scheme, url_host) = refusal
                    .url
                    .as_ref()
                    .map_or(("", ""), |u| (u.scheme.as_str(), u.host.as_str()));
                tracing::warn!(
                    %method,
                    tool = name.unwrap_or("?"),
                    kind = kind_label(refusal.kind),
                    reason = refusal.reason.as_str(),
                    url_scheme,
                    url_host,
                    detail = %refusal.detail,
                    "the gateway's policy refused a question of the legacy server; the client does not see it"
                );
                Err(refusal)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_reason_is_counted_from_the_start_and_documented() {
        use std::collections::BTreeSet;
        let labelled: BTreeSet<&str> = refusal_labels().iter().map(|(_, r)| *r).collect();
        // The URL rules' labels, read from `UrlRefusal::reason`: one added there and not to
        // `UrlRefusal::ALL` fails here.
        let src = include_str!("url.rs");
        let body = &src[src.find("pub fn reason(self)").expect("reason()")..];
        let body = &body[..body.find("\n    }\n").expect("end of reason()")];
        let url_reasons: BTreeSet<&str> = body.split('"').skip(1).step_by(2).collect();
        assert_eq!(url_reasons.len(), 12, "{url_reasons:?}");
        assert!(url_reasons.is_subset(&labelled), "{url_reasons:?}");
        // docs/metrics.md's table of refusal reasons lists the same labels.
        let doc = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/metrics.md"),
        )
        .unwrap();
        let table = &doc[doc.find("`policy_refusals_total{reason}`:").unwrap()..];
        let documented: BTreeSet<&str> = table
            .lines()
            .skip(4)
            .take_while(|l| l.starts_with("| `"))
            .map(|l| l[3..].split('`').next().unwrap())
            .collect();
        assert_eq!(labelled, documented);
    }

    fn url_question(url: &str) -> Value {
        json!({"method":"elicitation/create","params":{"mode":"url","message":"Sign in","url":url}})
    }

    fn sampling_question(max_tokens: u64) -> Value {
        json!({"method":"sampling/createMessage","params":{
            "messages":[{"role":"user","content":{"type":"text","text":"hi"}}],"maxTokens":max_tokens}})
    }

    fn form_question() -> Value {
        json!({"method":"elicitation/create","params":{"mode":"form","message":"Name?",
            "requestedSchema":{"type":"object","properties":{"name":{"type":"string"}}}}})
    }

    fn issue_policy() -> PolicyConfig {
        let raw: config::RawPolicy = toml::from_str(
            "[url]\nallow_hosts = [\"auth.example.com\"]\n[sampling]\nmax_tokens = 1024\n\
             [[rules]]\nmethod = \"tools/call\"\nname = \"where\"\nallow = [\"elicitation\"]\n",
        )
        .unwrap();
        PolicyConfig::from_raw(&raw).unwrap()
    }

    #[test]
    fn a_url_question_reaches_the_client_with_its_host_in_punycode() {
        let p = PolicyConfig::from_raw(&config::RawPolicy::default()).unwrap();
        let passed = decide(
            &p,
            "tools/call",
            Some("login"),
            InputKind::ElicitUrl,
            url_question("https://\u{430}pple.com/signin"),
        )
        .unwrap();
        assert_eq!(
            passed.request,
            url_question("https://xn--pple-43d.com/signin")
        );
    }

    #[test]
    fn each_step_refuses_or_passes() {
        let p = issue_policy();
        let d = |name, kind, q| decide(&p, "tools/call", Some(name), kind, q);

        // Rules: `where` may elicit, never sample or read roots.
        assert!(d("where", InputKind::ElicitForm, form_question()).is_ok());
        let r = d("where", InputKind::Roots, json!({"method":"roots/list"})).unwrap_err();
        assert_eq!(r.reason, RefusalReason::KindNotAllowed);
        let r = d("where", InputKind::Sampling, sampling_question(5)).unwrap_err();
        assert_eq!(r.reason, RefusalReason::KindNotAllowed);
        assert!(d("other", InputKind::Roots, json!({"method":"roots/list"})).is_ok());

        // Shape.
        let bad = json!({"method":"elicitation/create","params":{"requestedSchema":{"type":"object","properties":{}}}});
        let r = d("other", InputKind::ElicitForm, bad).unwrap_err();
        assert_eq!(r.reason, RefusalReason::Malformed);

        // URLs.
        let ok = d(
            "other",
            InputKind::ElicitUrl,
            url_question("https://auth.example.com/authorize?state=abc"),
        )
        .unwrap();
        assert_eq!(
            ok.request,
            url_question("https://auth.example.com/authorize?state=abc")
        );
        let r = d(
            "other",
            InputKind::ElicitUrl,
            url_question("https://evil.auth.example.com/x?token=T"),
        )
        .unwrap_err();
        assert_eq!(r.reason, RefusalReason::Url(UrlRefusal::HostNotAllowed));
        assert_eq!(r.url.as_ref().unwrap().host, "evil.auth.example.com");
        assert!(!r.detail.contains("token"), "{}", r.detail);
        let r = d(
            "other",
            InputKind::ElicitUrl,
            url_question("https://metadata.google.internal/computeMetadata/v1/"),
        )
        .unwrap_err();
        assert_eq!(r.reason, RefusalReason::Url(UrlRefusal::InternalName));
        assert_eq!(r.reason.as_str(), "url_internal_name");

        // Sampling cap.
        let clamped = d("other", InputKind::Sampling, sampling_question(100_000)).unwrap();
        assert_eq!(clamped.request["params"]["maxTokens"], 1024);
        assert_eq!(clamped.clamped_from, Some(100_000));
        let under = d("other", InputKind::Sampling, sampling_question(1024)).unwrap();
        assert_eq!(under.request["params"]["maxTokens"], 1024);
        assert_eq!(under.clamped_from, None);
    }

    #[test]
    fn no_cap_by_default() {
        let p = PolicyConfig::default();
        let passed = decide(
            &p,
            "tools/call",
            None,
            InputKind::Sampling,
            sampling_question(100_000),
        )
        .unwrap();
        assert_eq!(passed.request["params"]["maxTokens"], 100_000);
    }

    #[test]
    fn the_legacy_server_is_told_the_truth() {
        let p = issue_policy();
        let d = |kind, q| decide(&p, "tools/call", Some("where"), kind, q).unwrap_err();
        assert_eq!(
            d(
                InputKind::ElicitForm,
                json!({"method":"elicitation/create","params":{}})
            )
            .legacy_answer()
            .unwrap_err()
            .code,
            codes::INVALID_PARAMS
        );
        let url = decide(
            &p,
            "tools/call",
            Some("x"),
            InputKind::ElicitUrl,
            url_question("javascript:alert(1)"),
        )
        .unwrap_err();
        assert_eq!(url.legacy_answer(), Ok(json!({"action": "decline"})));
        let roots = d(InputKind::Roots, json!({"method":"roots/list"}))
            .legacy_answer()
            .unwrap_err();
        assert_eq!(roots.code, POLICY_REFUSED);
        assert!(
            roots.message.contains("gateway's policy"),
            "{}",
            roots.message
        );
        assert_eq!(roots.data, Some(json!({"reason": "kind_not_allowed"})));
        let sampling = d(InputKind::Sampling, sampling_question(1))
            .legacy_answer()
            .unwrap_err();
        assert_eq!(sampling.code, POLICY_REFUSED);
    }
}
