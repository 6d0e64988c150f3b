//! Canonical JSON (object keys sorted, no whitespace) and digests over it.
//!
//! Digests bind a `requestState` to its originating request and name content-derived input
//! keys, so they must not depend on how a peer happened to order object keys. This writer
//! sorts keys itself rather than relying on `serde_json::Map`'s ordering, which changes if any
//! crate in the build enables `preserve_order`.

use serde_json::Value;
use sha2::{Digest, Sha256};

pub fn write(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push(b'{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                serde_json::to_writer(&mut *out, k).expect("strings serialize");
                out.push(b':');
                write(&m[k], out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(item, out);
            }
            out.push(b']');
        }
        scalar => serde_json::to_writer(&mut *out, scalar).expect("scalars serialize"),
    }
}

/// SHA-256 over the canonical form of each part, each part length-prefixed.
pub fn digest(parts: &[&Value]) -> [u8; 32] {
    digest_without(parts, &[])
}

/// [`digest`], with every part that is an object taken without its top-level members named in
/// `skip`: the digest of the parts with those members removed, without copying the parts.
pub fn digest_without(parts: &[&Value], skip: &[&str]) -> [u8; 32] {
    let mut h = Sha256::new();
    let mut buf = Vec::with_capacity(256);
    for p in parts {
        buf.clear();
        match p {
            Value::Object(m) if !skip.is_empty() => {
                let mut keys: Vec<&String> =
                    m.keys().filter(|k| !skip.contains(&k.as_str())).collect();
                keys.sort();
                buf.push(b'{');
                for (i, k) in keys.into_iter().enumerate() {
                    if i > 0 {
                        buf.push(b',');
                    }
                    serde_json::to_writer(&mut buf, k).expect("strings serialize");
                    buf.push(b':');
                    write(&m[k], &mut buf);
                }
                buf.push(b'}');
            }
            other => write(other, &mut buf),
        }
        h.update((buf.len() as u64).to_be_bytes());
        h.update(&buf);
    }
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_order_does_not_matter_but_values_do() {
        let a: Value = serde_json::from_str(r#"{"b":1,"a":{"y":[1,2],"x":"s"}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":{"x":"s","y":[1,2]},"b":1}"#).unwrap();
        assert_eq!(digest(&[&a]), digest(&[&b]));
        let mut out = Vec::new();
        write(&a, &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"a":{"x":"s","y":[1,2]},"b":1}"#
        );
        assert_ne!(
            digest(&[&a]),
            digest(&[&json!({"b":2,"a":{"x":"s","y":[1,2]}})])
        );
        // Part boundaries matter: ("ab","c") differs from ("a","bc").
        assert_ne!(
            digest(&[&json!("ab"), &json!("c")]),
            digest(&[&json!("a"), &json!("bc")])
        );
    }

    #[test]
    fn skipped_members_digest_as_if_removed() {
        let full = json!({"name":"t","arguments":{"b":1,"a":2},"_meta":{"x":1},"requestState":"s"});
        let removed = json!({"name":"t","arguments":{"a":2,"b":1}});
        let skip = ["_meta", "requestState", "inputResponses"];
        let method = json!("tools/call");
        assert_eq!(
            digest_without(&[&method, &full], &skip),
            digest(&[&method, &removed])
        );
        // Only top-level members are skipped.
        let nested = json!({"arguments":{"_meta":1}});
        assert_ne!(
            digest_without(&[&nested], &skip),
            digest(&[&json!({"arguments":{}})])
        );
        assert_ne!(
            digest_without(&[&full], &skip),
            digest(&[&json!({"name":"t"})])
        );
    }
}
