//! The per-request `params._meta` of a modern request.

use serde_json::Value;

pub const PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
pub const CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
pub const CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
pub const LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";
pub const SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
pub const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";
pub const PROGRESS_TOKEN: &str = "progressToken";
/// The gateway's own `_meta` key a legacy server may set on a server request to name it.
pub const INPUT_KEY_HINT: &str = "io.mrtr-gateway/inputKey";

/// Logging levels, lowest first (RFC 5424 order as MCP uses it).
pub const LOG_LEVELS: &[&str] = &[
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
];

pub fn log_level_rank(level: &str) -> Option<usize> {
    LOG_LEVELS.iter().position(|l| *l == level)
}

/// The validated request metadata.
#[derive(Debug, Clone)]
pub struct RequestMeta {
    pub protocol_version: String,
    pub client_capabilities: Value,
    pub client_info: Option<Value>,
    /// Minimum level of `notifications/message` the client wants; `None` means none at all.
    pub log_level: Option<String>,
    pub progress_token: Option<Value>,
}

/// Why `_meta` was refused (always -32602 / HTTP 400).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaError(pub String);

/// Reads `params._meta`; the required members must be present and well typed.
pub fn parse(params: Option<&Value>) -> Result<RequestMeta, MetaError> {
    let meta = params
        .and_then(|p| p.get("_meta"))
        .and_then(Value::as_object)
        .ok_or_else(|| {
            MetaError(format!(
                "params._meta is required and must carry {PROTOCOL_VERSION} and {CLIENT_CAPABILITIES}"
            ))
        })?;
    let protocol_version = match meta.get(PROTOCOL_VERSION) {
        Some(Value::String(s)) => s.clone(),
        Some(_) => {
            return Err(MetaError(format!(
                "_meta {PROTOCOL_VERSION} must be a string"
            )));
        }
        None => {
            return Err(MetaError(format!(
                "_meta is missing the required {PROTOCOL_VERSION}"
            )));
        }
    };
    let client_capabilities = match meta.get(CLIENT_CAPABILITIES) {
        Some(v @ Value::Object(_)) => v.clone(),
        Some(_) => {
            return Err(MetaError(format!(
                "_meta {CLIENT_CAPABILITIES} must be an object"
            )));
        }
        None => {
            return Err(MetaError(format!(
                "_meta is missing the required {CLIENT_CAPABILITIES}"
            )));
        }
    };
    let log_level = match meta.get(LOG_LEVEL) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if log_level_rank(s).is_some() => Some(s.clone()),
        Some(other) => {
            return Err(MetaError(format!(
                "_meta {LOG_LEVEL} must be one of {LOG_LEVELS:?}, got {other}"
            )));
        }
    };
    let progress_token = match meta.get(PROGRESS_TOKEN) {
        None | Some(Value::Null) => None,
        Some(v @ (Value::String(_) | Value::Number(_))) => Some(v.clone()),
        Some(_) => {
            return Err(MetaError(
                "_meta progressToken must be a string or an integer".into(),
            ));
        }
    };
    Ok(RequestMeta {
        protocol_version,
        client_capabilities,
        client_info: meta.get(CLIENT_INFO).cloned(),
        log_level,
        progress_token,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn required_members_and_types() {
        let ok = json!({"_meta": {PROTOCOL_VERSION: "2026-07-28", CLIENT_CAPABILITIES: {}, LOG_LEVEL: "info", "progressToken": 3}});
        let m = parse(Some(&ok)).unwrap();
        assert_eq!(m.log_level.as_deref(), Some("info"));
        assert_eq!(m.progress_token, Some(json!(3)));
        assert!(parse(None).is_err());
        assert!(parse(Some(&json!({}))).is_err());
        assert!(parse(Some(&json!({"_meta": {PROTOCOL_VERSION: "2026-07-28"}}))).is_err());
        assert!(parse(Some(&json!({"_meta": {CLIENT_CAPABILITIES: {}}}))).is_err());
        assert!(
            parse(Some(
                &json!({"_meta": {PROTOCOL_VERSION: 1, CLIENT_CAPABILITIES: {}}})
            ))
            .is_err()
        );
        assert!(parse(Some(&json!({"_meta": {PROTOCOL_VERSION: "x", CLIENT_CAPABILITIES: {}, LOG_LEVEL: "loud"}}))).is_err());
    }
}
