//! How a pool every caller draws from is divided between callers, the same way for each pool:
//! listen streams, passed-through legacy GET streams, parked calls, single-use entries and
//! idle legacy sessions.
//!
//! Three numbers describe a pool ([`FairShare`]):
//! - `size`, the pool itself (`subscriptions.max_streams`, `parking.max_calls`, …): when it is
//!   full, nobody gets a place (503: the replica is full).
//! - `per_caller`, the most one caller ([`crate::caller_scope::Caller`]) may hold, from the very
//!   first place (429: the caller's own doing). A pool's `*_per_principal` key sets it; unset,
//!   it is `quotas.caller_share` of the pool, so the default can never exceed the pool, and
//!   four callers at their share fill it at the default of a quarter.
//! - `reserve`, places only a caller holding nothing in this pool may take
//!   (`quotas.newcomer_reserve` of the pool, at least one): however many callers sit at their
//!   share, a caller that arrives later still gets a first place (429 for a caller that holds
//!   some already and would eat into the reserve).
//!
//! The idle-session pool uses `size` and `per_caller` only: it evicts instead of refusing (the
//! least recently used session of the caller at its share, or of the whole pool), so a newcomer
//! always gets room and the reserve is not needed there.
//!
//! A configured share so large that it never binds (at least the pool less its reserve) makes
//! the quota ineffective: [`FairShare::ineffective`], which `check-config` reports.

/// Default `quotas.caller_share`.
pub const DEFAULT_CALLER_SHARE: f64 = 0.25;
/// Default `quotas.newcomer_reserve`.
pub const DEFAULT_NEWCOMER_RESERVE: f64 = 0.125;

/// The fractions every pool is divided by (`[quotas]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fractions {
    /// Of each pool, what one caller may hold where the pool's own key does not say.
    pub caller_share: f64,
    /// Of each pool, what only callers holding nothing there may take (0: no reserve).
    pub newcomer_reserve: f64,
}

impl Default for Fractions {
    fn default() -> Self {
        Fractions {
            caller_share: DEFAULT_CALLER_SHARE,
            newcomer_reserve: DEFAULT_NEWCOMER_RESERVE,
        }
    }
}

/// One pool's division (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FairShare {
    pub size: usize,
    pub per_caller: usize,
    pub reserve: usize,
    /// The share was set by the pool's own key rather than derived from the fractions.
    pub configured: bool,
}

/// Why a place was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShareRefusal {
    /// The pool is full (503).
    Full,
    /// The caller holds its share (429).
    CallerShare,
    /// The caller holds places already and only the newcomers' reserve is left (429).
    Reserve,
}

impl FairShare {
    /// The division of a pool of `size` places: `configured` is the pool's own per-caller key
    /// (at most the pool), otherwise `fractions.caller_share` of it; the reserve is
    /// `fractions.newcomer_reserve` of it, at least one place unless the fraction is zero,
    /// and always less than the pool.
    pub fn of(size: usize, configured: Option<usize>, fractions: Fractions) -> FairShare {
        let part = |f: f64| ((size as f64) * f).floor() as usize;
        let per_caller = match configured {
            Some(n) => n.min(size),
            None => part(fractions.caller_share).max(1).min(size),
        };
        let reserve = if fractions.newcomer_reserve <= 0.0 {
            0
        } else {
            part(fractions.newcomer_reserve)
                .max(1)
                .min(size.saturating_sub(1))
        };
        FairShare {
            size,
            per_caller,
            reserve,
            configured: configured.is_some(),
        }
    }

    /// A pool without per-caller limits (tests, and pools nobody shares).
    pub fn unshared(size: usize) -> FairShare {
        FairShare {
            size,
            per_caller: usize::MAX,
            reserve: 0,
            configured: false,
        }
    }

    /// Whether one more place may go to a caller holding `mine` while `taken` are held in all.
    /// A full pool is the replica's answer first (503), whoever asks.
    pub fn admit(&self, taken: usize, mine: usize) -> Result<(), ShareRefusal> {
        if taken >= self.size {
            return Err(ShareRefusal::Full);
        }
        if mine >= self.per_caller {
            return Err(ShareRefusal::CallerShare);
        }
        if mine > 0 && self.size - taken <= self.reserve {
            return Err(ShareRefusal::Reserve);
        }
        Ok(())
    }

    /// A configured share that never binds: one caller could take everything but the reserve.
    pub fn ineffective(&self) -> bool {
        self.configured && self.size > 1 && self.per_caller >= self.size - self.reserve
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_share_is_a_fraction_of_the_pool_and_never_exceeds_it() {
        let f = Fractions::default();
        let s = FairShare::of(8, None, f);
        assert_eq!((s.per_caller, s.reserve), (2, 1));
        assert_eq!(FairShare::of(20, None, f).per_caller, 5);
        // A tiny pool still gives a caller one place, and keeps one of two for newcomers.
        assert_eq!(FairShare::of(1, None, f).per_caller, 1);
        assert_eq!(FairShare::of(1, None, f).reserve, 0);
        assert_eq!(FairShare::of(2, None, f).reserve, 1);
        // A configured share above the pool acts as the pool, and says it has no effect.
        let wide = FairShare::of(20, Some(10_000), f);
        assert_eq!(wide.per_caller, 20);
        assert!(wide.ineffective());
        assert!(!FairShare::of(20, Some(5), f).ineffective());
        assert!(!FairShare::of(20, None, f).ineffective());
        let none = Fractions {
            newcomer_reserve: 0.0,
            ..f
        };
        assert_eq!(FairShare::of(8, None, none).reserve, 0);
    }

    #[test]
    fn a_caller_is_held_to_its_share_from_the_first_place_and_newcomers_keep_room() {
        let s = FairShare::of(8, Some(2), Fractions::default());
        let mut held = [0usize; 6];
        let mut taken = 0;
        let mut take = |who: usize, held: &mut [usize; 6]| {
            let r = s.admit(taken, held[who]);
            if r.is_ok() {
                held[who] += 1;
                taken += 1;
            }
            r
        };
        // Three callers take their share; a third place is refused at once.
        for who in 0..3 {
            assert_eq!(take(who, &mut held), Ok(()));
            assert_eq!(take(who, &mut held), Ok(()));
            assert_eq!(take(who, &mut held), Err(ShareRefusal::CallerShare));
        }
        // A fourth caller gets a first place; its second would eat the reserve.
        assert_eq!(take(3, &mut held), Ok(()));
        assert_eq!(take(3, &mut held), Err(ShareRefusal::Reserve));
        // The reserve goes to a fifth caller, who holds nothing yet.
        assert_eq!(take(4, &mut held), Ok(()));
        assert_eq!(take(5, &mut held), Err(ShareRefusal::Full));
    }
}
