//! `requestState`: what it holds ([`payload`]), how it is sealed ([`seal`]), the keys
//! ([`key_ring`]), and [`StateCodec`], which adds size caps and expiry around them. The same
//! ring and seam seal the dual-era front's legacy session ids ([`session_ticket`]).

pub mod key_ring;
pub mod payload;
pub mod seal;
pub mod session_ticket;
pub mod xaes;

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

pub use key_ring::{KeyRing, StateKeySpec, valid_key_id};
pub use payload::{Answer, InputKind, ParkRef, Pending, StatePayload};
pub use seal::OpenError;
pub use session_ticket::SessionTicket;

use crate::error::RejectionKind;

/// Why a presented state was refused (logs and metrics only; clients see one message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateError {
    Open(OpenError),
    /// Authentic but not a payload this version understands.
    BadPayload,
    /// Past its expiry (plus the allowed clock skew).
    Expired,
    /// Issued for another request (method, name, arguments, URI differ).
    WrongOrigin,
    /// Issued to another principal.
    WrongPrincipal,
    /// Not a string.
    NotAString,
}

impl StateError {
    /// The failure class (the client is told the same for every one).
    pub fn kind(self) -> RejectionKind {
        match self {
            StateError::Open(e) => e.kind(),
            StateError::BadPayload => RejectionKind::StateBadPayload,
            StateError::Expired => RejectionKind::StateExpired,
            StateError::WrongOrigin => RejectionKind::StateWrongOrigin,
            StateError::WrongPrincipal => RejectionKind::StateWrongPrincipal,
            StateError::NotAString => RejectionKind::StateNotAString,
        }
    }

    pub fn reason(self) -> &'static str {
        self.kind().reason()
    }
}

/// A state token that would exceed `state.max_bytes`.
#[derive(Debug, Clone, Copy)]
pub struct TooLarge {
    pub size: usize,
    pub limit: usize,
}

/// The limits a codec applies; replaced whole on reload.
#[derive(Debug, Clone, Copy)]
pub struct StateLimits {
    pub ttl: Duration,
    pub max_bytes: usize,
    /// Tolerated clock difference between replicas when checking `exp` and `iat`.
    pub clock_skew: Duration,
}

/// Seals and opens states with the current key ring, enforcing size and expiry.
pub struct StateCodec {
    ring: ArcSwap<KeyRing>,
    limits: ArcSwap<StateLimits>,
}

pub use crate::clock::now_secs;

impl StateCodec {
    pub fn new(keys: &[StateKeySpec], ttl: Duration, max_bytes: usize) -> StateCodec {
        StateCodec {
            ring: ArcSwap::from_pointee(KeyRing::new(keys)),
            limits: ArcSwap::from_pointee(StateLimits {
                ttl,
                max_bytes,
                clock_skew: Duration::from_secs(30),
            }),
        }
    }

    pub fn with_clock_skew(self, clock_skew: Duration) -> StateCodec {
        let limits = StateLimits {
            clock_skew,
            ..self.limits()
        };
        self.set_limits(limits);
        self
    }

    pub fn limits(&self) -> StateLimits {
        **self.limits.load()
    }

    pub fn set_limits(&self, limits: StateLimits) {
        self.limits.store(Arc::new(limits));
    }

    pub fn ring(&self) -> Arc<KeyRing> {
        self.ring.load_full()
    }

    /// Swaps in a new key ring (rotation); states in flight keep opening if their key stays.
    pub fn replace_ring(&self, ring: KeyRing) {
        self.ring.store(Arc::new(ring));
    }

    /// Seals a payload. Returns the token and the sealing key id.
    pub fn seal(&self, payload: &StatePayload) -> Result<(String, String), TooLarge> {
        let plain = serde_json::to_vec(payload).expect("state payload serializes");
        let (token, kid) = seal::seal(&self.ring.load(), &plain);
        let limit = self.limits().max_bytes;
        if token.len() > limit {
            return Err(TooLarge {
                size: token.len(),
                limit,
            });
        }
        Ok((token, kid))
    }

    /// Opens a token and checks its expiry against `now` (Unix seconds).
    pub fn open(&self, token: &str, now: u64) -> Result<(StatePayload, String), StateError> {
        let (payload, kid) = self.open_ignoring_expiry(token)?;
        let skew = self.limits().clock_skew.as_secs();
        if now > payload.exp.saturating_add(skew) || payload.iat > now.saturating_add(skew) {
            return Err(StateError::Expired);
        }
        Ok((payload, kid))
    }

    /// Authenticates and decodes a token without judging its expiry (operators' inspection).
    pub fn open_ignoring_expiry(&self, token: &str) -> Result<(StatePayload, String), StateError> {
        let (plain, kid) = seal::open(&self.ring.load(), token, self.limits().max_bytes)
            .map_err(StateError::Open)?;
        let payload: StatePayload =
            serde_json::from_slice(&plain).map_err(|_| StateError::BadPayload)?;
        Ok((payload, kid))
    }

    /// A new payload for a first round, expiring `ttl` from now.
    pub fn fresh_payload(&self, principal: &str, origin: &str, now: u64) -> StatePayload {
        StatePayload {
            id: payload::random_id(),
            iat: now,
            exp: now + self.limits().ttl.as_secs().max(1),
            prn: principal.to_string(),
            org: origin.to_string(),
            rnd: 0,
            ans: Default::default(),
            pnd: Default::default(),
            park: None,
            run: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codec() -> StateCodec {
        StateCodec::new(
            &[StateKeySpec {
                id: "k1".into(),
                secret: [5; 32],
            }],
            Duration::from_secs(600),
            4096,
        )
    }

    #[test]
    fn payload_round_trips_and_expires() {
        let c = codec();
        let mut p = c.fresh_payload("anonymous", "digest", 1_000);
        p.ans.insert(
            "elicit-1".into(),
            serde_json::json!({"action":"accept"}).into(),
        );
        p.pnd.insert(
            "roots-2".into(),
            Pending {
                kind: InputKind::Roots,
                elicitation_id: None,
                shape: None,
            },
        );
        let (t, _) = c.seal(&p).unwrap();
        assert_eq!(c.open(&t, 1_001).unwrap().0, p);
        assert_eq!(c.open(&t, 1_600 + 30).unwrap().0, p, "within skew");
        assert_eq!(c.open(&t, 1_600 + 31).unwrap_err(), StateError::Expired);
        assert_eq!(
            c.open(&t, 1_000 - 31).unwrap_err(),
            StateError::Expired,
            "issued in the future"
        );
    }

    #[test]
    fn oversize_payload_is_refused_at_seal_time() {
        let c = codec();
        let mut p = c.fresh_payload("anonymous", "digest", 1_000);
        p.ans
            .insert("big".into(), serde_json::json!("x".repeat(5000)).into());
        let e = c.seal(&p).unwrap_err();
        assert!(e.size > e.limit && e.limit == 4096);
    }

    #[test]
    fn authentic_garbage_is_a_bad_payload() {
        let c = codec();
        let (t, _) = seal::seal(&c.ring(), b"{\"not\":\"a payload\"}");
        assert_eq!(c.open(&t, 1).unwrap_err(), StateError::BadPayload);
    }
}
