//! The in-process claim store: one replica's memory, bounded, never evicting a live claim.
//!
//! A `DashMap` from claim id to an entry that is either *in progress* or *done* (with the kept
//! outcome, if any), each with an expiry instant. Claiming uses the map's entry API, so the
//! check and the insert happen under one shard lock: of any number of concurrent claims of one
//! id, exactly one sees a vacant (or expired) slot.
//!
//! Bounds, each enforced here and counted by the caller:
//! - `max_entries` ids at once. A claim that would exceed it fails with [`StoreError::Full`]
//!   (fail closed). Nothing live is ever evicted to make room, because an evicted claim is a
//!   replay window; expired entries are reclaimed first (at most every [`RECLAIM_GAP`]).
//! - `max_outcome_bytes` per kept outcome and `max_total_outcome_bytes` across all of them: an
//!   outcome over either is not kept, and its duplicates are told the state was already used.
//!
//! Expiry is lazy (an expired entry counts as absent on access) and swept every
//! `sweep_interval` by a background task that holds only a weak reference, so dropping the
//! store (e.g. after a configuration reload) ends the task.
//!
//! Counting: `held` is raised *before* an insert and lowered *after* a removal, so it is never
//! below the real size and the cap is never exceeded, even under races.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use dashmap::DashMap;
use dashmap::mapref::entry::Entry as MapEntry;
use prometheus::IntGauge;
use tokio::time::{Instant, MissedTickBehavior};

use super::{Claim, Completion, StoreError};

/// Shortest gap between two sweeps run by claims that found the store full; bounds the O(n)
/// work an attacker can trigger by filling the store.
pub const RECLAIM_GAP: Duration = Duration::from_millis(100);

/// The memory store's limits (from `[single_use]`).
#[derive(Debug, Clone, Copy)]
pub struct MemoryLimits {
    pub max_entries: usize,
    pub max_outcome_bytes: usize,
    pub max_total_outcome_bytes: usize,
    pub sweep_interval: Duration,
}

/// Cheap to clone; clones share the map.
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    map: DashMap<String, Entry>,
    /// Ids in the map (an upper bound while an insert or removal is under way).
    held: AtomicUsize,
    /// Bytes of kept outcomes in the map (same convention as `held`).
    kept_bytes: AtomicUsize,
    limits: MemoryLimits,
    last_reclaim: Mutex<Option<Instant>>,
    entries_gauge: IntGauge,
}

struct Entry {
    state: State,
    expires_at: Instant,
}

enum State {
    InProgress,
    /// Finished; the outcome when it was kept.
    Done(Option<Bytes>),
}

impl Entry {
    fn kept_len(&self) -> usize {
        match &self.state {
            State::Done(Some(b)) => b.len(),
            _ => 0,
        }
    }
}

impl MemoryStore {
    /// Creates the store and starts its sweeper; must be called inside a Tokio runtime.
    pub fn new(limits: MemoryLimits, entries_gauge: IntGauge) -> MemoryStore {
        let inner = Arc::new(Inner {
            map: DashMap::new(),
            held: AtomicUsize::new(0),
            kept_bytes: AtomicUsize::new(0),
            limits,
            last_reclaim: Mutex::new(None),
            entries_gauge,
        });
        inner.entries_gauge.set(0);
        tokio::spawn(sweep_periodically(
            Arc::downgrade(&inner),
            limits.sweep_interval,
        ));
        MemoryStore { inner }
    }

    /// Claims `id` for `ttl`, or reports what holds it.
    pub fn claim(&self, id: &str, ttl: Duration) -> Result<Claim, StoreError> {
        let inner = &self.inner;
        let now = Instant::now();
        let expires_at = deadline(now, ttl);
        for attempt in 0..2 {
            match inner.map.entry(id.to_owned()) {
                MapEntry::Occupied(mut slot) => {
                    let e = slot.get_mut();
                    if e.expires_at > now {
                        return Ok(match &e.state {
                            State::InProgress => Claim::InProgress,
                            State::Done(Some(outcome)) => Claim::Done(outcome.clone()),
                            State::Done(None) => Claim::DoneNotKept,
                        });
                    }
                    // Expired but not swept yet: it is as good as absent, take it over.
                    inner.kept_bytes.fetch_sub(e.kept_len(), Ordering::AcqRel);
                    *e = Entry {
                        state: State::InProgress,
                        expires_at,
                    };
                    return Ok(Claim::Acquired);
                }
                MapEntry::Vacant(slot) => {
                    if inner.reserve_entry() {
                        slot.insert(Entry {
                            state: State::InProgress,
                            expires_at,
                        });
                        inner.publish_len();
                        return Ok(Claim::Acquired);
                    }
                    // Full. The shard lock is released at the end of this arm, before any
                    // sweep takes every shard lock in turn.
                }
            }
            if attempt == 0 && !inner.reclaim_when_full(now) {
                break;
            }
        }
        Err(StoreError::Full {
            retry_after: inner.limits.sweep_interval,
        })
    }

    /// Records how the claim on `id` ended; `outcome` is kept for `ttl` when it fits.
    pub fn complete(&self, id: &str, outcome: Option<&[u8]>, ttl: Duration) -> Completion {
        let inner = &self.inner;
        // Copy before taking the shard lock; an outcome too large to keep is never copied.
        let copy = outcome
            .filter(|b| b.len() <= inner.limits.max_outcome_bytes)
            .map(Bytes::copy_from_slice);
        let now = Instant::now();
        let Some(mut e) = inner.map.get_mut(id) else {
            return Completion::NoClaim;
        };
        if e.expires_at <= now || !matches!(e.state, State::InProgress) {
            return Completion::NoClaim;
        }
        let (kept, result) = match (outcome, copy) {
            (None, _) => (None, Completion::NoOutcome),
            (Some(_), None) => (None, Completion::TooLarge),
            (Some(_), Some(b)) if inner.reserve_bytes(b.len()) => (Some(b), Completion::Kept),
            (Some(_), Some(_)) => (None, Completion::OverTotal),
        };
        *e = Entry {
            state: State::Done(kept),
            expires_at: deadline(now, ttl),
        };
        result
    }

    /// Gives back a claim still in progress; true when there was one.
    pub fn release(&self, id: &str) -> bool {
        let removed = self
            .inner
            .map
            .remove_if(id, |_, e| matches!(e.state, State::InProgress))
            .is_some();
        if removed {
            self.inner.held.fetch_sub(1, Ordering::AcqRel);
            self.inner.publish_len();
        }
        removed
    }

    /// Ids held (claims in progress and finished ones not yet swept).
    pub fn len(&self) -> usize {
        self.inner.held.load(Ordering::Acquire)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of kept outcomes held.
    pub fn kept_bytes(&self) -> usize {
        self.inner.kept_bytes.load(Ordering::Acquire)
    }

    /// Removes every expired entry now; returns how many went.
    pub fn sweep_expired(&self) -> usize {
        self.inner.sweep(Instant::now())
    }
}

impl Inner {
    fn reserve_entry(&self) -> bool {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limits.max_entries).then_some(n + 1)
            })
            .is_ok()
    }

    fn reserve_bytes(&self, len: usize) -> bool {
        self.kept_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                n.checked_add(len)
                    .filter(|total| *total <= self.limits.max_total_outcome_bytes)
            })
            .is_ok()
    }

    /// Sweeps when the store is full, unless another sweep ran within [`RECLAIM_GAP`] or is
    /// running; true when something was freed.
    fn reclaim_when_full(&self, now: Instant) -> bool {
        let Ok(mut last) = self.last_reclaim.try_lock() else {
            return false;
        };
        if last.is_some_and(|t| now.duration_since(t) < RECLAIM_GAP) {
            return false;
        }
        *last = Some(now);
        drop(last);
        self.sweep(now) > 0
    }

    fn sweep(&self, now: Instant) -> usize {
        let mut removed = 0;
        let mut freed = 0;
        self.map.retain(|_, e| {
            if e.expires_at > now {
                return true;
            }
            removed += 1;
            freed += e.kept_len();
            false
        });
        self.held.fetch_sub(removed, Ordering::AcqRel);
        self.kept_bytes.fetch_sub(freed, Ordering::AcqRel);
        self.publish_len();
        removed
    }

    fn publish_len(&self) {
        let n = self.held.load(Ordering::Acquire);
        self.entries_gauge.set(i64::try_from(n).unwrap_or(i64::MAX));
    }
}

/// `now + ttl`, saturating far in the future instead of overflowing.
fn deadline(now: Instant, ttl: Duration) -> Instant {
    now.checked_add(ttl)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600))
}

/// Sweeps every `every` until the store is dropped. The O(n) pass runs on the blocking pool
/// so that a large map never stalls a runtime worker.
async fn sweep_periodically(store: Weak<Inner>, every: Duration) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        let Some(inner) = store.upgrade() else {
            return;
        };
        let swept = tokio::task::spawn_blocking(move || inner.sweep(Instant::now())).await;
        if let Ok(n) = swept
            && n > 0
        {
            tracing::debug!(swept = n, "expired single-use entries removed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    fn store(max_entries: usize, sweep_interval: Duration) -> MemoryStore {
        MemoryStore::new(
            MemoryLimits {
                max_entries,
                max_outcome_bytes: 16,
                max_total_outcome_bytes: 40,
                sweep_interval,
            },
            IntGauge::new("entries", "test").unwrap(),
        )
    }

    /// Awaits `cond`, checking every few milliseconds, failing after `limit`.
    async fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) {
        tokio::time::timeout(limit, async {
            while !cond() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("condition not reached in time");
    }

    #[tokio::test]
    async fn claim_then_duplicates_see_progress_then_the_kept_outcome() {
        let s = store(10, MINUTE);
        assert_eq!(s.claim("a", MINUTE).unwrap(), Claim::Acquired);
        assert_eq!(s.claim("a", MINUTE).unwrap(), Claim::InProgress);
        assert_eq!(
            s.complete("a", Some(br#"{"ok":1}"#), MINUTE),
            Completion::Kept
        );
        assert_eq!(
            s.claim("a", MINUTE).unwrap(),
            Claim::Done(Bytes::from_static(br#"{"ok":1}"#))
        );
        assert_eq!(s.kept_bytes(), 8);
        // A second completion of a finished claim changes nothing.
        assert_eq!(s.complete("a", Some(b"other"), MINUTE), Completion::NoClaim);
        assert_eq!(
            s.claim("a", MINUTE).unwrap(),
            Claim::Done(Bytes::from_static(br#"{"ok":1}"#))
        );
        // Other ids are independent.
        assert_eq!(s.claim("b", MINUTE).unwrap(), Claim::Acquired);
        assert_eq!(s.len(), 2);
    }

    #[tokio::test]
    async fn outcomes_over_either_bound_or_absent_are_not_kept() {
        let s = store(10, MINUTE);
        s.claim("big", MINUTE).unwrap();
        assert_eq!(
            s.complete("big", Some(&[b'x'; 17]), MINUTE),
            Completion::TooLarge
        );
        assert_eq!(s.claim("big", MINUTE).unwrap(), Claim::DoneNotKept);

        s.claim("none", MINUTE).unwrap();
        assert_eq!(s.complete("none", None, MINUTE), Completion::NoOutcome);
        assert_eq!(s.claim("none", MINUTE).unwrap(), Claim::DoneNotKept);

        // 16 + 16 fit in the 40-byte total; a third 16-byte outcome does not.
        for id in ["t1", "t2", "t3"] {
            s.claim(id, MINUTE).unwrap();
        }
        assert_eq!(s.complete("t1", Some(&[1; 16]), MINUTE), Completion::Kept);
        assert_eq!(s.complete("t2", Some(&[2; 16]), MINUTE), Completion::Kept);
        assert_eq!(
            s.complete("t3", Some(&[3; 16]), MINUTE),
            Completion::OverTotal
        );
        assert_eq!(s.claim("t3", MINUTE).unwrap(), Claim::DoneNotKept);
        assert_eq!(s.kept_bytes(), 32);
    }

    #[tokio::test]
    async fn release_makes_the_id_claimable_again_but_never_undoes_a_finished_claim() {
        let s = store(10, MINUTE);
        s.claim("a", MINUTE).unwrap();
        assert!(s.release("a"));
        assert_eq!(s.len(), 0);
        assert_eq!(s.claim("a", MINUTE).unwrap(), Claim::Acquired);
        s.complete("a", Some(b"1"), MINUTE);
        assert!(!s.release("a"));
        assert_eq!(
            s.claim("a", MINUTE).unwrap(),
            Claim::Done(Bytes::from_static(b"1"))
        );
        assert!(!s.release("never-claimed"));
        assert_eq!(
            s.complete("never-claimed", None, MINUTE),
            Completion::NoClaim
        );
    }

    #[tokio::test]
    async fn expired_entries_are_claimable_and_swept() {
        let s = store(10, Duration::from_millis(20));
        let ttl = Duration::from_millis(50);
        let until = Instant::now() + ttl;
        s.claim("p", ttl).unwrap();
        s.claim("d", ttl).unwrap();
        s.complete("d", Some(b"x"), ttl);
        assert_eq!(s.claim("p", ttl).unwrap(), Claim::InProgress);
        tokio::time::sleep_until(until).await;
        // Lazy expiry: an expired claim is taken over even before the sweeper ran.
        assert_eq!(s.claim("p", MINUTE).unwrap(), Claim::Acquired);
        // The sweeper removes the expired "d" (and its kept bytes) but not the fresh "p".
        eventually(Duration::from_secs(5), || s.len() == 1).await;
        assert_eq!(s.kept_bytes(), 0);
        assert_eq!(s.claim("p", MINUTE).unwrap(), Claim::InProgress);
        assert_eq!(s.claim("d", MINUTE).unwrap(), Claim::Acquired);
    }

    #[tokio::test]
    async fn a_full_store_refuses_and_never_evicts_a_live_claim() {
        let s = store(3, MINUTE);
        s.claim("a", MINUTE).unwrap();
        s.claim("b", MINUTE).unwrap();
        s.claim("c", MINUTE).unwrap();
        s.complete("c", Some(b"kept"), MINUTE);
        let err = s.claim("d", MINUTE).unwrap_err();
        assert_eq!(
            err,
            StoreError::Full {
                retry_after: MINUTE
            }
        );
        // Refused claims do not disturb the held ones.
        assert_eq!(s.claim("a", MINUTE).unwrap(), Claim::InProgress);
        assert_eq!(s.claim("b", MINUTE).unwrap(), Claim::InProgress);
        assert_eq!(
            s.claim("c", MINUTE).unwrap(),
            Claim::Done(Bytes::from_static(b"kept"))
        );
        assert_eq!(s.len(), 3);
        // Releasing one makes room for exactly one more.
        assert!(s.release("a"));
        assert_eq!(s.claim("d", MINUTE).unwrap(), Claim::Acquired);
        assert!(matches!(s.claim("e", MINUTE), Err(StoreError::Full { .. })));
    }

    #[tokio::test]
    async fn a_full_store_reclaims_expired_entries_first() {
        // The sweeper is far away: only the reclaim-on-full path can free the slots.
        let s = store(2, Duration::from_secs(3600));
        let short = Duration::from_millis(30);
        let until = Instant::now() + short;
        s.claim("old1", short).unwrap();
        s.claim("old2", short).unwrap();
        assert!(matches!(
            s.claim("new", MINUTE),
            Err(StoreError::Full { .. })
        ));
        // That refusal swept (finding nothing); the next sweep may run RECLAIM_GAP later.
        tokio::time::sleep_until(until.max(Instant::now() + RECLAIM_GAP)).await;
        assert_eq!(s.claim("new", MINUTE).unwrap(), Claim::Acquired);
        assert_eq!(s.len(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fifty_concurrent_claims_of_one_id_acquire_once() {
        let s = store(100, MINUTE);
        let barrier = Arc::new(tokio::sync::Barrier::new(50));
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..50 {
            let (s, barrier) = (s.clone(), barrier.clone());
            tasks.spawn(async move {
                barrier.wait().await;
                s.claim("same", MINUTE).unwrap()
            });
        }
        let results = tasks.join_all().await;
        let acquired = results.iter().filter(|c| **c == Claim::Acquired).count();
        assert_eq!(acquired, 1, "{results:?}");
        assert_eq!(
            results.iter().filter(|c| **c == Claim::InProgress).count(),
            49
        );
        assert_eq!(s.len(), 1);
    }

    #[tokio::test]
    async fn the_sweeper_does_not_keep_a_dropped_store_alive() {
        let s = store(10, Duration::from_secs(3600));
        let weak = Arc::downgrade(&s.inner);
        drop(s);
        assert!(weak.upgrade().is_none());
    }
}
