//! URLs written into a question's text (`message`, a form field's `description` or `default`)
//! or into a legacy error's `data`: a client shows those to the user as text, and most render
//! a URL there as a link, so they are judged by the same rules as a URL elicitation's `url`
//! (`policy.url.review_text`).

use serde_json::Value;

use super::url::{self, Refused, UrlPolicy};

/// Schemes a text link may use without `//` that a client could still open or run.
const BARE_SCHEMES: &[&str] = &["javascript:", "vbscript:", "data:", "file:"];

/// Characters that end a URL written in running text.
fn ends_url(c: char) -> bool {
    c.is_whitespace()
        || matches!(
            c,
            '<' | '>' | '"' | '\'' | '`' | '(' | ')' | '[' | ']' | '{' | '}'
        )
}

/// The URL-looking pieces of `text`: a scheme followed by `://`, or one of `BARE_SCHEMES`,
/// up to the next space, quote or bracket, without trailing sentence punctuation.
pub fn urls_in(text: &str) -> Vec<&str> {
    let mut found = Vec::new();
    for token in text.split(ends_url) {
        let start = match token.find("://") {
            Some(sep) => {
                let scheme_len = token[..sep]
                    .chars()
                    .rev()
                    .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '.' | '-'))
                    .count();
                Some(sep - scheme_len)
            }
            None => {
                let lower = token.to_ascii_lowercase();
                BARE_SCHEMES.iter().find_map(|s| {
                    lower
                        .find(s)
                        .filter(|&at| at == 0 || !token.as_bytes()[at - 1].is_ascii_alphanumeric())
                })
            }
        };
        if let Some(start) = start {
            let url = token[start..].trim_end_matches(['.', ',', ';', ':', '!', '?']);
            if !url.is_empty() {
                found.push(url);
            }
        }
    }
    found
}

/// The first URL in `text` the policy refuses.
pub fn first_refused(text: &str, policy: &UrlPolicy) -> Option<Refused> {
    urls_in(text)
        .into_iter()
        .find_map(|u| url::judge(u, policy).err())
}

/// The first URL refused anywhere among the strings of `value` (nested arrays and objects).
pub fn first_refused_in(value: &Value, policy: &UrlPolicy) -> Option<Refused> {
    match value {
        Value::String(s) => first_refused(s, policy),
        Value::Array(items) => items.iter().find_map(|v| first_refused_in(v, policy)),
        Value::Object(map) => map.values().find_map(|v| first_refused_in(v, policy)),
        _ => None,
    }
}

/// Drops the `data` of a JSON-RPC error object `err` when it carries a URL the policy refuses
/// (with `policy.url.review_text` on); the code and message stay. Returns what was refused.
/// Every path that hands a legacy server's error to a client goes through this: the MRTR
/// engine and the passed-through legacy sessions.
pub fn drop_unsafe_error_data(err: &mut Value, policy: &UrlPolicy) -> Option<Refused> {
    if !policy.review_text {
        return None;
    }
    let refused = err.get("data").and_then(|d| first_refused_in(d, policy))?;
    if let Some(obj) = err.as_object_mut() {
        obj.remove("data");
    }
    Some(refused)
}

/// The texts of an elicitation a client shows: its `message`, and each form field's
/// `description` and string `default`, with where each is (for the refusal's detail).
pub fn elicitation_texts(request: &Value) -> Vec<(String, &str)> {
    let mut texts = Vec::new();
    if let Some(m) = request.pointer("/params/message").and_then(Value::as_str) {
        texts.push(("message".to_owned(), m));
    }
    if let Some(props) = request
        .pointer("/params/requestedSchema/properties")
        .and_then(Value::as_object)
    {
        for (field, schema) in props {
            for member in ["description", "default", "title"] {
                if let Some(text) = schema.get(member).and_then(Value::as_str) {
                    texts.push((format!("requestedSchema.properties.{field}.{member}"), text));
                }
            }
        }
    }
    texts
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn urls_are_found_in_running_text_without_their_punctuation() {
        assert_eq!(
            urls_in(
                "Open https://auth.example.com/x?y=1. Then (see http://a.b/c), or javascript:alert(1)"
            ),
            vec![
                "https://auth.example.com/x?y=1",
                "http://a.b/c",
                "javascript:alert"
            ]
        );
        assert_eq!(urls_in("no links here: just words"), Vec::<&str>::new());
        assert_eq!(urls_in("<https://x.example>"), vec!["https://x.example"]);
        assert_eq!(urls_in("DATA:text/html,hi"), vec!["DATA:text/html,hi"]);
        // A word that merely ends in a scheme's letters is not a link.
        assert_eq!(urls_in("metadata:none"), Vec::<&str>::new());
    }

    #[test]
    fn unsafe_links_in_text_are_refused_by_the_url_rules() {
        let policy = UrlPolicy::default();
        assert!(first_refused("Visit https://example.com/help", &policy).is_none());
        for text in [
            "Sign in at http://169.254.169.254/latest/meta-data first",
            "Click javascript:alert(document.cookie)",
            "See https://metadata.google.internal/computeMetadata",
            "Go to https://127.0.0.1:8080/steal",
        ] {
            assert!(first_refused(text, &policy).is_some(), "{text}");
        }
        let data = json!({"help": ["fine", {"link": "http://10.0.0.1/admin"}]});
        assert!(first_refused_in(&data, &policy).is_some());
        assert!(first_refused_in(&json!({"n": 1, "s": "plain"}), &policy).is_none());
    }

    #[test]
    fn the_texts_a_client_shows_are_the_ones_reviewed() {
        let q = json!({"method": "elicitation/create", "params": {
            "message": "m",
            "requestedSchema": {"type": "object", "properties": {
                "site": {"type": "string", "description": "d", "default": "x", "title": "t"},
                "n": {"type": "number", "default": 3}
            }}
        }});
        let mut where_: Vec<String> = elicitation_texts(&q).into_iter().map(|(w, _)| w).collect();
        where_.sort();
        assert_eq!(
            where_,
            [
                "message",
                "requestedSchema.properties.site.default",
                "requestedSchema.properties.site.description",
                "requestedSchema.properties.site.title"
            ]
        );
    }
}
