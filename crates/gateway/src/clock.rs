//! The wall clock the MRTR engine reads (state expiry, claim lifetimes), with a seam for tests.
//!
//! Replicas compare a state's `exp` with their own clocks, which may differ by up to
//! `state.clock_skew`. To test what that does to at-most-once, two in-process gateways must
//! disagree about the time: [`Clock::offset`] is a clock that runs a fixed number of seconds
//! ahead of (or behind) the system's. Production uses [`Clock::system`].

use std::time::{SystemTime, UNIX_EPOCH};

/// Unix seconds now, by the system clock.
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Unix seconds, optionally shifted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Clock {
    offset_secs: i64,
}

impl Clock {
    /// The system clock.
    pub const fn system() -> Clock {
        Clock { offset_secs: 0 }
    }

    /// The system clock shifted by `offset_secs` (negative: behind), standing for a replica
    /// whose clock differs.
    pub const fn offset(offset_secs: i64) -> Clock {
        Clock { offset_secs }
    }

    /// Unix seconds now, by this clock.
    pub fn now_secs(&self) -> u64 {
        now_secs().saturating_add_signed(self.offset_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_offset_clock_differs_from_the_system_by_its_offset() {
        let (system, behind) = (Clock::system(), Clock::offset(-30));
        let (a, b) = (system.now_secs(), behind.now_secs());
        // The two reads may straddle a second boundary.
        assert!((29..=31).contains(&(a - b)), "{a} {b}");
        assert_eq!(Clock::default(), Clock::system());
    }
}
