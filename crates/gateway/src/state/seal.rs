//! Sealing and opening tokens under the state key ring: the only code that touches state
//! crypto. Two kinds of token use it, told apart by a purpose tag in the associated data:
//! `requestState` ("state") and the sealed legacy session ids of the dual-era front
//! ("legacy-session"). A token sealed for one purpose fails authentication as the other.
//!
//! ```text
//!  token   = "m1" "." key-id "." base64url-nopad( nonce ‖ ciphertext ‖ tag )
//!                                               24 B    len(plain)    16 B
//!  aad     = "mrtr-gateway/" purpose 0x00 "m1" 0x00 key-id
//!  purpose = "state" | "legacy-session"
//!  cipher  = XAES-256-GCM (C2SP): AES-256-GCM under a key derived from the ring key and the
//!            first 12 nonce bytes, nonce = the last 12 bytes
//! ```
//!
//! The version tag and key id travel in clear so a reader can pick the key without trying
//! them all, and both are bound as associated data so neither can be swapped. The 24-byte
//! random nonce takes the AES-GCM random-nonce limit (2^32 messages per key) out of play: the
//! collision bound for XAES-256-GCM is about 2^80 messages per key.
//!
//! [`open`] checks, in order and before any crypto work beyond the last step: the length cap,
//! the three-part shape, the version tag, the key id's syntax, strict base64url, the minimum
//! length, that the key id is in the ring; only then does it decrypt.

use base64_simd::URL_SAFE_NO_PAD;

use super::key_ring::KeyRing;
use super::key_ring::valid_key_id;
use super::xaes::{NONCE_LEN, TAG_LEN};
use crate::error::RejectionKind;

pub const VERSION: &str = "m1";
const AAD_PREFIX: &[u8] = b"mrtr-gateway/";

/// What a token is for. Bound into the associated data, so a token never opens as another
/// kind; `RequestState` keeps the associated data of the first release (tokens in flight
/// across an upgrade still open).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    RequestState,
    /// A legacy session id handed to a legacy client by the dual-era front.
    LegacySession,
}

impl Purpose {
    fn tag(self) -> &'static [u8] {
        match self {
            Purpose::RequestState => b"state",
            Purpose::LegacySession => b"legacy-session",
        }
    }
}

/// Why a token did not open. Never shown to clients; used for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenError {
    /// Longer than the configured cap (checked first, before any parsing).
    Oversize,
    /// Not `version.kid.body`, wrong version, bad key id syntax, bad base64, too short.
    Malformed,
    /// The key id is not (or no longer) in the ring.
    UnknownKey,
    /// Authentication failed: tampered, truncated, or sealed by a different secret.
    AuthFailed,
}

impl OpenError {
    /// The failure class of a state that does not open.
    pub fn kind(self) -> RejectionKind {
        match self {
            OpenError::Oversize => RejectionKind::StateOversize,
            OpenError::Malformed => RejectionKind::StateMalformed,
            OpenError::UnknownKey => RejectionKind::StateUnknownKey,
            OpenError::AuthFailed => RejectionKind::StateAuthFailed,
        }
    }

    pub fn reason(self) -> &'static str {
        self.kind().reason()
    }
}

fn aad(purpose: Purpose, kid: &str) -> Vec<u8> {
    let tag = purpose.tag();
    let mut v = Vec::with_capacity(AAD_PREFIX.len() + tag.len() + VERSION.len() + 2 + kid.len());
    v.extend_from_slice(AAD_PREFIX);
    v.extend_from_slice(tag);
    v.push(0);
    v.extend_from_slice(VERSION.as_bytes());
    v.push(0);
    v.extend_from_slice(kid.as_bytes());
    v
}

/// Seals a `requestState` under the ring's sealing key. Returns the token and the key id used.
pub fn seal(ring: &KeyRing, plain: &[u8]) -> (String, String) {
    seal_for(Purpose::RequestState, ring, plain)
}

/// Opens a `requestState`. `max_len` is the cap on the token's length in bytes.
pub fn open(ring: &KeyRing, token: &str, max_len: usize) -> Result<(Vec<u8>, String), OpenError> {
    open_for(Purpose::RequestState, ring, token, max_len)
}

/// Seals `plain` for `purpose` under the ring's sealing key. Returns the token and the key id.
pub fn seal_for(purpose: Purpose, ring: &KeyRing, plain: &[u8]) -> (String, String) {
    let key = ring.sealing_key();
    let mut body = Vec::with_capacity(NONCE_LEN + plain.len() + TAG_LEN);
    body.resize(NONCE_LEN, 0);
    getrandom::fill(&mut body).expect("the OS random source failed");
    body.extend_from_slice(plain);
    let (nonce, msg) = body.split_at_mut(NONCE_LEN);
    let nonce: &[u8; NONCE_LEN] = (&*nonce).try_into().expect("split at NONCE_LEN");
    let tag = key.cipher.seal_in_place(nonce, &aad(purpose, &key.id), msg);
    body.extend_from_slice(tag.as_ref());
    key.count_seal();
    let mut token =
        String::with_capacity(VERSION.len() + key.id.len() + 2 + body.len() * 4 / 3 + 4);
    token.push_str(VERSION);
    token.push('.');
    token.push_str(&key.id);
    token.push('.');
    URL_SAFE_NO_PAD.encode_append(&body, &mut token);
    (token, key.id.clone())
}

/// Opens a token sealed for `purpose`. `max_len` is the cap on the token's length in bytes.
pub fn open_for(
    purpose: Purpose,
    ring: &KeyRing,
    token: &str,
    max_len: usize,
) -> Result<(Vec<u8>, String), OpenError> {
    if token.len() > max_len {
        return Err(OpenError::Oversize);
    }
    let mut parts = token.splitn(3, '.');
    let (Some(version), Some(kid), Some(body)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(OpenError::Malformed);
    };
    if version != VERSION || !valid_key_id(kid) || body.contains('.') {
        return Err(OpenError::Malformed);
    }
    let mut raw = URL_SAFE_NO_PAD
        .decode_to_vec(body)
        .map_err(|_| OpenError::Malformed)?;
    if raw.len() < NONCE_LEN + TAG_LEN {
        return Err(OpenError::Malformed);
    }
    let key = ring.find(kid).ok_or(OpenError::UnknownKey)?;
    let (nonce, ct) = raw.split_at_mut(NONCE_LEN);
    let nonce: &[u8; NONCE_LEN] = (&*nonce).try_into().expect("split at NONCE_LEN");
    let plain_len = key
        .cipher
        .open_in_place(nonce, &aad(purpose, kid), ct)
        .ok_or(OpenError::AuthFailed)?
        .len();
    raw.truncate(NONCE_LEN + plain_len);
    raw.drain(..NONCE_LEN);
    Ok((raw, key.id.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::StateKeySpec;

    fn ring(ids: &[(&str, u8)]) -> KeyRing {
        KeyRing::new(
            &ids.iter()
                .map(|(id, b)| StateKeySpec {
                    id: id.to_string(),
                    secret: [*b; 32],
                })
                .collect::<Vec<_>>(),
        )
    }

    #[test]
    fn round_trip_and_fresh_nonces() {
        let r = ring(&[("k1", 7)]);
        let (t1, kid) = seal(&r, b"hello");
        let (t2, _) = seal(&r, b"hello");
        assert_eq!(kid, "k1");
        assert!(t1.starts_with("m1.k1."));
        assert_ne!(t1, t2, "two seals of the same text must differ");
        assert_eq!(open(&r, &t1, 1 << 16).unwrap().0, b"hello");
        assert_eq!(r.sealing_key().seal_count(), 2);
    }

    #[test]
    fn every_flipped_byte_is_rejected() {
        let r = ring(&[("k1", 7)]);
        let (t, _) = seal(&r, b"some answers");
        for i in 0..t.len() {
            let mut bytes = t.clone().into_bytes();
            // Flip to another character of the same class so the failure is not only "bad base64".
            bytes[i] = match bytes[i] {
                b'A' => b'B',
                b'.' => b'_',
                _ => b'A',
            };
            let tampered = String::from_utf8(bytes).unwrap();
            if tampered == t {
                continue;
            }
            assert!(
                open(&r, &tampered, 1 << 16).is_err(),
                "position {i} accepted"
            );
        }
    }

    #[test]
    fn truncation_and_appending_are_rejected() {
        let r = ring(&[("k1", 7)]);
        let (t, _) = seal(&r, b"some answers");
        for n in 0..t.len() {
            assert!(open(&r, &t[..n], 1 << 16).is_err(), "prefix {n} accepted");
        }
        assert!(open(&r, &format!("{t}A"), 1 << 16).is_err());
        assert!(open(&r, &format!("{t}AAAA"), 1 << 16).is_err());
        assert!(open(&r, &format!("{t}.x"), 1 << 16).is_err());
    }

    #[test]
    fn wrong_key_unknown_key_and_oversize() {
        let a = ring(&[("k1", 7)]);
        let b = ring(&[("k1", 8)]);
        let (t, _) = seal(&a, b"x");
        assert_eq!(open(&b, &t, 1 << 16), Err(OpenError::AuthFailed));
        let c = ring(&[("k2", 7)]);
        assert_eq!(open(&c, &t, 1 << 16), Err(OpenError::UnknownKey));
        assert_eq!(open(&a, &t, t.len() - 1), Err(OpenError::Oversize));
        // A key id swapped in the clear text fails authentication (it is associated data).
        let d = ring(&[("k1", 7), ("k2", 7)]);
        let swapped = t.replacen(".k1.", ".k2.", 1);
        assert_eq!(open(&d, &swapped, 1 << 16), Err(OpenError::AuthFailed));
    }

    #[test]
    fn ring_rotation_opens_old_and_seals_new() {
        let old = ring(&[("k1", 7)]);
        let (t_old, _) = seal(&old, b"x");
        let rotated = ring(&[("k2", 9), ("k1", 7)]);
        assert_eq!(open(&rotated, &t_old, 1 << 16).unwrap().1, "k1");
        let (t_new, kid) = seal(&rotated, b"y");
        assert_eq!(kid, "k2");
        let retired = ring(&[("k2", 9)]);
        assert_eq!(open(&retired, &t_old, 1 << 16), Err(OpenError::UnknownKey));
        assert!(open(&retired, &t_new, 1 << 16).is_ok());
    }

    #[test]
    fn a_token_opens_only_for_the_purpose_it_was_sealed_for() {
        let r = ring(&[("k1", 7)]);
        // The request-state associated data is the first release's, byte for byte.
        assert_eq!(
            aad(Purpose::RequestState, "k1"),
            b"mrtr-gateway/state\0m1\0k1".to_vec()
        );
        let (state, _) = seal(&r, b"x");
        let (session, _) = seal_for(Purpose::LegacySession, &r, b"x");
        assert!(open(&r, &state, 1 << 16).is_ok());
        assert!(open_for(Purpose::LegacySession, &r, &session, 1 << 16).is_ok());
        assert_eq!(
            open_for(Purpose::LegacySession, &r, &state, 1 << 16),
            Err(OpenError::AuthFailed)
        );
        assert_eq!(open(&r, &session, 1 << 16), Err(OpenError::AuthFailed));
    }

    #[test]
    fn malformed_inputs() {
        let r = ring(&[("k1", 7)]);
        for bad in [
            "",
            ".",
            "..",
            "m1..",
            "m1.k1.",
            "m2.k1.AAAA",
            "m1.k!.AAAA",
            "m1.k1.AA==",
            "m1.k1.@@@@",
        ] {
            assert_eq!(open(&r, bad, 1 << 16), Err(OpenError::Malformed), "{bad:?}");
        }
    }
}
