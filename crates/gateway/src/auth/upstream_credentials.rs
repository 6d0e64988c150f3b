//! What the gateway presents to the legacy server, independent of how clients authenticate.
//!
//! - `none`: nothing.
//! - `forward`: the client's own `Authorization` header, unchanged. Only for legacy servers
//!   that accept tokens issued for the gateway's audience; otherwise use `static`.
//! - `static`: `Authorization: Bearer <token>` from a file read at load time.
//!
//! [`UpstreamCredentials::credential_key`] names the credential without revealing it, so that
//! anything pooled per upstream credential (legacy sessions) is never shared between callers
//! who present different credentials.

use http::{HeaderMap, HeaderValue, header::AUTHORIZATION};
use sha2::{Digest, Sha256};

/// Hex digits of SHA-256 kept in a credential key: 128 bits, so distinct credentials never
/// share a key in practice, and the hash cannot be walked back to the token.
const KEY_HEX_LEN: usize = 32;

#[derive(Debug, Clone)]
pub enum UpstreamCredentials {
    None,
    Forward,
    Static(StaticCredential),
}

/// The prepared `Authorization` value for `static` (marked sensitive, so `Debug` hides it).
#[derive(Debug, Clone)]
pub struct StaticCredential {
    value: HeaderValue,
    key: String,
}

impl StaticCredential {
    pub fn new(mut value: HeaderValue) -> Self {
        value.set_sensitive(true);
        let key = credential_hash(value.as_bytes());
        StaticCredential { value, key }
    }
}

impl UpstreamCredentials {
    pub fn as_str(&self) -> &'static str {
        match self {
            UpstreamCredentials::None => "none",
            UpstreamCredentials::Forward => "forward",
            UpstreamCredentials::Static(_) => "static",
        }
    }

    /// Headers to add to every request sent to the legacy server on behalf of this client.
    pub fn upstream_headers(&self, incoming: &HeaderMap) -> HeaderMap {
        let mut out = HeaderMap::new();
        match self {
            UpstreamCredentials::None => {}
            UpstreamCredentials::Forward => {
                if let Some(v) = incoming.get(AUTHORIZATION) {
                    let mut v = v.clone();
                    v.set_sensitive(true);
                    out.insert(AUTHORIZATION, v);
                }
            }
            UpstreamCredentials::Static(s) => {
                out.insert(AUTHORIZATION, s.value.clone());
            }
        }
        out
    }

    /// A short non-secret name for the credential [`Self::upstream_headers`] would send: the
    /// first 128 bits of its SHA-256 in hex, or `""` when nothing is sent.
    pub fn credential_key(&self, incoming: &HeaderMap) -> String {
        match self {
            UpstreamCredentials::None => String::new(),
            UpstreamCredentials::Forward => incoming
                .get(AUTHORIZATION)
                .map(|v| credential_hash(v.as_bytes()))
                .unwrap_or_default(),
            UpstreamCredentials::Static(s) => s.key.clone(),
        }
    }
}

fn credential_hash(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(KEY_HEX_LEN);
    for b in &digest[..KEY_HEX_LEN / 2] {
        out.push(char::from_digit(u32::from(b >> 4), 16).expect("nibble"));
        out.push(char::from_digit(u32::from(b & 0x0f), 16).expect("nibble"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_auth(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn none_sends_nothing_and_has_no_key() {
        let c = UpstreamCredentials::None;
        let incoming = with_auth("Bearer client-token");
        assert!(c.upstream_headers(&incoming).is_empty());
        assert_eq!(c.credential_key(&incoming), "");
    }

    #[test]
    fn forward_copies_the_client_authorization_and_keys_by_its_hash() {
        let c = UpstreamCredentials::Forward;
        let a = with_auth("Bearer token-a");
        let out = c.upstream_headers(&a);
        assert_eq!(out.get(AUTHORIZATION).unwrap(), "Bearer token-a");
        assert_eq!(out.len(), 1);

        let key_a = c.credential_key(&a);
        assert_eq!(key_a.len(), KEY_HEX_LEN);
        assert!(key_a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert!(!key_a.contains("token-a"));
        assert_eq!(key_a, c.credential_key(&with_auth("Bearer token-a")));
        assert_ne!(key_a, c.credential_key(&with_auth("Bearer token-b")));

        assert!(c.upstream_headers(&HeaderMap::new()).is_empty());
        assert_eq!(c.credential_key(&HeaderMap::new()), "");
    }

    #[test]
    fn static_sends_its_own_token_whatever_the_client_sent() {
        let c = UpstreamCredentials::Static(StaticCredential::new(HeaderValue::from_static(
            "Bearer service-token",
        )));
        let out = c.upstream_headers(&with_auth("Bearer client-token"));
        assert_eq!(out.get(AUTHORIZATION).unwrap(), "Bearer service-token");
        assert!(out.get(AUTHORIZATION).unwrap().is_sensitive());
        assert_eq!(
            c.credential_key(&with_auth("Bearer x")),
            c.credential_key(&HeaderMap::new())
        );
        assert_eq!(c.credential_key(&HeaderMap::new()).len(), KEY_HEX_LEN);
        assert!(!format!("{c:?}").contains("service-token"));
    }
}
