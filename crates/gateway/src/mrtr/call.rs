//! One modern request as the engine serves it ([`Call`]), where its notifications go
//! ([`Sink`]), and its params as the legacy server sees them.

use std::sync::{Arc, Mutex};

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value};
use tokio::sync::mpsc;

use crate::caller_scope::CallerScope;
use mrtr_wire::protocol::meta::RequestMeta;

/// One modern request, as the engine needs it.
#[derive(Clone)]
pub struct Call {
    pub id: Value,
    pub method: String,
    pub params: Value,
    pub meta: RequestMeta,
    pub principal: String,
    /// Whom this call's quotas count against (parked calls, single-use entries).
    pub caller: crate::caller_scope::Caller,
    /// Headers to send on every upstream request of this call (credentials, trace context).
    pub upstream_headers: http::HeaderMap,
    /// A digest of the credential forwarded upstream ("" when none is): part of the key
    /// under which warm sessions are shared.
    pub credential: String,
}

impl Call {
    /// Whom the legacy sessions of this call work for.
    pub fn scope(&self) -> CallerScope {
        CallerScope::new(self.principal.clone(), self.credential.clone())
    }

    /// The tool or prompt name, or the resource URI.
    pub fn target(&self) -> Option<&str> {
        let member = match self.method.as_str() {
            "resources/read" => "uri",
            _ => "name",
        };
        self.params.get(member).and_then(Value::as_str)
    }

    /// "tool \"x\"", "prompt \"y\"", "resource \"z\"" for messages.
    pub fn describe(&self) -> String {
        let what = match self.method.as_str() {
            "tools/call" => "tool",
            "prompts/get" => "prompt",
            "resources/read" => "resource",
            other => other,
        };
        format!("{what} {:?}", self.target().unwrap_or("?"))
    }
}

/// Where request-scoped notifications go: the client's SSE response, if it can take one.
pub struct Sink {
    to: To,
    /// The call goes on without the client: a notification it can no longer take is dropped.
    outlives_client: bool,
}

enum To {
    /// One request's response, for the call's whole life.
    Fixed(Option<mpsc::Sender<Value>>),
    /// Whichever request follows the call now (a call that may end its request early and be
    /// followed by its retries, see `mrtr::long_call`); none between two of them.
    Moving(Listener),
}

/// Which request's response a running call's notifications go to; shared by the call and the
/// requests that follow it.
#[derive(Clone, Default)]
pub(super) struct Listener(Arc<Mutex<Option<Follower>>>);

/// A request following a running call: its response, and the progress token it asked progress
/// under (the legacy server keeps using the first request's, so progress is re-addressed).
#[derive(Clone)]
struct Follower {
    tx: mpsc::Sender<Value>,
    progress_token: Option<Value>,
}

impl Listener {
    /// From now on, notifications go to `tx`, progress under `progress_token` (none: no
    /// progress); `None`: nowhere.
    pub(super) fn follow(&self, tx: Option<mpsc::Sender<Value>>, progress_token: Option<Value>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) =
            tx.map(|tx| Follower { tx, progress_token });
    }

    /// Notifications stop going to `tx`, if they still do.
    pub(super) fn stop_following(&self, tx: &mpsc::Sender<Value>) {
        let mut current = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if current.as_ref().is_some_and(|c| c.tx.same_channel(tx)) {
            *current = None;
        }
    }

    fn current(&self) -> Option<Follower> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// `msg` addressed to `follower`: a progress notification carries its progress token, or is
/// not for it at all.
fn readdressed(mut msg: Value, follower: &Follower) -> Option<Value> {
    if msg.get("method").and_then(Value::as_str) != Some("notifications/progress") {
        return Some(msg);
    }
    let token = follower.progress_token.clone()?;
    if let Some(params) = msg.get_mut("params").and_then(Value::as_object_mut) {
        params.insert("progressToken".into(), token);
    }
    Some(msg)
}

impl Sink {
    pub fn new(tx: Option<mpsc::Sender<Value>>) -> Sink {
        Sink {
            to: To::Fixed(tx),
            outlives_client: false,
        }
    }

    /// The same destination, for a call that must finish even if the client goes away (a
    /// claimed retry, see `mrtr::at_most_once`).
    pub fn outliving_client(&self) -> Sink {
        let to = match &self.to {
            To::Fixed(tx) => To::Fixed(tx.clone()),
            To::Moving(l) => To::Moving(l.clone()),
        };
        Sink {
            to,
            outlives_client: true,
        }
    }

    /// A sink whose notifications go where `listener` says; the call outlives its client.
    pub(super) fn moving(listener: Listener) -> Sink {
        Sink {
            to: To::Moving(listener),
            outlives_client: true,
        }
    }

    /// The response this sink writes to now, if any.
    pub(super) fn sender(&self) -> Option<mpsc::Sender<Value>> {
        match &self.to {
            To::Fixed(tx) => tx.clone(),
            To::Moving(l) => l.current().map(|f| f.tx),
        }
    }

    /// Sends a notification; `false` when the client has gone away (and the call should
    /// stop with it).
    pub(super) async fn send(&self, msg: Value) -> bool {
        let (tx, msg) = match &self.to {
            To::Fixed(tx) => (tx.clone(), Some(msg)),
            To::Moving(l) => match l.current() {
                Some(f) => {
                    let msg = readdressed(msg, &f);
                    (Some(f.tx), msg)
                }
                None => (None, None),
            },
        };
        match (tx, msg) {
            (Some(tx), Some(msg)) => tx.send(msg).await.is_ok() || self.outlives_client,
            _ => true,
        }
    }
}

/// The call's params as the legacy server should see them: no MRTR members, and of `_meta`
/// only what legacy servers understand (progress token, trace context). Serialized straight
/// from the call's params, so they are never copied; params that are not an object go as
/// `{}`.
pub(super) struct LegacyParams<'a>(pub &'a Value);

/// The `_meta` members a legacy server is given.
fn legacy_meta_key(key: &str) -> bool {
    matches!(
        key,
        "progressToken" | "traceparent" | "tracestate" | "baggage"
    )
}

impl Serialize for LegacyParams<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut out = s.serialize_map(None)?;
        for (key, value) in self.0.as_object().into_iter().flatten() {
            match (key.as_str(), value) {
                ("inputResponses" | "requestState", _) => {}
                ("_meta", Value::Object(meta)) => {
                    if meta.keys().any(|k| legacy_meta_key(k)) {
                        out.serialize_entry(key, &LegacyMeta(meta))?;
                    }
                }
                ("_meta", _) => {}
                _ => out.serialize_entry(key, value)?,
            }
        }
        out.end()
    }
}

struct LegacyMeta<'a>(&'a Map<String, Value>);

impl Serialize for LegacyMeta<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().filter(|(k, _)| legacy_meta_key(k)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_legacy_server_sees_no_round_members_and_only_the_meta_it_understands() {
        let modern = json!({
            "name": "echo",
            "arguments": {"text": "hi"},
            "inputResponses": {"k": {}},
            "requestState": "s",
            "_meta": {
                "progressToken": 7,
                "traceparent": "00-a-b-01",
                "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/protocolVersion": "2026-07-28"
            }
        });
        assert_eq!(
            serde_json::to_value(LegacyParams(&modern)).unwrap(),
            json!({
                "name": "echo",
                "arguments": {"text": "hi"},
                "_meta": {"progressToken": 7, "traceparent": "00-a-b-01"}
            })
        );
        // A `_meta` with nothing a legacy server understands goes away entirely, as does one
        // that is not an object; params that are not an object go as `{}`.
        let bare = json!({"name": "t", "_meta": {"io.modelcontextprotocol/protocolVersion": "x"}});
        assert_eq!(
            serde_json::to_value(LegacyParams(&bare)).unwrap(),
            json!({"name": "t"})
        );
        let odd = json!({"name": "t", "_meta": 3});
        assert_eq!(
            serde_json::to_value(LegacyParams(&odd)).unwrap(),
            json!({"name": "t"})
        );
        assert_eq!(
            serde_json::to_value(LegacyParams(&json!(null))).unwrap(),
            json!({})
        );
    }
}
