//! JSON-RPC payloads as every legacy transport carries them: one SSE `data`, one stdout
//! line or one HTTP body holds a message or (2025-03-26 and older) a batch of them.

use bytes::Bytes;
use serde_json::Value;

/// Parses one payload into messages (a batch yields several).
pub fn messages_of(text: &str) -> Result<Vec<Value>, String> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Array(items)) => Ok(items),
        Ok(v @ Value::Object(_)) => Ok(vec![v]),
        Ok(other) => Err(format!(
            "the legacy server sent JSON that is not a JSON-RPC message: {}",
            excerpt(&other.to_string(), 120)
        )),
        Err(e) => Err(format!("the legacy server sent malformed JSON: {e}")),
    }
}

/// Whether `msg` is the response (result or error, not a request) to the request `id`.
pub fn is_response_to(msg: &Value, id: i64) -> bool {
    msg.get("method").is_none()
        && (msg.get("result").is_some() || msg.get("error").is_some())
        && msg.get("id").and_then(Value::as_i64) == Some(id)
}

/// The id of a response (no `method`) when it is one of the gateway's integer ids.
pub fn response_id(msg: &Value) -> Option<i64> {
    if msg.get("method").is_some() {
        return None;
    }
    msg.get("id").and_then(Value::as_i64)
}

/// Whether `msg` is a request (it has both a `method` and an `id`).
pub fn is_request(msg: &Value) -> bool {
    msg.get("method").is_some() && msg.get("id").is_some()
}

/// The `method` of a request or notification.
pub fn method_of(msg: &Value) -> Option<&str> {
    msg.get("method").and_then(Value::as_str)
}

pub fn to_bytes(v: &impl serde::Serialize) -> Bytes {
    Bytes::from(serde_json::to_vec(v).expect("JSON values serialize"))
}

/// At most `n` bytes of `s` (cut at a character boundary), for error messages.
pub fn excerpt(s: &str, n: usize) -> String {
    if s.len() <= n {
        return s.to_string();
    }
    let mut end = n;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn payloads_and_responses() {
        assert_eq!(messages_of(r#"[{"a":1},{"b":2}]"#).unwrap().len(), 2);
        assert!(messages_of("42").is_err());
        assert!(messages_of("{").is_err());
        let reply = json!({"jsonrpc": "2.0", "id": 3, "result": {}});
        let ask = json!({"jsonrpc": "2.0", "id": 3, "method": "roots/list"});
        assert!(is_response_to(&reply, 3) && !is_response_to(&ask, 3));
        assert_eq!(response_id(&ask), None);
        assert_eq!(excerpt("héllo", 2), "h…");
    }
}
