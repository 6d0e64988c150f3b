//! The policy stage on passed-through legacy sessions (the dual-era front).
//!
//! A legacy client's session is relayed byte for byte, but the questions the legacy server
//! asks on it (`elicitation/create`, `sampling/createMessage`, `roots/list`) must meet the
//! same [`Stage`] a 2026-07-28 client's questions meet. [`Screen`] sits in the relay
//! of every SSE response (a POST's response stream and the standalone GET stream): it decodes
//! the events with the wire crate's decoder, hands each server request to the stage, and
//!
//! - passes a question the stage lets through, rewritten as the stage rewrote it (a URL in the
//!   normalised form that was judged, a `maxTokens` lowered to the cap);
//! - holds back a question the stage refuses: the client never sees it, and the legacy server
//!   is answered on the session (a JSON-RPC response POSTed to it) exactly as the MRTR path
//!   answers it, with [`Refusal::legacy_answer`];
//! - reviews the URL elicitations of a legacy -32042 error the same way: one refused turns
//!   the error into the one the MRTR path ends such a call with (-32603, `policyReason`);
//! - drops the `data` of any other error when it carries a URL the policy refuses, as the
//!   MRTR path does (`policy.url.review_text`);
//! - passes every other event as it came (re-framed, same id, type, retry and data).
//!
//! Which call asked: on a POST stream, the call the client POSTed (`tools/call`, `prompts/get`,
//! `resources/read` and its name or URI), so `[[policy.rules]]` match as they do for modern
//! calls. On the GET stream, or for a request that is not one of those calls (a batch, a
//! notification), the asking call is unknown: the question may be only a kind that *every*
//! rule allows ([`Stage::review_unattributed`]).

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Method, header};
use serde_json::Value;

use crate::legacy::upstream::Upstream;
use crate::metrics::{Limit, LimitHits};
use crate::mrtr::deps::Engine;
use crate::mrtr::input_request::{kind_of, to_input_request};
use crate::policy::{Refusal, Stage};
use crate::state::InputKind;
use mrtr_wire::jsonrpc::{ErrorObject, codes, error_response, result_response};
use mrtr_wire::sse::{SseDecoder, SseError, SseEvent};

/// The call a POST asked for, as `[[policy.rules]]` match it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AskingCall {
    pub method: String,
    pub name: Option<String>,
}

impl AskingCall {
    /// The call in a POST body, when it is one call a rule can name.
    pub fn of_body(body: &[u8]) -> Option<AskingCall> {
        let msg: Value = serde_json::from_slice(body).ok()?;
        let method = msg.get("method")?.as_str()?;
        let key = match method {
            "tools/call" | "prompts/get" => "name",
            "resources/read" => "uri",
            _ => return None,
        };
        let name = msg
            .pointer(&format!("/params/{key}"))
            .and_then(Value::as_str)
            .map(str::to_string);
        Some(AskingCall {
            method: method.to_string(),
            name,
        })
    }
}

/// Screens one relayed SSE body.
pub struct Screen {
    engine: Arc<Engine>,
    upstream: Arc<Upstream>,
    /// Headers of an answer POSTed to the legacy server: its session, credentials, version.
    answer_headers: HeaderMap,
    call: Option<AskingCall>,
    decoder: SseDecoder,
    /// A plain JSON body (not SSE), gathered whole to be reviewed once it has all arrived.
    json: Option<BytesMut>,
    max_event: usize,
    limits: LimitHits,
}

/// What became of one relayed message.
enum Screened {
    /// Relay the event as it came.
    Unchanged,
    /// Relay this instead.
    Rewritten(Value),
    /// Relay nothing: every question in it was refused (and answered).
    Held,
}

impl Screen {
    pub fn new(
        engine: Arc<Engine>,
        upstream: Arc<Upstream>,
        mut answer_headers: HeaderMap,
        call: Option<AskingCall>,
        limits: LimitHits,
    ) -> Screen {
        let max_event = engine.config().upstream.max_event_bytes;
        answer_headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        answer_headers.insert(
            header::ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        Screen {
            engine,
            upstream,
            answer_headers,
            call,
            // A long-lived GET stream has no total: only one event is held at a time.
            decoder: SseDecoder::new(max_event, usize::MAX),
            json: None,
            max_event,
            limits,
        }
    }

    /// Screens a plain JSON body instead of an SSE stream: a server in JSON-response mode
    /// ends a call with -32042 in one.
    pub fn for_json(mut self) -> Screen {
        self.json = Some(BytesMut::new());
        self
    }

    /// The end of the upstream body: a gathered JSON body, reviewed (empty for SSE, whose
    /// events went out as they were completed).
    pub async fn finish(&mut self) -> Bytes {
        let Some(body) = self.json.take() else {
            return Bytes::new();
        };
        let Ok(text) = std::str::from_utf8(&body) else {
            return body.freeze();
        };
        match self.screen_event(text).await {
            Screened::Unchanged => body.freeze(),
            Screened::Rewritten(v) => Bytes::from(v.to_string()),
            Screened::Held => Bytes::new(),
        }
    }

    /// Feeds one chunk of the upstream body; returns what to relay to the client (possibly
    /// empty). An error ends the relay: an event over `upstream.max_event_bytes` (counted) or
    /// bytes that are not UTF-8.
    pub async fn feed(&mut self, chunk: &[u8]) -> Result<Bytes, SseError> {
        if let Some(body) = &mut self.json {
            if body.len() + chunk.len() > self.max_event {
                self.limits.hit(Limit::UpstreamMaxEventBytes);
                tracing::warn!(
                    "ended a passed-through legacy JSON response over upstream.max_event_bytes"
                );
                return Err(SseError::EventTooLarge {
                    limit: self.max_event,
                });
            }
            body.put_slice(chunk);
            return Ok(Bytes::new());
        }
        let mut events = Vec::new();
        if let Err(e) = self.decoder.feed(chunk, &mut events) {
            if matches!(e, SseError::EventTooLarge { .. }) {
                self.limits.hit(Limit::UpstreamMaxEventBytes);
            }
            tracing::warn!(error = %e, "ended a passed-through legacy stream");
            return Err(e);
        }
        let mut out = BytesMut::new();
        for ev in events {
            match self.screen_event(&ev.data).await {
                Screened::Unchanged => encode(&ev, &ev.data, &mut out),
                Screened::Rewritten(v) => encode(&ev, &v.to_string(), &mut out),
                Screened::Held => {
                    // The id still marks the client's place in the stream.
                    if ev.id.is_some() {
                        encode(&ev, "", &mut out);
                    }
                }
            }
        }
        Ok(out.freeze())
    }

    async fn screen_event(&self, data: &str) -> Screened {
        if data.is_empty() {
            return Screened::Unchanged;
        }
        let Ok(msg) = serde_json::from_str::<Value>(data) else {
            // What the gateway cannot read it cannot review; a client's more lenient JSON
            // reader (NaN, say) might read a question in it.
            tracing::warn!("held back a passed-through legacy event whose data is not JSON");
            return Screened::Held;
        };
        match msg {
            Value::Array(items) => {
                let mut kept = Vec::with_capacity(items.len());
                let mut changed = false;
                for item in items {
                    match self.screen_message(&item).await {
                        Screened::Unchanged => kept.push(item),
                        Screened::Rewritten(v) => {
                            changed = true;
                            kept.push(v);
                        }
                        Screened::Held => changed = true,
                    }
                }
                match (changed, kept.is_empty()) {
                    (false, _) => Screened::Unchanged,
                    (true, true) => Screened::Held,
                    (true, false) => Screened::Rewritten(Value::Array(kept)),
                }
            }
            msg => self.screen_message(&msg).await,
        }
    }

    /// Reviews one JSON-RPC message if it is a question, or an error whose `data` a client
    /// may show.
    async fn screen_message(&self, msg: &Value) -> Screened {
        if msg.pointer("/error/code").and_then(Value::as_i64)
            == Some(codes::LEGACY_URL_ELICITATION_REQUIRED)
        {
            return self.screen_url_required(msg);
        }
        if msg.get("error").is_some() {
            return self.screen_error_data(msg);
        }
        let (Some(method), Some(id)) = (msg.get("method").and_then(Value::as_str), msg.get("id"))
        else {
            return Screened::Unchanged;
        };
        let params = msg.get("params");
        let Some(kind) = kind_of(method, params) else {
            return Screened::Unchanged;
        };
        let (request, _) = to_input_request(method, params, kind);
        let cfg = self.engine.config();
        let stage = Stage {
            policy: &cfg.policy,
            metrics: self.engine.metrics.policy(),
        };
        let reviewed = match &self.call {
            Some(call) => stage.review(&call.method, call.name.as_deref(), kind, request),
            None => stage.review_unattributed(kind, request),
        };
        match reviewed {
            Ok(reviewed) => apply_rewrites(msg, kind, &reviewed),
            Err(refusal) => {
                self.answer(id, &refusal).await;
                Screened::Held
            }
        }
    }

    /// A legacy -32042 error carries URL elicitations for the client to open: each passes
    /// the stage. One refused turns the error into the one the MRTR path ends such a call with
    /// (-32603, `data.policyReason`, never the URL); otherwise the URLs are shown as judged.
    fn screen_url_required(&self, msg: &Value) -> Screened {
        let Some(list) = msg
            .pointer("/error/data/elicitations")
            .and_then(Value::as_array)
        else {
            return Screened::Unchanged;
        };
        let cfg = self.engine.config();
        let stage = Stage {
            policy: &cfg.policy,
            metrics: self.engine.metrics.policy(),
        };
        let mut shown = Vec::with_capacity(list.len());
        for e in list {
            let mut params = e.as_object().cloned().unwrap_or_default();
            params.insert("mode".into(), Value::from("url"));
            let params = Value::Object(params);
            let kind = InputKind::ElicitUrl;
            let (request, _) = to_input_request("elicitation/create", Some(&params), kind);
            let reviewed = match &self.call {
                Some(call) => stage.review(&call.method, call.name.as_deref(), kind, request),
                None => stage.review_unattributed(kind, request),
            };
            match reviewed {
                Ok(reviewed) => {
                    let mut e = e.clone();
                    if let (Some(slot), Some(url)) =
                        (e.get_mut("url"), reviewed.pointer("/params/url"))
                    {
                        *slot = url.clone();
                    }
                    shown.push(e);
                }
                Err(refusal) => {
                    let error = ErrorObject::new(
                        codes::INTERNAL_ERROR,
                        format!(
                            "the tool needs the user to open a URL that the gateway's policy refuses ({})",
                            refusal.detail
                        ),
                    )
                    .with_data(serde_json::json!({"policyReason": refusal.reason.as_str()}));
                    return Screened::Rewritten(error_response(msg.get("id"), &error));
                }
            }
        }
        if shown == *list {
            return Screened::Unchanged;
        }
        let mut msg = msg.clone();
        if let Some(slot) = msg.pointer_mut("/error/data/elicitations") {
            *slot = Value::Array(shown);
        }
        Screened::Rewritten(msg)
    }

    /// An error's `data` that carries a URL the policy refuses is dropped, as on the MRTR
    /// path (`policy.url.review_text`); the code and message go through.
    fn screen_error_data(&self, msg: &Value) -> Screened {
        if msg.pointer("/error/data").is_none() {
            return Screened::Unchanged;
        }
        let cfg = self.engine.config();
        let mut msg = msg.clone();
        let Some(refused) = msg
            .get_mut("error")
            .and_then(|err| crate::policy::text_urls::drop_unsafe_error_data(err, &cfg.policy.url))
        else {
            return Screened::Unchanged;
        };
        self.engine.metrics.policy().error_data_refused();
        tracing::warn!(
            call = self.call.as_ref().map_or("", |c| c.method.as_str()),
            reason = refused.refusal.reason(),
            url_host = refused.origin.as_ref().map_or("", |o| o.host.as_str()),
            "dropped a passed-through legacy error's data: it carries a URL the policy refuses"
        );
        Screened::Rewritten(msg)
    }

    /// Tells the legacy server what the MRTR path would tell it about a refused question.
    async fn answer(&self, id: &Value, refusal: &Refusal) {
        let body = match refusal.legacy_answer() {
            Ok(result) => result_response(id, result),
            Err(error) => error_response(Some(id), &error),
        };
        let Upstream::Http(http) = &*self.upstream else {
            return;
        };
        let timeout = self.engine.config().upstream.call_timeout;
        let sent = tokio::time::timeout(
            timeout,
            http.send(
                Method::POST,
                self.answer_headers.clone(),
                Some(Bytes::from(body.to_string())),
            ),
        )
        .await;
        match sent {
            Ok(Ok(resp)) if resp.status().is_success() => {}
            Ok(Ok(resp)) => tracing::warn!(
                status = %resp.status(),
                "the legacy server did not accept the answer to a question the policy refused"
            ),
            Ok(Err(e)) => tracing::warn!(
                error = %e,
                "could not answer a question the policy refused to the legacy server"
            ),
            Err(_) => tracing::warn!(
                "answering a question the policy refused timed out at upstream.call_timeout"
            ),
        }
    }
}

/// Carries what the stage rewrote (a normalised URL, a lowered `maxTokens`) back into the
/// legacy server's own message, leaving its other members as they were.
fn apply_rewrites(msg: &Value, kind: InputKind, reviewed: &Value) -> Screened {
    let field = match kind {
        InputKind::ElicitUrl => "url",
        InputKind::Sampling => "maxTokens",
        _ => return Screened::Unchanged,
    };
    let pointer = format!("/params/{field}");
    match (msg.pointer(&pointer), reviewed.pointer(&pointer)) {
        (Some(before), Some(after)) if before != after => {
            let mut msg = msg.clone();
            if let Some(slot) = msg.pointer_mut(&pointer) {
                *slot = after.clone();
            }
            Screened::Rewritten(msg)
        }
        _ => Screened::Unchanged,
    }
}

/// Writes one event in SSE framing (`data` omitted when empty, one `data:` line per line).
fn encode(ev: &SseEvent, data: &str, out: &mut BytesMut) {
    if let Some(id) = &ev.id {
        out.put_slice(format!("id: {id}\n").as_bytes());
    }
    if let Some(event) = &ev.event {
        out.put_slice(format!("event: {event}\n").as_bytes());
    }
    if let Some(retry) = ev.retry {
        out.put_slice(format!("retry: {retry}\n").as_bytes());
    }
    if !data.is_empty() {
        for line in data.split('\n') {
            out.put_slice(b"data: ");
            out.put_slice(line.as_bytes());
            out.put_slice(b"\n");
        }
    }
    out.put_slice(b"\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_asking_call_is_read_from_the_post() {
        let call = |b: &str| AskingCall::of_body(b.as_bytes());
        assert_eq!(
            call(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"where"}}"#),
            Some(AskingCall {
                method: "tools/call".into(),
                name: Some("where".into())
            })
        );
        assert_eq!(
            call(r#"{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"a://b"}}"#)
                .unwrap()
                .name
                .as_deref(),
            Some("a://b")
        );
        assert_eq!(call(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#), None);
        assert_eq!(
            call(r#"[{"jsonrpc":"2.0","id":1,"method":"tools/call"}]"#),
            None
        );
        assert_eq!(call("not json"), None);
    }

    #[test]
    fn events_are_reframed_with_their_fields() {
        let ev = SseEvent {
            event: Some("message".into()),
            data: "a\nb".into(),
            id: Some("7".into()),
            retry: Some(100),
        };
        let mut out = BytesMut::new();
        encode(&ev, &ev.data, &mut out);
        assert_eq!(
            &out[..],
            b"id: 7\nevent: message\nretry: 100\ndata: a\ndata: b\n\n"
        );
        let mut d = SseDecoder::new(1 << 20, usize::MAX);
        let mut back = Vec::new();
        d.feed(&out, &mut back).unwrap();
        assert_eq!(back, vec![ev]);
    }

    #[test]
    fn rewrites_touch_only_the_rewritten_member() {
        let msg = serde_json::json!({"jsonrpc":"2.0","id":3,"method":"sampling/createMessage",
            "params":{"messages":[],"maxTokens":1000000,"_meta":{"k":1}}});
        let reviewed = serde_json::json!({"method":"sampling/createMessage",
            "params":{"messages":[],"maxTokens":1024}});
        let Screened::Rewritten(v) = apply_rewrites(&msg, InputKind::Sampling, &reviewed) else {
            panic!("not rewritten")
        };
        assert_eq!(v["params"]["maxTokens"], 1024);
        assert_eq!(v["params"]["_meta"]["k"], 1);
        assert_eq!(v["id"], 3);
        assert!(matches!(
            apply_rewrites(&msg, InputKind::Roots, &reviewed),
            Screened::Unchanged
        ));
    }
}
