//! The digest that binds a `requestState` to the request it was issued for.
//!
//! It covers the method and the request's `params` except the members that legitimately
//! change between rounds (`inputResponses`, `requestState`) and the per-request `_meta`
//! (capabilities, progress token, trace context may differ on a retry). So another tool,
//! other arguments, another prompt or URI, or another method all give another digest.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::Value;

use mrtr_wire::protocol::canonical;

/// A request's digest, made the first time it is asked for: only a request that presents a
/// state, or ends with one, needs it (a plain call that completes never does).
#[derive(Debug, Default)]
pub struct Lazy(std::sync::OnceLock<String>);

impl Lazy {
    /// The digest of `method` and `params`; every call on one `Lazy` must pass the same request.
    pub fn of(&self, method: &str, params: &Value) -> &str {
        self.0.get_or_init(|| digest(method, params))
    }
}

pub fn digest(method: &str, params: &Value) -> String {
    // The method is a string: only `params` loses the members.
    let parts = [&Value::from(method), params];
    let digest = canonical::digest_without(&parts, &["_meta", "inputResponses", "requestState"]);
    URL_SAFE_NO_PAD.encode(digest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn binds_method_name_and_arguments_but_not_round_fields() {
        let base = json!({"name":"t","arguments":{"a":1},"_meta":{"x":1}});
        let d = digest("tools/call", &base);
        let retry = json!({"name":"t","arguments":{"a":1},"_meta":{"y":2},"inputResponses":{"k":{}},"requestState":"s"});
        assert_eq!(digest("tools/call", &retry), d);
        assert_ne!(digest("prompts/get", &base), d);
        assert_ne!(
            digest("tools/call", &json!({"name":"u","arguments":{"a":1}})),
            d
        );
        assert_ne!(
            digest("tools/call", &json!({"name":"t","arguments":{"a":2}})),
            d
        );
        assert_ne!(digest("tools/call", &json!({"name":"t"})), d);
    }
}
