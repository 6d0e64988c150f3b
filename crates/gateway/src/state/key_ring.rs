//! The state key ring: the first key seals, every key opens.
//!
//! Rotation is "add the new key first, keep the old ones until every state sealed under them
//! has expired, then remove them" (see `docs/operations.md`). The ring is immutable; a reload
//! builds a new ring and swaps it in whole, so a request sees one consistent ring.

use std::sync::atomic::{AtomicU64, Ordering};

use super::xaes::Xaes;

/// One state key as configured: its id (in every token) and its 32-byte secret.
#[derive(Debug, Clone)]
pub struct StateKeySpec {
    pub id: String,
    pub secret: [u8; 32],
}

/// Key ids appear in every token: keep them short and URL-safe.
pub fn valid_key_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 32
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

pub struct RingKey {
    pub id: String,
    pub(crate) cipher: Xaes,
    seals: AtomicU64,
}

impl RingKey {
    /// How many states this key has sealed since the process started.
    pub fn seal_count(&self) -> u64 {
        self.seals.load(Ordering::Relaxed)
    }

    pub(crate) fn count_seal(&self) -> u64 {
        self.seals.fetch_add(1, Ordering::Relaxed) + 1
    }
}

pub struct KeyRing {
    keys: Vec<RingKey>,
}

impl std::fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyRing").field("ids", &self.ids()).finish()
    }
}

impl KeyRing {
    /// Builds a ring; `specs` must be non-empty with unique ids (the config loader checks).
    pub fn new(specs: &[StateKeySpec]) -> KeyRing {
        assert!(!specs.is_empty(), "a key ring needs at least one key");
        KeyRing {
            keys: specs
                .iter()
                .map(|s| RingKey {
                    id: s.id.clone(),
                    cipher: Xaes::new(&s.secret),
                    seals: AtomicU64::new(0),
                })
                .collect(),
        }
    }

    /// The key that seals new states.
    pub fn sealing_key(&self) -> &RingKey {
        &self.keys[0]
    }

    pub fn find(&self, id: &str) -> Option<&RingKey> {
        self.keys.iter().find(|k| k.id == id)
    }

    pub fn ids(&self) -> Vec<&str> {
        self.keys.iter().map(|k| k.id.as_str()).collect()
    }

    pub fn keys(&self) -> impl Iterator<Item = &RingKey> {
        self.keys.iter()
    }
}
