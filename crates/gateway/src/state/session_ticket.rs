//! Sealed legacy session ids, for the dual-era front (`front::legacy_passthrough`).
//!
//! A legacy client on the gateway's endpoint gets a session id the gateway minted, not the
//! legacy server's: the server's id `S`, the caller's principal and the time of issue, sealed
//! under the state key ring with the "legacy-session" purpose (see [`super::seal`]). Any
//! replica holding the ring opens it back to `S`, so a legacy session needs neither sticky
//! routing nor a shared store, and a client cannot aim its requests at someone else's
//! session: it cannot mint a ticket, and a ticket issued to another principal is refused.
//!
//! Tickets carry no expiry of their own: the legacy server decides how long `S` lives (an
//! expired `S` gets its 404 from the server), and removing a key from the ring retires every
//! ticket sealed under it. Opening is capped at `state.max_bytes`, like a `requestState`.

use serde::{Deserialize, Serialize};

use super::seal::{self, Purpose};
use super::{StateCodec, StateError, TooLarge};

/// What a sealed legacy session id holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionTicket {
    /// The legacy server's `Mcp-Session-Id`.
    #[serde(rename = "ups")]
    pub upstream_session: String,
    /// Who initialized the session.
    #[serde(rename = "prn")]
    pub principal: String,
    /// Unix seconds (logs and inspection).
    #[serde(rename = "iat")]
    pub issued_at: u64,
}

impl StateCodec {
    /// Seals a ticket into a session id for the client.
    pub fn seal_session(&self, ticket: &SessionTicket) -> Result<String, TooLarge> {
        let plain = serde_json::to_vec(ticket).expect("a ticket serializes");
        let (token, _kid) = seal::seal_for(Purpose::LegacySession, &self.ring(), &plain);
        let limit = self.limits().max_bytes;
        if token.len() > limit {
            return Err(TooLarge {
                size: token.len(),
                limit,
            });
        }
        Ok(token)
    }

    /// Opens a session id the gateway issued.
    pub fn open_session(&self, token: &str) -> Result<SessionTicket, StateError> {
        let (plain, _kid) = seal::open_for(
            Purpose::LegacySession,
            &self.ring(),
            token,
            self.limits().max_bytes,
        )
        .map_err(StateError::Open)?;
        serde_json::from_slice(&plain).map_err(|_| StateError::BadPayload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::OpenError;
    use crate::state::StateKeySpec;
    use std::time::Duration;

    fn codec(secret: u8) -> StateCodec {
        StateCodec::new(
            &[StateKeySpec {
                id: "k1".into(),
                secret: [secret; 32],
            }],
            Duration::from_secs(600),
            4096,
        )
    }

    fn ticket() -> SessionTicket {
        SessionTicket {
            upstream_session: "abc123".into(),
            principal: "alice".into(),
            issued_at: 1_000,
        }
    }

    #[test]
    fn tickets_round_trip_on_any_codec_with_the_key() {
        let token = codec(1).seal_session(&ticket()).unwrap();
        assert!(token.starts_with("m1.k1."));
        assert!(token.bytes().all(|b| b.is_ascii_graphic()), "header-safe");
        assert_eq!(codec(1).open_session(&token).unwrap(), ticket());
        assert_eq!(
            codec(2).open_session(&token),
            Err(StateError::Open(OpenError::AuthFailed))
        );
    }

    #[test]
    fn states_and_tickets_never_stand_in_for_each_other() {
        let c = codec(1);
        let state = c.fresh_payload("alice", "digest", 1_000);
        let (state_token, _) = c.seal(&state).unwrap();
        assert_eq!(
            c.open_session(&state_token),
            Err(StateError::Open(OpenError::AuthFailed))
        );
        let ticket_token = c.seal_session(&ticket()).unwrap();
        assert_eq!(
            c.open(&ticket_token, 1_000).unwrap_err(),
            StateError::Open(OpenError::AuthFailed)
        );
    }

    #[test]
    fn an_oversized_upstream_id_is_refused_at_seal_time() {
        let big = SessionTicket {
            upstream_session: "s".repeat(5000),
            ..ticket()
        };
        assert!(codec(1).seal_session(&big).is_err());
    }
}
