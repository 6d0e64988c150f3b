//! One modern request as the engine serves it ([`Call`]), where its notifications go
//! ([`Sink`]), and its params as the legacy server sees them.

use serde_json::{Map, Value};
use tokio::sync::mpsc;

use crate::caller_scope::CallerScope;
use mrtr_wire::protocol::meta::RequestMeta;

/// One modern request, as the engine needs it.
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
    tx: Option<mpsc::Sender<Value>>,
    /// The call goes on without the client: a notification it can no longer take is dropped.
    outlives_client: bool,
}

impl Sink {
    pub fn new(tx: Option<mpsc::Sender<Value>>) -> Sink {
        Sink {
            tx,
            outlives_client: false,
        }
    }

    /// The same destination, for a call that must finish even if the client goes away (a
    /// claimed retry, see `mrtr::at_most_once`).
    pub fn outliving_client(&self) -> Sink {
        Sink {
            tx: self.tx.clone(),
            outlives_client: true,
        }
    }

    /// Sends a notification; `false` when the client has gone away (and the call should
    /// stop with it).
    pub(super) async fn send(&self, msg: Value) -> bool {
        match &self.tx {
            Some(tx) => tx.send(msg).await.is_ok() || self.outlives_client,
            None => true,
        }
    }
}

/// The call's params as the legacy server should see them: no MRTR members, and of `_meta`
/// only what legacy servers understand (progress token, trace context).
pub(super) fn legacy_params(params: &Value) -> Value {
    let mut p = params.as_object().cloned().unwrap_or_default();
    p.remove("inputResponses");
    p.remove("requestState");
    if let Some(Value::Object(meta)) = p.remove("_meta") {
        let kept: Map<String, Value> = meta
            .into_iter()
            .filter(|(k, _)| {
                matches!(
                    k.as_str(),
                    "progressToken" | "traceparent" | "tracestate" | "baggage"
                )
            })
            .collect();
        if !kept.is_empty() {
            p.insert("_meta".into(), Value::Object(kept));
        }
    }
    Value::Object(p)
}
