//! Header values of the 2026-07-28 HTTP transport: the `=?base64?…?=` sentinel.
//!
//! A value that is not plain header-safe ASCII (non-ASCII, control characters, leading or
//! trailing whitespace) travels as `=?base64?<base64 of UTF-8>?=`; the markers are lower case.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

const OPEN: &str = "=?base64?";
const CLOSE: &str = "?=";

/// Decodes a header value: the sentinel form is unwrapped, anything else is taken literally.
/// `None` when the sentinel is malformed or does not decode to UTF-8.
pub fn decode(raw: &str) -> Option<String> {
    match raw.strip_prefix(OPEN).and_then(|r| r.strip_suffix(CLOSE)) {
        Some(b64) => {
            let bytes = STANDARD.decode(b64).ok()?;
            String::from_utf8(bytes).ok()
        }
        None => Some(raw.to_string()),
    }
}

/// Encodes a value for a header, using the sentinel only where it is required.
pub fn encode(value: &str) -> String {
    let looks_encoded = value.starts_with(OPEN) && value.ends_with(CLOSE);
    let plain = !value.is_empty()
        && value.bytes().all(|b| (0x20..0x7f).contains(&b))
        && !value.starts_with(' ')
        && !value.ends_with(' ')
        && !looks_encoded;
    if plain {
        value.to_string()
    } else {
        format!("{OPEN}{}{CLOSE}", STANDARD.encode(value.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_uses_the_sentinel_only_when_needed() {
        assert_eq!(encode("get_weather"), "get_weather");
        assert_eq!(decode("get_weather").unwrap(), "get_weather");
        for v in ["héllo", " lead", "trail ", "a\tb", "=?base64?abc?="] {
            let e = encode(v);
            assert!(e.starts_with("=?base64?"), "{v:?} -> {e}");
            assert_eq!(decode(&e).unwrap(), v);
        }
        assert_eq!(decode("=?base64?@@?="), None);
    }
}
