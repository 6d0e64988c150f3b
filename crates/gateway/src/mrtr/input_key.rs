//! Minting stable keys for the questions a legacy server asks.
//!
//! A legacy server request has only a JSON-RPC id, which changes on every execution. The key
//! must be the same when the call is replayed, so it is derived from what is asked:
//! - a legacy server may name its question with `params._meta["io.mrtr-gateway/inputKey"]`;
//!   that name is used as is (when it is 1-64 characters of `A-Z a-z 0-9 _ - .`);
//! - otherwise: a readable prefix by kind (`elicit`, `sample`, `roots`), a dash, and 12 hex
//!   digits of SHA-256 over the canonical `method` and `params` (without `_meta` and `task`).
//!
//! The same question asked twice in one execution gets an occurrence suffix (`#2`, `#3`, …)
//! in the order asked. Because keys come from content, parallel questions get the same keys
//! whatever order they arrive in.

use std::collections::HashMap;

use serde_json::Value;

use mrtr_wire::protocol::canonical;
use mrtr_wire::protocol::meta::INPUT_KEY_HINT;

#[derive(Debug, Default)]
pub struct KeyMinter {
    seen: HashMap<String, u32>,
}

fn valid_hint(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// The content-derived base key (without occurrence suffix).
pub fn base_key(method: &str, params: Option<&Value>) -> String {
    if let Some(hint) = params
        .and_then(|p| p.get("_meta"))
        .and_then(|m| m.get(INPUT_KEY_HINT))
        .and_then(Value::as_str)
        .filter(|h| valid_hint(h))
    {
        return hint.to_string();
    }
    let prefix = match method {
        "elicitation/create" => "elicit",
        "sampling/createMessage" => "sample",
        "roots/list" => "roots",
        _ => "input",
    };
    let mut content = params.cloned().unwrap_or(Value::Null);
    if let Some(obj) = content.as_object_mut() {
        obj.remove("_meta");
        obj.remove("task");
        // A URL elicitation's id is minted per execution; the question is the same without it.
        obj.remove("elicitationId");
    }
    let d = canonical::digest(&[&Value::from(method), &content]);
    let hex: String = d[..6].iter().map(|b| format!("{b:02x}")).collect();
    format!("{prefix}-{hex}")
}

impl KeyMinter {
    pub fn new() -> Self {
        Self::default()
    }

    /// The key for the next question with this content.
    pub fn mint(&mut self, method: &str, params: Option<&Value>) -> String {
        let base = base_key(method, params);
        let n = self.seen.entry(base.clone()).or_insert(0);
        *n += 1;
        if *n == 1 { base } else { format!("{base}#{n}") }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ask(name: &str) -> Value {
        json!({"message": format!("{name}?"), "requestedSchema": {"type":"object","properties":{name:{"type":"string"}}}})
    }

    #[test]
    fn stable_across_executions() {
        let p = ask("name");
        let a = KeyMinter::new().mint("elicitation/create", Some(&p));
        let b = KeyMinter::new().mint("elicitation/create", Some(&p));
        assert_eq!(a, b);
        assert!(
            a.starts_with("elicit-") && a.len() == "elicit-".len() + 12,
            "{a}"
        );
        // _meta (a progress token, say) and key order do not change the key.
        let mut with_meta = p.clone();
        with_meta["_meta"] = json!({"progressToken": 5});
        let reordered: Value = serde_json::from_str(
            r#"{"requestedSchema":{"properties":{"name":{"type":"string"}},"type":"object"},"message":"name?"}"#,
        )
        .unwrap();
        assert_eq!(
            KeyMinter::new().mint("elicitation/create", Some(&with_meta)),
            a
        );
        assert_eq!(
            KeyMinter::new().mint("elicitation/create", Some(&reordered)),
            a
        );
    }

    #[test]
    fn parallel_questions_get_the_same_keys_in_any_order() {
        let qs = [
            ("elicitation/create", Some(ask("name"))),
            (
                "sampling/createMessage",
                Some(json!({"messages":[],"maxTokens":5})),
            ),
            ("roots/list", None),
        ];
        let mut m1 = KeyMinter::new();
        let forward: Vec<String> = qs.iter().map(|(m, p)| m1.mint(m, p.as_ref())).collect();
        let mut m2 = KeyMinter::new();
        let mut backward: Vec<String> = qs
            .iter()
            .rev()
            .map(|(m, p)| m2.mint(m, p.as_ref()))
            .collect();
        backward.reverse();
        assert_eq!(forward, backward);
        assert!(forward[0].starts_with("elicit-"));
        assert!(forward[1].starts_with("sample-"));
        assert!(forward[2].starts_with("roots-"));
    }

    #[test]
    fn duplicates_get_occurrence_suffixes_and_different_questions_differ() {
        let mut m = KeyMinter::new();
        let a1 = m.mint("elicitation/create", Some(&ask("name")));
        let a2 = m.mint("elicitation/create", Some(&ask("name")));
        let b = m.mint("elicitation/create", Some(&ask("color")));
        assert_eq!(a2, format!("{a1}#2"));
        assert_ne!(a1, b);
    }

    #[test]
    fn the_hint_names_the_key() {
        let mut p = ask("name");
        p["_meta"] = json!({INPUT_KEY_HINT: "user_name"});
        let mut m = KeyMinter::new();
        assert_eq!(m.mint("elicitation/create", Some(&p)), "user_name");
        assert_eq!(m.mint("elicitation/create", Some(&p)), "user_name#2");
        p["_meta"] = json!({INPUT_KEY_HINT: "bad key with spaces"});
        assert!(
            KeyMinter::new()
                .mint("elicitation/create", Some(&p))
                .starts_with("elicit-")
        );
    }
}
