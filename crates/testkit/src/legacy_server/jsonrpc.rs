//! JSON-RPC 2.0 pieces: the error type handlers return, classification of
//! incoming messages, and builders for outgoing responses.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// A JSON-RPC error object (`code`, `message`, optional `data`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl RpcError {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL_ERROR: i64 = -32603;
    /// Used in HTTP 404 bodies for unknown/expired sessions.
    pub const SESSION_NOT_FOUND: i64 = -32001;
    /// A server→client request could not be sent or was not answered.
    pub const SERVER_REQUEST_FAILED: i64 = -32002;
    /// The call was cancelled (only sent when a response is required).
    pub const REQUEST_CANCELLED: i64 = -32800;

    pub fn new(code: i64, message: impl Into<String>) -> Self {
        RpcError {
            code,
            message: message.into(),
            data: None,
        }
    }

    #[must_use]
    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }

    pub fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(Self::INVALID_PARAMS, message)
    }

    pub fn method_not_found(method: &str) -> Self {
        Self::new(
            Self::METHOD_NOT_FOUND,
            format!("Method not found: {method}"),
        )
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Self::INTERNAL_ERROR, message)
    }

    pub fn server_request_failed(message: impl Into<String>) -> Self {
        Self::new(Self::SERVER_REQUEST_FAILED, message)
    }

    /// Parse an `error` object received from the peer; tolerant of missing fields.
    pub(crate) fn from_value(v: &Value) -> Self {
        RpcError {
            code: v.get("code").and_then(Value::as_i64).unwrap_or(0),
            message: v
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            data: v.get("data").cloned(),
        }
    }
}

impl fmt::Display for RpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JSON-RPC error {}: {}", self.code, self.message)
    }
}

impl std::error::Error for RpcError {}

/// One incoming JSON-RPC message, by shape.
#[derive(Debug)]
pub(crate) enum Message {
    Request {
        id: Value,
        method: String,
        params: Value,
    },
    Notification {
        method: String,
        params: Value,
    },
    Response {
        id: Value,
        outcome: Result<Value, RpcError>,
    },
}

impl Message {
    pub(crate) fn classify(v: &Value) -> Result<Message, RpcError> {
        let obj = v
            .as_object()
            .ok_or_else(|| RpcError::new(RpcError::INVALID_REQUEST, "message is not an object"))?;
        if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return Err(RpcError::new(
                RpcError::INVALID_REQUEST,
                "missing or wrong \"jsonrpc\" version",
            ));
        }
        let params = obj.get("params").cloned().unwrap_or(Value::Null);
        match (obj.get("method"), obj.get("id")) {
            (Some(Value::String(method)), Some(id)) if valid_id(id) => Ok(Message::Request {
                id: id.clone(),
                method: method.clone(),
                params,
            }),
            (Some(Value::String(method)), None) => Ok(Message::Notification {
                method: method.clone(),
                params,
            }),
            (None, Some(id)) => {
                let outcome = match (obj.get("result"), obj.get("error")) {
                    (Some(result), None) => Ok(result.clone()),
                    (None, Some(error)) => Err(RpcError::from_value(error)),
                    _ => {
                        return Err(RpcError::new(
                            RpcError::INVALID_REQUEST,
                            "a response needs exactly one of result/error",
                        ));
                    }
                };
                Ok(Message::Response {
                    id: id.clone(),
                    outcome,
                })
            }
            _ => Err(RpcError::new(
                RpcError::INVALID_REQUEST,
                "not a JSON-RPC request, notification or response",
            )),
        }
    }
}

fn valid_id(id: &Value) -> bool {
    matches!(id, Value::String(_)) || id.as_i64().is_some() || id.as_u64().is_some()
}

/// A map key for a JSON-RPC id that keeps `1` and `"1"` apart.
pub(crate) fn id_key(id: &Value) -> String {
    id.to_string()
}

pub(crate) fn response(id: &Value, outcome: &Result<Value, RpcError>) -> Value {
    match outcome {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err(error) => error_response(id, error),
    }
}

pub(crate) fn error_response(id: &Value, error: &RpcError) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": error})
}

/// A request or notification sent by the server; `params` is omitted when null.
pub(crate) fn outgoing(id: Option<&Value>, method: &str, params: Value) -> Value {
    let mut m = Map::with_capacity(4);
    m.insert("jsonrpc".into(), "2.0".into());
    if let Some(id) = id {
        m.insert("id".into(), id.clone());
    }
    m.insert("method".into(), method.into());
    if !params.is_null() {
        m.insert("params".into(), params);
    }
    Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_all_shapes() {
        let req = json!({"jsonrpc":"2.0","id":7,"method":"ping"});
        assert!(matches!(Message::classify(&req), Ok(Message::Request { id, .. }) if id == 7));
        let note = json!({"jsonrpc":"2.0","method":"notifications/initialized"});
        assert!(matches!(
            Message::classify(&note),
            Ok(Message::Notification { .. })
        ));
        let ok = json!({"jsonrpc":"2.0","id":"a","result":{}});
        assert!(matches!(
            Message::classify(&ok),
            Ok(Message::Response { outcome: Ok(_), .. })
        ));
        let err = json!({"jsonrpc":"2.0","id":1,"error":{"code":-1,"message":"no"}});
        match Message::classify(&err) {
            Ok(Message::Response {
                outcome: Err(e), ..
            }) => {
                assert_eq!(e.code, -1);
                assert_eq!(e.message, "no");
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(Message::classify(&json!({"id":1,"method":"x"})).is_err());
        assert!(Message::classify(&json!({"jsonrpc":"2.0","id":1.5,"method":"x"})).is_err());
        assert!(Message::classify(&json!([1])).is_err());
    }

    #[test]
    fn id_keys_distinguish_types() {
        assert_ne!(id_key(&json!(1)), id_key(&json!("1")));
        assert_eq!(id_key(&json!(1)), id_key(&json!(1)));
    }

    #[test]
    fn outgoing_omits_null_params() {
        let v = outgoing(Some(&json!(3)), "ping", Value::Null);
        assert_eq!(v, json!({"jsonrpc":"2.0","id":3,"method":"ping"}));
    }
}
