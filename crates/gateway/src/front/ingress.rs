//! Reading and validating an incoming POST body, in the order the spec gives.
//!
//! 1. JSON syntax (-32700), then the JSON-RPC envelope (-32600): one object, `jsonrpc: "2.0"`,
//!    a string `method`, an id that is a string or an integer (no id: a notification).
//! 2. Headers against the body (-32020, HTTP 400): `MCP-Protocol-Version` present and equal
//!    to `_meta` protocolVersion (when the body has one), `Mcp-Method` equal to `method`,
//!    `Mcp-Name` (base64 sentinel decoded) equal to `params.name` / `params.uri` for
//!    `tools/call`, `prompts/get`, `resources/read`. A routing header given twice, or with
//!    bytes that are not visible ASCII, is a mismatch too.
//! 3. The version (-32022, HTTP 400, with `supported` and `requested`).
//! 4. The required `_meta` members (-32602, HTTP 400).
//!
//! Headers come before the version so that a client that disagrees with itself is told so,
//! rather than told that one of its two values is unsupported.

use http::{HeaderMap, HeaderName};
use serde_json::Value;

use crate::error::{Rejection, RejectionKind};
use mrtr_wire::protocol::meta::{self, PROTOCOL_VERSION, RequestMeta};
use mrtr_wire::protocol::methods::name_param;
use mrtr_wire::protocol::{SUPPORTED_VERSIONS, header_value};

pub const MCP_PROTOCOL_VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");
pub const MCP_METHOD: HeaderName = HeaderName::from_static("mcp-method");
pub const MCP_NAME: HeaderName = HeaderName::from_static("mcp-name");

/// A readable JSON-RPC request.
#[derive(Debug, Clone)]
pub struct Envelope {
    pub id: Value,
    pub method: String,
    pub params: Option<Value>,
}

#[derive(Debug)]
pub enum Parsed {
    Request(Envelope),
    /// A notification: accepted (202) and ignored; 2026-07-28 defines none from client to server.
    Notification,
}

/// A refusal, with the request id when it could be read (boxed: it is the rare path).
pub type Refusal = Box<(Option<Value>, Rejection)>;

fn refusal(id: Option<Value>, rej: Rejection) -> Refusal {
    Box::new((id, rej))
}

pub fn parse_envelope(body: &[u8]) -> Result<Parsed, Refusal> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        refusal(
            None,
            Rejection::parse_error(format!("the body is not valid JSON: {e}")),
        )
    })?;
    let mut obj = match v {
        Value::Object(o) => o,
        Value::Array(_) => {
            return Err(refusal(
                None,
                Rejection::invalid_request("JSON-RPC batches are not supported"),
            ));
        }
        _ => {
            return Err(refusal(
                None,
                Rejection::invalid_request("the body must be a JSON-RPC object"),
            ));
        }
    };
    let id = match obj.get("id") {
        None => None,
        Some(v @ Value::String(_)) => Some(v.clone()),
        Some(v @ Value::Number(n)) if n.is_i64() || n.is_u64() => Some(v.clone()),
        Some(_) => {
            return Err(refusal(
                None,
                Rejection::invalid_request("the id must be a string or an integer"),
            ));
        }
    };
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(refusal(
            id,
            Rejection::invalid_request("jsonrpc must be \"2.0\""),
        ));
    }
    let Some(Value::String(method)) = obj.remove("method") else {
        if obj.contains_key("result") || obj.contains_key("error") {
            return Err(refusal(
                id,
                Rejection::invalid_request("clients do not send JSON-RPC responses in 2026-07-28"),
            ));
        }
        return Err(refusal(
            id,
            Rejection::invalid_request("a request needs a string method"),
        ));
    };
    // Taken, not copied: the params are the largest part of a request.
    let params = obj.remove("params");
    if params.as_ref().is_some_and(|p| !p.is_object()) {
        return Err(refusal(
            id,
            Rejection::new(RejectionKind::InvalidParams, "params must be an object"),
        ));
    }
    match id {
        None => Ok(Parsed::Notification),
        Some(id) => Ok(Parsed::Request(Envelope { id, method, params })),
    }
}

/// The one value of a routing header; `Ok(None)` when absent.
fn single(headers: &HeaderMap, name: &HeaderName) -> Result<Option<String>, Rejection> {
    let mut values = headers.get_all(name).iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(Rejection::header_mismatch(format!(
            "the {name} header is given more than once"
        )));
    }
    let text = first.to_str().map_err(|_| {
        Rejection::header_mismatch(format!("the {name} header has invalid characters"))
    })?;
    Ok(Some(text.to_string()))
}

/// Step 2: headers against the body.
pub fn check_headers(headers: &HeaderMap, env: &Envelope) -> Result<String, Rejection> {
    let version = single(headers, &MCP_PROTOCOL_VERSION)?
        .ok_or_else(|| Rejection::header_mismatch("the MCP-Protocol-Version header is required"))?;
    let body_version = env
        .params
        .as_ref()
        .and_then(|p| p.get("_meta"))
        .and_then(|m| m.get(PROTOCOL_VERSION));
    if let Some(bv) = body_version
        && bv.as_str() != Some(version.as_str())
    {
        return Err(Rejection::header_mismatch(format!(
            "MCP-Protocol-Version header {version:?} does not match _meta {PROTOCOL_VERSION} {bv}"
        )));
    }
    let method = single(headers, &MCP_METHOD)?
        .ok_or_else(|| Rejection::header_mismatch("the Mcp-Method header is required"))?;
    if method != env.method {
        return Err(Rejection::header_mismatch(format!(
            "Mcp-Method header {method:?} does not match the body's method {:?}",
            env.method
        )));
    }
    if let Some(member) = name_param(&env.method) {
        let raw = single(headers, &MCP_NAME)?.ok_or_else(|| {
            Rejection::header_mismatch(format!(
                "the Mcp-Name header is required for {}",
                env.method
            ))
        })?;
        let decoded = header_value::decode(&raw).ok_or_else(|| {
            Rejection::header_mismatch("the Mcp-Name header has a malformed base64 value")
        })?;
        let body_name = env
            .params
            .as_ref()
            .and_then(|p| p.get(member))
            .and_then(Value::as_str);
        if let Some(body_name) = body_name
            && body_name != decoded
        {
            return Err(Rejection::header_mismatch(format!(
                "Mcp-Name header {decoded:?} does not match params.{member} {body_name:?}"
            )));
        }
    }
    Ok(version)
}

/// Step 3: the version.
pub fn check_version(version: &str) -> Result<(), Rejection> {
    if SUPPORTED_VERSIONS.contains(&version) {
        Ok(())
    } else {
        Err(Rejection::unsupported_version(version, SUPPORTED_VERSIONS))
    }
}

/// Step 4: `_meta`.
pub fn check_meta(env: &Envelope) -> Result<RequestMeta, Rejection> {
    meta::parse(env.params.as_ref()).map_err(|e| Rejection::new(RejectionKind::MissingMeta, e.0))
}

/// Steps 2–4 in order.
pub fn validate(headers: &HeaderMap, env: &Envelope) -> Result<RequestMeta, Rejection> {
    let version = check_headers(headers, env)?;
    check_version(&version)?;
    check_meta(env)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::front::error_map::answer;
    use mrtr_wire::jsonrpc::codes;
    use serde_json::json;

    fn env(method: &str, params: Value) -> Envelope {
        Envelope {
            id: json!(1),
            method: method.into(),
            params: Some(params),
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    fn meta(version: &str) -> Value {
        json!({PROTOCOL_VERSION: version, "io.modelcontextprotocol/clientCapabilities": {}})
    }

    fn code(r: Result<RequestMeta, Rejection>) -> i64 {
        answer(&r.unwrap_err()).error.code
    }

    #[test]
    fn valid_request_passes() {
        let e = env(
            "tools/call",
            json!({"name":"héllo","_meta": meta("2026-07-28")}),
        );
        let h = headers(&[
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", &header_value::encode("héllo")),
        ]);
        assert!(validate(&h, &e).is_ok());
    }

    #[test]
    fn the_order_is_headers_then_version_then_meta() {
        // Everything wrong at once: the header mismatch wins.
        let e = env(
            "tools/call",
            json!({"name":"t","_meta": {PROTOCOL_VERSION: "1900-01-01"}}),
        );
        let h = headers(&[
            ("mcp-protocol-version", "1901-01-01"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "t"),
        ]);
        assert_eq!(code(validate(&h, &e)), codes::HEADER_MISMATCH);
        // Consistent but unsupported version, and _meta incomplete: the version wins.
        let e = env(
            "tools/call",
            json!({"name":"t","_meta": {PROTOCOL_VERSION: "1900-01-01"}}),
        );
        let h = headers(&[
            ("mcp-protocol-version", "1900-01-01"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "t"),
        ]);
        let r = answer(&validate(&h, &e).unwrap_err());
        assert_eq!(r.error.code, codes::UNSUPPORTED_PROTOCOL_VERSION);
        assert_eq!(
            r.error.data,
            Some(json!({"supported":["2026-07-28"],"requested":"1900-01-01"}))
        );
        // Supported version, _meta incomplete: -32602.
        let e = env(
            "tools/call",
            json!({"name":"t","_meta": {PROTOCOL_VERSION: "2026-07-28"}}),
        );
        let h = headers(&[
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "t"),
        ]);
        assert_eq!(code(validate(&h, &e)), codes::INVALID_PARAMS);
    }

    #[test]
    fn each_header_rule() {
        let e = env(
            "tools/call",
            json!({"name":"t","_meta": meta("2026-07-28")}),
        );
        let full = [
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "t"),
        ];
        for skip in 0..3 {
            let partial: Vec<_> = full
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != skip)
                .map(|(_, p)| *p)
                .collect();
            assert_eq!(
                code(validate(&headers(&partial), &e)),
                codes::HEADER_MISMATCH,
                "without {:?}",
                full[skip]
            );
        }
        let wrong_method = [
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/list"),
            ("mcp-name", "t"),
        ];
        assert_eq!(
            code(validate(&headers(&wrong_method), &e)),
            codes::HEADER_MISMATCH
        );
        let wrong_name = [
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "u"),
        ];
        assert_eq!(
            code(validate(&headers(&wrong_name), &e)),
            codes::HEADER_MISMATCH
        );
        let twice = [
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "t"),
        ];
        assert_eq!(code(validate(&headers(&twice), &e)), codes::HEADER_MISMATCH);
        let bad_b64 = [
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "=?base64?%%?="),
        ];
        assert_eq!(
            code(validate(&headers(&bad_b64), &e)),
            codes::HEADER_MISMATCH
        );
        // tools/list needs no Mcp-Name.
        let l = env("tools/list", json!({"_meta": meta("2026-07-28")}));
        let h = headers(&[
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/list"),
        ]);
        assert!(validate(&h, &l).is_ok());
    }

    #[test]
    fn envelope_errors() {
        assert_eq!(
            answer(&parse_envelope(b"{").unwrap_err().1).error.code,
            codes::PARSE_ERROR
        );
        assert_eq!(
            answer(&parse_envelope(b"[]").unwrap_err().1).error.code,
            codes::INVALID_REQUEST
        );
        let (id, r) = *parse_envelope(br#"{"jsonrpc":"1.0","id":7,"method":"x"}"#).unwrap_err();
        assert_eq!(
            (id, answer(&r).error.code),
            (Some(json!(7)), codes::INVALID_REQUEST)
        );
        assert_eq!(
            answer(
                &parse_envelope(br#"{"jsonrpc":"2.0","id":null,"method":"x"}"#)
                    .unwrap_err()
                    .1
            )
            .error
            .code,
            codes::INVALID_REQUEST
        );
        assert_eq!(
            answer(
                &parse_envelope(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#)
                    .unwrap_err()
                    .1
            )
            .error
            .code,
            codes::INVALID_REQUEST
        );
        assert!(matches!(
            parse_envelope(br#"{"jsonrpc":"2.0","method":"x"}"#),
            Ok(Parsed::Notification)
        ));
        assert!(matches!(
            parse_envelope(br#"{"jsonrpc":"2.0","id":"a","method":"x"}"#),
            Ok(Parsed::Request(_))
        ));
    }
}
