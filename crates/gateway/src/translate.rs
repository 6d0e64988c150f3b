//! Shaping legacy results and errors into their 2026-07-28 form.
//!
//! - every result gets `resultType` and `_meta["io.modelcontextprotocol/serverInfo"]`;
//! - cacheable results (lists, `resources/read`, discover) get `ttlMs` and `cacheScope`; a
//!   result reached through an MRTR retry is never cacheable (`ttlMs: 0`, private);
//! - legacy error -32002 (resource not found) becomes -32602 with `data.uri`;
//! - codes from the spec-reserved range -32020…-32099 that mean something else in the legacy
//!   era (such as -32042) are never passed through as-is.

use serde_json::{Map, Value, json};

use crate::config::{CacheHint, CacheScope};
use crate::error::{Rejection, RejectionKind};
use mrtr_wire::jsonrpc::{ErrorObject, codes};
use mrtr_wire::protocol::meta::SERVER_INFO;

/// The identity the gateway presents: the legacy server's own `serverInfo`, or the gateway's.
/// Borrowed: a call stamps it into its result, the one copy it needs.
pub fn server_info(init_result: Option<&Value>) -> &Value {
    static GATEWAY: std::sync::LazyLock<Value> = std::sync::LazyLock::new(
        || json!({"name": "mrtr-gateway", "version": env!("CARGO_PKG_VERSION")}),
    );
    init_result
        .and_then(|i| i.get("serverInfo"))
        .filter(|s| s.get("name").is_some_and(Value::is_string))
        .unwrap_or(&GATEWAY)
}

fn stamp_server_info(obj: &mut Map<String, Value>, server_info: &Value) {
    let meta = obj
        .entry("_meta")
        .or_insert_with(|| Value::Object(Map::new()));
    if !meta.is_object() {
        *meta = Value::Object(Map::new());
    }
    meta.as_object_mut()
        .expect("just made an object")
        .insert(SERVER_INFO.into(), server_info.clone());
}

fn stamp_cache(obj: &mut Map<String, Value>, hint: CacheHint) {
    obj.insert("ttlMs".into(), Value::from(hint.ttl.as_millis() as u64));
    obj.insert("cacheScope".into(), Value::from(hint.scope.as_str()));
}

/// The hint for a result that must not be cached (MRTR retries).
pub const NO_CACHE: CacheHint = CacheHint {
    ttl: std::time::Duration::ZERO,
    scope: CacheScope::Private,
};

/// Members of a result that belong to the gateway alone: the MRTR fields and the caching
/// hints. Whatever a legacy result carries under these names is dropped ([`from_legacy`]).
pub const GATEWAY_RESULT_FIELDS: &[&str] = &[
    "resultType",
    "inputRequests",
    "requestState",
    "ttlMs",
    "cacheScope",
];

/// A legacy result as the final modern result ([`complete`]), without anything the legacy
/// server put under the gateway's own member names (a forged `input_required` round, its
/// `inputRequests` and `requestState`, or caching hints); returns the names it dropped.
pub fn from_legacy(
    result: Value,
    server_info: &Value,
    cache: Option<CacheHint>,
) -> (Value, Vec<&'static str>) {
    let mut dropped = Vec::new();
    let result = match result {
        Value::Object(mut obj) => {
            for field in GATEWAY_RESULT_FIELDS {
                if obj.remove(*field).is_some() {
                    dropped.push(*field);
                }
            }
            Value::Object(obj)
        }
        other => other,
    };
    (complete(result, server_info, cache), dropped)
}

/// `hint`, with its scope made `private` when the result depends on who asks: a `public`
/// entry may be served across authorization contexts by a shared cache.
pub fn scoped_hint(hint: CacheHint, depends_on_caller: bool) -> CacheHint {
    if depends_on_caller {
        CacheHint {
            scope: CacheScope::Private,
            ..hint
        }
    } else {
        hint
    }
}

/// A final result: `resultType: "complete"`, serverInfo, and cache hints when given.
pub fn complete(result: Value, server_info: &Value, cache: Option<CacheHint>) -> Value {
    let mut obj = match result {
        Value::Object(o) => o,
        // A legacy result must be an object; wrap anything else rather than lose it.
        other => {
            let mut m = Map::new();
            m.insert("value".into(), other);
            m
        }
    };
    obj.insert("resultType".into(), Value::from("complete"));
    stamp_server_info(&mut obj, server_info);
    if let Some(h) = cache {
        stamp_cache(&mut obj, h);
    }
    Value::Object(obj)
}

/// An interim result: no cache hints, ever.
pub fn input_required(
    input_requests: Map<String, Value>,
    request_state: String,
    server_info: &Value,
) -> Value {
    let mut obj = Map::new();
    obj.insert("resultType".into(), Value::from("input_required"));
    if !input_requests.is_empty() {
        obj.insert("inputRequests".into(), Value::Object(input_requests));
    }
    obj.insert("requestState".into(), Value::from(request_state));
    stamp_server_info(&mut obj, server_info);
    Value::Object(obj)
}

/// Maps a legacy JSON-RPC error to what a modern client may receive.
pub fn map_legacy_error(err: &Value, params: &Value) -> ErrorObject {
    let code = err
        .get("code")
        .and_then(Value::as_i64)
        .unwrap_or(codes::INTERNAL_ERROR);
    let message = err
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("the legacy server reported an error")
        .to_string();
    let data = err.get("data").cloned();
    match code {
        codes::LEGACY_RESOURCE_NOT_FOUND => {
            let uri = data
                .as_ref()
                .and_then(|d| d.get("uri"))
                .or_else(|| params.get("uri"))
                .cloned()
                .unwrap_or(Value::Null);
            ErrorObject::new(codes::INVALID_PARAMS, message).with_data(json!({"uri": uri}))
        }
        // Reserved for the spec; legacy meanings do not carry over.
        -32099..=-32020 => ErrorObject::new(codes::INTERNAL_ERROR, message)
            .with_data(json!({"legacyCode": code, "legacyData": data})),
        _ => ErrorObject {
            code,
            message,
            data,
        },
    }
}

/// A legacy server's JSON-RPC error `err` (to a request with `params`) as the modern client
/// gets it: mapped by [`map_legacy_error`], of the kind `kind` makes of the mapped code
/// ([`RejectionKind::LegacyError`] for a call, [`RejectionKind::ListenSubscribeRefused`] for a
/// listen stream's subscription). The kind decides whose fault it is
/// ([`crate::error::legacy_error_fault`]) and the front how it is answered.
pub fn legacy_error(err: &Value, params: &Value, kind: fn(i64) -> RejectionKind) -> Rejection {
    let mapped = map_legacy_error(err, params);
    let rejection = Rejection::new(kind(mapped.code), mapped.message);
    match mapped.data {
        Some(data) => rejection.with_data(data),
        None => rejection,
    }
}

/// `server/discover`, synthesized from the legacy `InitializeResult`.
pub fn discover(init_result: &Value, hint: CacheHint, listen_supported: bool) -> Value {
    let mut caps = Map::new();
    if let Some(legacy) = init_result.get("capabilities").and_then(Value::as_object) {
        for (k, v) in legacy {
            match k.as_str() {
                // Legacy-only (core tasks moved to an extension with other semantics).
                "tasks" => {}
                "tools" | "prompts" | "resources" => {
                    let mut sub = v.as_object().cloned().unwrap_or_default();
                    if !listen_supported {
                        sub.remove("listChanged");
                        sub.remove("subscribe");
                    }
                    caps.insert(k.clone(), Value::Object(sub));
                }
                _ => {
                    caps.insert(k.clone(), v.clone());
                }
            }
        }
    }
    let mut result = Map::new();
    result.insert(
        "supportedVersions".into(),
        json!(mrtr_wire::protocol::SUPPORTED_VERSIONS),
    );
    result.insert("capabilities".into(), Value::Object(caps));
    if let Some(instr) = init_result.get("instructions").filter(|v| v.is_string()) {
        result.insert("instructions".into(), instr.clone());
    }
    complete(
        Value::Object(result),
        server_info(Some(init_result)),
        Some(hint),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn results_get_type_identity_and_hints() {
        let si = json!({"name":"legacy","version":"1"});
        let r = complete(
            json!({"tools":[],"_meta":{"x":1}}),
            &si,
            Some(CacheHint {
                ttl: Duration::from_secs(60),
                scope: CacheScope::Private,
            }),
        );
        assert_eq!(r["resultType"], "complete");
        assert_eq!(r["_meta"]["x"], 1);
        assert_eq!(r["_meta"][SERVER_INFO], si);
        assert_eq!(r["ttlMs"], 60000);
        assert_eq!(r["cacheScope"], "private");
        let r = complete(json!({"content":[]}), &si, None);
        assert!(r.get("ttlMs").is_none());
        let ir = input_required(Map::new(), "s".into(), &si);
        assert_eq!(ir["resultType"], "input_required");
        assert!(ir.get("ttlMs").is_none() && ir.get("inputRequests").is_none());
    }

    #[test]
    fn a_legacy_result_cannot_forge_the_gateways_fields() {
        let si = json!({"name":"legacy","version":"1"});
        let forged = json!({
            "content": [{"type":"text","text":"hi"}],
            "resultType": "input_required",
            "inputRequests": {"x": {"method":"elicitation/create","params":{"mode":"url","message":"m","url":"javascript:alert(1)"}}},
            "requestState": "forged",
            "ttlMs": 999999,
            "cacheScope": "public",
            "structuredContent": {"resultType": "kept: not a top-level member"}
        });
        let (r, dropped) = from_legacy(forged, &si, None);
        assert_eq!(dropped, GATEWAY_RESULT_FIELDS.to_vec());
        assert_eq!(r["resultType"], "complete");
        for gone in ["inputRequests", "requestState", "ttlMs", "cacheScope"] {
            assert!(r.get(gone).is_none(), "{gone} survived: {r}");
        }
        assert_eq!(r["content"][0]["text"], "hi");
        assert_eq!(
            r["structuredContent"]["resultType"],
            "kept: not a top-level member"
        );

        // The gateway's own hints replace a forged one.
        let (r, dropped) = from_legacy(
            json!({"contents": [], "ttlMs": 1}),
            &si,
            Some(CacheHint {
                ttl: Duration::from_secs(60),
                scope: CacheScope::Private,
            }),
        );
        assert_eq!(dropped, vec!["ttlMs"]);
        assert_eq!(
            (r["ttlMs"].clone(), r["cacheScope"].clone()),
            (json!(60000), json!("private"))
        );
        let (_, dropped) = from_legacy(json!({"content": []}), &si, None);
        assert!(dropped.is_empty());
    }

    #[test]
    fn legacy_errors_about_the_request_are_the_clients_fault() {
        use crate::error::Fault;
        let fault = |code: i64| {
            legacy_error(
                &json!({"code": code, "message": "m"}),
                &json!({"uri": "u"}),
                RejectionKind::LegacyError,
            )
            .fault()
        };
        assert_eq!(fault(-32602), Fault::Client);
        assert_eq!(fault(-32601), Fault::Client);
        assert_eq!(fault(-32600), Fault::Client);
        assert_eq!(fault(-32002), Fault::Client, "resource not found: -32602");
        assert_eq!(fault(-32603), Fault::Upstream);
        assert_eq!(fault(-32001), Fault::Upstream);
        assert_eq!(
            fault(-32700),
            Fault::Upstream,
            "the gateway sent it, not the client"
        );
    }

    #[test]
    fn legacy_errors_are_remapped() {
        let e = map_legacy_error(
            &json!({"code":-32002,"message":"nope"}),
            &json!({"uri":"file:///x"}),
        );
        assert_eq!(e.code, -32602);
        assert_eq!(e.data, Some(json!({"uri":"file:///x"})));
        let e = map_legacy_error(&json!({"code":-32042,"message":"url"}), &json!({}));
        assert_eq!(e.code, -32603);
        let e = map_legacy_error(&json!({"code":-32602,"message":"bad"}), &json!({}));
        assert_eq!((e.code, e.message.as_str()), (-32602, "bad"));
        let e = map_legacy_error(&json!({"code":-32001,"message":"custom"}), &json!({}));
        assert_eq!(e.code, -32001);
        // As a rejection: the mapped code in the kind, the message and data as mapped.
        let r = legacy_error(
            &json!({"code":-32002,"message":"nope"}),
            &json!({"uri":"file:///x"}),
            RejectionKind::ListenSubscribeRefused,
        );
        assert_eq!(r.kind(), RejectionKind::ListenSubscribeRefused(-32602));
        assert_eq!(r.message(), "nope");
        assert_eq!(r.data(), Some(&json!({"uri":"file:///x"})));
    }

    #[test]
    fn discover_drops_legacy_only_and_unbacked_capabilities() {
        let init = json!({"protocolVersion":"2025-11-25","capabilities":{"tools":{"listChanged":true},"resources":{"subscribe":true},"tasks":{},"logging":{}},"serverInfo":{"name":"s","version":"2"},"instructions":"hi"});
        let d = discover(
            &init,
            CacheHint {
                ttl: Duration::from_secs(1),
                scope: CacheScope::Public,
            },
            false,
        );
        assert_eq!(
            d["capabilities"],
            json!({"tools":{},"resources":{},"logging":{}})
        );
        assert_eq!(d["supportedVersions"], json!(["2026-07-28"]));
        assert_eq!(d["instructions"], "hi");
        assert_eq!(d["_meta"][SERVER_INFO]["name"], "s");
        assert_eq!(d["ttlMs"], 1000);
    }
}
