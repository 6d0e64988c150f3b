//! Mapping a modern request's `clientCapabilities` to what a legacy `initialize` declares.
//!
//! A per-call legacy session declares exactly what *this* modern request declared, so a
//! well-behaved legacy server gates itself: it will not elicit from a client that said it
//! cannot answer. The shapes differ by legacy version (see the digest §7.1):
//!
//! | modern                 | 2025-11-25                 | 2025-06-18          | 2025-03-26 / 2024-11-05 |
//! |------------------------|----------------------------|---------------------|-------------------------|
//! | `roots: {}`            | `roots: {listChanged:true}` | same               | same                    |
//! | `sampling: {context?, tools?}` | same               | `sampling: {}`      | `sampling: {}`          |
//! | `elicitation: {form?, url?}`   | same               | `elicitation: {}` if form | omitted           |
//!
//! `experimental` and `extensions` are not forwarded: the gateway cannot vouch for them.
//!
//! `roots.listChanged` is true because the gateway does tell the server when the roots may
//! have changed: a pooled session serves one client after another, and before it serves a new
//! one the gateway sends `notifications/roots/list_changed` (see
//! `roots_refresh` in the gateway).

use serde_json::{Map, Value, json};

/// What the modern request can answer, parsed once from `clientCapabilities`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Declared {
    pub roots: bool,
    pub sampling: bool,
    pub sampling_tools: bool,
    pub sampling_context: bool,
    pub elicit_form: bool,
    pub elicit_url: bool,
}

impl Declared {
    pub fn from_modern(caps: &Value) -> Declared {
        let obj = caps.as_object();
        let get = |k: &str| obj.and_then(|o| o.get(k)).filter(|v| v.is_object());
        let mut d = Declared {
            roots: get("roots").is_some(),
            ..Default::default()
        };
        if let Some(s) = get("sampling") {
            d.sampling = true;
            d.sampling_tools = s.get("tools").is_some_and(Value::is_object);
            d.sampling_context = s.get("context").is_some_and(Value::is_object);
        }
        if let Some(e) = get("elicitation") {
            let form = e.get("form").is_some_and(Value::is_object);
            let url = e.get("url").is_some_and(Value::is_object);
            // `elicitation: {}` means form only.
            d.elicit_form = form || !url;
            d.elicit_url = url;
        }
        d
    }

    /// A stable short label of the set, used for pooling keys and metrics.
    pub fn label(&self) -> String {
        // Every field counts: two requests share a pooled session only when its `initialize`
        // declared exactly what each of them declares.
        let mut parts: Vec<&str> = Vec::new();
        if self.roots {
            parts.push("roots");
        }
        let sampling = match (self.sampling, self.sampling_tools, self.sampling_context) {
            (false, _, _) => None,
            (true, false, false) => Some("sampling"),
            (true, true, false) => Some("sampling+tools"),
            (true, false, true) => Some("sampling+context"),
            (true, true, true) => Some("sampling+tools+context"),
        };
        parts.extend(sampling);
        if self.elicit_form {
            parts.push("elicit-form");
        }
        if self.elicit_url {
            parts.push("elicit-url");
        }
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join(",")
        }
    }

    /// The legacy `capabilities` object for `initialize` at `version`.
    pub fn to_legacy(&self, version: &str) -> Value {
        let mut caps = Map::new();
        if self.roots {
            caps.insert("roots".into(), json!({"listChanged": true}));
        }
        let modern_shapes = version >= "2025-11-25";
        if self.sampling {
            let mut s = Map::new();
            if modern_shapes {
                if self.sampling_context {
                    s.insert("context".into(), json!({}));
                }
                if self.sampling_tools {
                    s.insert("tools".into(), json!({}));
                }
            }
            caps.insert("sampling".into(), Value::Object(s));
        }
        if modern_shapes {
            if self.elicit_form || self.elicit_url {
                let mut e = Map::new();
                if self.elicit_form {
                    e.insert("form".into(), json!({}));
                }
                if self.elicit_url {
                    e.insert("url".into(), json!({}));
                }
                caps.insert("elicitation".into(), Value::Object(e));
            }
        } else if version >= "2025-06-18" && self.elicit_form {
            caps.insert("elicitation".into(), json!({}));
        }
        Value::Object(caps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_elicitation_means_form_only() {
        let d = Declared::from_modern(&json!({"elicitation": {}}));
        assert!(d.elicit_form && !d.elicit_url);
        let d = Declared::from_modern(&json!({"elicitation": {"url": {}}}));
        assert!(!d.elicit_form && d.elicit_url);
    }

    #[test]
    fn labels_tell_apart_every_set_that_initializes_differently() {
        let sets = [
            json!({}),
            json!({"roots": {}}),
            json!({"sampling": {}}),
            json!({"sampling": {"tools": {}}}),
            json!({"sampling": {"context": {}}}),
            json!({"sampling": {"tools": {}, "context": {}}}),
            json!({"elicitation": {}}),
            json!({"elicitation": {"url": {}}}),
            json!({"elicitation": {"form": {}, "url": {}}}),
            json!({"roots": {}, "sampling": {"context": {}}, "elicitation": {}}),
        ];
        let labels: std::collections::BTreeSet<String> = sets
            .iter()
            .map(|c| Declared::from_modern(c).label())
            .collect();
        assert_eq!(labels.len(), sets.len(), "{labels:?}");
    }

    #[test]
    fn shapes_follow_the_legacy_version() {
        let d = Declared::from_modern(&json!({
            "roots": {}, "sampling": {"tools": {}}, "elicitation": {"form": {}, "url": {}},
            "experimental": {"x": {}}
        }));
        assert_eq!(
            d.to_legacy("2025-11-25"),
            json!({"roots":{"listChanged":true},"sampling":{"tools":{}},"elicitation":{"form":{},"url":{}}})
        );
        assert_eq!(
            d.to_legacy("2025-06-18"),
            json!({"roots":{"listChanged":true},"sampling":{},"elicitation":{}})
        );
        assert_eq!(
            d.to_legacy("2025-03-26"),
            json!({"roots":{"listChanged":true},"sampling":{}})
        );
        assert_eq!(
            Declared::from_modern(&json!({})).to_legacy("2025-11-25"),
            json!({})
        );
    }
}
