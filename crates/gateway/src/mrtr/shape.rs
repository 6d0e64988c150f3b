//! The "shape" of a question: its content with volatile details masked.
//!
//! Replay only converges if the legacy server asks the same questions every time. A common
//! way to break that is a detail that changes on every execution — a timestamp, a counter, a
//! request id in the message. Two questions with equal shapes but different keys are almost
//! certainly that; the engine logs it and counts it so operators can see why a tool never
//! finishes (it still ends at `state.max_rounds`).
//!
//! Masking: every JSON number becomes `#`; in strings, every maximal run of characters from
//! `[0-9A-Fa-f:.-]` that contains a digit becomes `#` (dates, times, counters, hex ids, UUIDs).

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::Value;

use mrtr_wire::protocol::canonical;

fn mask_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut run = String::new();
    let flush = |run: &mut String, out: &mut String| {
        if run.bytes().any(|b| b.is_ascii_digit()) {
            out.push('#');
        } else {
            out.push_str(run);
        }
        run.clear();
    };
    for ch in s.chars() {
        if ch.is_ascii_hexdigit() || matches!(ch, ':' | '.' | '-') {
            run.push(ch);
        } else {
            flush(&mut run, &mut out);
            out.push(ch);
        }
    }
    flush(&mut run, &mut out);
    out
}

fn mask(v: &Value) -> Value {
    match v {
        Value::Number(_) => Value::from("#"),
        Value::String(s) => Value::from(mask_str(s)),
        Value::Array(items) => Value::Array(items.iter().map(mask).collect()),
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| k.as_str() != "_meta")
                .map(|(k, v)| (k.clone(), mask(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// A short digest of the masked question.
pub fn shape(method: &str, params: Option<&Value>) -> String {
    let masked = params.map(mask).unwrap_or(Value::Null);
    let d = canonical::digest(&[&Value::from(method), &masked]);
    URL_SAFE_NO_PAD.encode(&d[..9])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn volatile_details_are_masked_and_wording_is_not() {
        let a = json!({"message": "Confirm order 4711 at 2026-12-02T10:00:00Z?", "n": 1});
        let b = json!({"message": "Confirm order 4712 at 2026-12-02T10:00:05Z?", "n": 2});
        let c = json!({"message": "Cancel order 4711 at 2026-12-02T10:00:00Z?", "n": 1});
        assert_eq!(
            shape("elicitation/create", Some(&a)),
            shape("elicitation/create", Some(&b))
        );
        assert_ne!(
            shape("elicitation/create", Some(&a)),
            shape("elicitation/create", Some(&c))
        );
        assert_eq!(mask_str("id 3f2a9c1e-77b0 done"), "id # done");
        // Plain words made of hex letters stay (no digit in the run).
        assert_eq!(mask_str("a bad face"), "a bad face");
    }
}
