//! Validating the answers a modern client sends in `inputResponses`.
//!
//! Each answer is checked against the kind of question it answers before it reaches the
//! legacy server; a bad one is refused with -32602 naming the key. The checks are structural
//! (what the schema requires), not semantic: whether a form answer satisfies the requested
//! schema is the legacy server's business, exactly as it would be with a direct client.

use serde_json::Value;

use crate::state::InputKind;

/// Checks `answer` as a result of kind `kind`; the error says what is wrong.
pub fn validate(kind: InputKind, answer: &Value) -> Result<(), String> {
    let obj = answer
        .as_object()
        .ok_or_else(|| "must be an object".to_string())?;
    match kind {
        InputKind::ElicitForm | InputKind::ElicitUrl => {
            let action = obj
                .get("action")
                .and_then(Value::as_str)
                .ok_or("an elicitation answer needs a string `action`")?;
            if !matches!(action, "accept" | "decline" | "cancel") {
                return Err(format!(
                    "`action` must be accept, decline or cancel, not {action:?}"
                ));
            }
            if let Some(content) = obj.get("content") {
                if action != "accept" {
                    return Err("`content` is allowed only with action accept".into());
                }
                if kind == InputKind::ElicitUrl {
                    return Err("a URL-mode elicitation answer carries no `content`".into());
                }
                let fields = content.as_object().ok_or("`content` must be an object")?;
                for (name, v) in fields {
                    let ok = match v {
                        Value::String(_) | Value::Number(_) | Value::Bool(_) => true,
                        Value::Array(items) => items.iter().all(Value::is_string),
                        _ => false,
                    };
                    if !ok {
                        return Err(format!(
                            "`content.{name}` must be a string, number, boolean or array of strings"
                        ));
                    }
                }
            }
            Ok(())
        }
        InputKind::Sampling => {
            match obj.get("role").and_then(Value::as_str) {
                Some("user" | "assistant") => {}
                _ => return Err("a sampling answer needs `role` user or assistant".into()),
            }
            if !obj.get("model").is_some_and(Value::is_string) {
                return Err("a sampling answer needs a string `model`".into());
            }
            let block_ok = |b: &Value| b.get("type").is_some_and(Value::is_string);
            match obj.get("content") {
                Some(b @ Value::Object(_)) if block_ok(b) => {}
                Some(Value::Array(bs)) if !bs.is_empty() && bs.iter().all(block_ok) => {}
                _ => {
                    return Err(
                        "a sampling answer needs `content`: a content block or a non-empty array of them"
                            .into(),
                    );
                }
            }
            if obj.get("stopReason").is_some_and(|s| !s.is_string()) {
                return Err("`stopReason` must be a string".into());
            }
            Ok(())
        }
        InputKind::Roots => {
            let roots = obj
                .get("roots")
                .and_then(Value::as_array)
                .ok_or("a roots answer needs a `roots` array")?;
            for (i, r) in roots.iter().enumerate() {
                let uri = r
                    .get("uri")
                    .and_then(Value::as_str)
                    .ok_or_else(|| format!("`roots[{i}].uri` must be a string"))?;
                if !uri.starts_with("file://") {
                    return Err(format!("`roots[{i}].uri` must be a file:// URI"));
                }
                if r.get("name").is_some_and(|n| !n.is_string()) {
                    return Err(format!("`roots[{i}].name` must be a string"));
                }
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn elicitation_answers() {
        let k = InputKind::ElicitForm;
        assert!(
            validate(
                k,
                &json!({"action":"accept","content":{"n":"a","x":1,"b":true,"l":["a"]}})
            )
            .is_ok()
        );
        assert!(validate(k, &json!({"action":"decline"})).is_ok());
        assert!(validate(k, &json!({"action":"cancel"})).is_ok());
        assert!(validate(k, &json!({"action":"maybe"})).is_err());
        assert!(validate(k, &json!({})).is_err());
        assert!(validate(k, &json!({"action":"decline","content":{"n":"a"}})).is_err());
        assert!(validate(k, &json!({"action":"accept","content":{"n":{"deep":1}}})).is_err());
        assert!(validate(k, &json!({"action":"accept","content":{"n":[1]}})).is_err());
        assert!(validate(k, &json!("accept")).is_err());
        assert!(validate(InputKind::ElicitUrl, &json!({"action":"accept"})).is_ok());
        assert!(
            validate(
                InputKind::ElicitUrl,
                &json!({"action":"accept","content":{}})
            )
            .is_err()
        );
    }

    #[test]
    fn sampling_answers() {
        let k = InputKind::Sampling;
        assert!(validate(k, &json!({"role":"assistant","content":{"type":"text","text":"x"},"model":"m","stopReason":"endTurn"})).is_ok());
        assert!(validate(k, &json!({"role":"assistant","content":[{"type":"tool_use","id":"1","name":"n","input":{}}],"model":"m"})).is_ok());
        assert!(
            validate(
                k,
                &json!({"role":"robot","content":{"type":"text","text":"x"},"model":"m"})
            )
            .is_err()
        );
        assert!(
            validate(
                k,
                &json!({"role":"assistant","content":{"type":"text","text":"x"}})
            )
            .is_err()
        );
        assert!(
            validate(
                k,
                &json!({"role":"assistant","content":{"text":"x"},"model":"m"})
            )
            .is_err()
        );
        assert!(validate(k, &json!({"role":"assistant","content":[],"model":"m"})).is_err());
    }

    #[test]
    fn roots_answers() {
        let k = InputKind::Roots;
        assert!(validate(k, &json!({"roots":[{"uri":"file:///a","name":"a"}]})).is_ok());
        assert!(validate(k, &json!({"roots":[]})).is_ok());
        assert!(validate(k, &json!({"roots":[{"uri":"https://a"}]})).is_err());
        assert!(validate(k, &json!({"roots":"file:///a"})).is_err());
        assert!(validate(k, &json!({})).is_err());
    }
}
