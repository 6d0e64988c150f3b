//! JSON-RPC 2.0 message shapes shared by both eras.
//!
//! The gateway keeps messages as `serde_json::Value` on the hot path (it forwards far more
//! than it interprets); this module holds the few typed pieces that every part needs: the
//! request id, error objects, and builders for the envelopes the gateway emits.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// A JSON-RPC request id: a string or an integer, never null.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RequestId {
    Int(i64),
    Str(String),
}

impl RequestId {
    /// Reads an id from a JSON value; `None` for null, floats, objects and the like.
    pub fn from_value(v: &Value) -> Option<RequestId> {
        match v {
            Value::String(s) => Some(RequestId::Str(s.clone())),
            Value::Number(n) => n.as_i64().map(RequestId::Int),
            _ => None,
        }
    }

    pub fn to_value(&self) -> Value {
        match self {
            RequestId::Int(i) => Value::from(*i),
            RequestId::Str(s) => Value::from(s.as_str()),
        }
    }
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestId::Int(i) => write!(f, "{i}"),
            RequestId::Str(s) => write!(f, "{s:?}"),
        }
    }
}

/// The `error` member of a JSON-RPC error response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorObject {
    pub code: i64,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl ErrorObject {
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        ErrorObject {
            code,
            message: message.into(),
            data: None,
        }
    }

    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }
}

/// Standard and MCP-defined error codes.
pub mod codes {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL_ERROR: i64 = -32603;
    /// Legacy (2025-11-25 and earlier) "resource not found"; never emitted on the modern side.
    pub const LEGACY_RESOURCE_NOT_FOUND: i64 = -32002;
    /// Legacy 2025-11-25 "URL elicitation required"; never emitted on the modern side.
    pub const LEGACY_URL_ELICITATION_REQUIRED: i64 = -32042;
    pub const HEADER_MISMATCH: i64 = -32020;
    pub const MISSING_REQUIRED_CLIENT_CAPABILITY: i64 = -32021;
    pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;
}

/// `{"jsonrpc":"2.0","id":…,"result":…}`. Built member by member: `json!` would copy the
/// result (it converts each value it is given), and a result can be large.
pub fn result_response(id: &Value, result: Value) -> Value {
    let mut m = Map::new();
    m.insert("jsonrpc".into(), Value::from("2.0"));
    m.insert("id".into(), id.clone());
    m.insert("result".into(), result);
    Value::Object(m)
}

/// A result response to send, borrowing its id and result: answering needs its bytes only,
/// not a tree holding (a copy of) the result.
#[derive(Debug, Serialize)]
pub struct OutgoingResult<'a> {
    jsonrpc: &'static str,
    id: &'a Value,
    result: &'a Value,
}

impl<'a> OutgoingResult<'a> {
    pub fn new(id: &'a Value, result: &'a Value) -> OutgoingResult<'a> {
        OutgoingResult {
            jsonrpc: "2.0",
            id,
            result,
        }
    }
}

/// `{"jsonrpc":"2.0","id":…,"error":…}`; `id` is `null` when the request id was unreadable.
pub fn error_response(id: Option<&Value>, error: &ErrorObject) -> Value {
    json!({"jsonrpc": "2.0", "id": id.cloned().unwrap_or(Value::Null), "error": error})
}

/// A request to send, borrowing its params: it is only ever serialized, so the params need
/// not be copied into a tree of their own.
#[derive(Debug, Serialize)]
pub struct OutgoingRequest<'a, P: Serialize + ?Sized = Value> {
    jsonrpc: &'static str,
    id: i64,
    method: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    params: Option<&'a P>,
}

impl<'a, P: Serialize + ?Sized> OutgoingRequest<'a, P> {
    pub fn new(id: i64, method: &'a str, params: Option<&'a P>) -> OutgoingRequest<'a, P> {
        OutgoingRequest {
            jsonrpc: "2.0",
            id,
            method,
            params,
        }
    }
}

pub fn notification(method: &str, params: Option<Value>) -> Value {
    let mut m = Map::new();
    m.insert("jsonrpc".into(), Value::from("2.0"));
    m.insert("method".into(), Value::from(method));
    if let Some(p) = params {
        m.insert("params".into(), p);
    }
    Value::Object(m)
}

/// What a JSON-RPC message is, judged by its members.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageKind {
    Request,
    Notification,
    Response,
    Invalid,
}

pub fn classify(msg: &Value) -> MessageKind {
    let Some(obj) = msg.as_object() else {
        return MessageKind::Invalid;
    };
    let has_method = obj.get("method").is_some_and(Value::is_string);
    let has_id = obj.get("id").is_some_and(|v| !v.is_null());
    if has_method {
        if has_id {
            MessageKind::Request
        } else {
            MessageKind::Notification
        }
    } else if obj.contains_key("result") || obj.contains_key("error") {
        MessageKind::Response
    } else {
        MessageKind::Invalid
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outgoing_request_is_the_request_it_borrows_from() {
        let params = json!({"name": "echo", "arguments": {"text": "hi"}});
        let sent =
            serde_json::to_value(OutgoingRequest::new(3, "tools/call", Some(&params))).unwrap();
        assert_eq!(
            sent,
            json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": params})
        );
        // Without params the member is absent, not null.
        let bare = serde_json::to_value(OutgoingRequest::<Value>::new(4, "ping", None)).unwrap();
        assert_eq!(bare, json!({"jsonrpc": "2.0", "id": 4, "method": "ping"}));
    }

    #[test]
    fn a_borrowed_result_response_is_the_response_built_from_it() {
        let (id, result) = (
            json!("r-1"),
            json!({"content": [], "resultType": "complete"}),
        );
        let borrowed = serde_json::to_value(OutgoingResult::new(&id, &result)).unwrap();
        assert_eq!(borrowed, result_response(&id, result.clone()));
        assert_eq!(
            borrowed,
            json!({"jsonrpc": "2.0", "id": "r-1", "result": result})
        );
    }

    #[test]
    fn ids_accept_strings_and_integers_only() {
        assert_eq!(RequestId::from_value(&json!(7)), Some(RequestId::Int(7)));
        assert_eq!(
            RequestId::from_value(&json!("a")),
            Some(RequestId::Str("a".into()))
        );
        assert_eq!(RequestId::from_value(&json!(null)), None);
        assert_eq!(RequestId::from_value(&json!(1.5)), None);
        assert_eq!(RequestId::from_value(&json!({})), None);
    }

    #[test]
    fn classify_tells_the_four_kinds_apart() {
        assert_eq!(
            classify(&json!({"jsonrpc":"2.0","id":1,"method":"x"})),
            MessageKind::Request
        );
        assert_eq!(
            classify(&json!({"jsonrpc":"2.0","method":"x"})),
            MessageKind::Notification
        );
        assert_eq!(
            classify(&json!({"jsonrpc":"2.0","id":1,"result":{}})),
            MessageKind::Response
        );
        assert_eq!(classify(&json!([1])), MessageKind::Invalid);
    }
}
