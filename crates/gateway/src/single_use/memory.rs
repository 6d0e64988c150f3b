//! The in-process claim store: one replica's memory, bounded, never evicting a live claim.
//!
//! A `DashMap` from claim id to an entry in one of three phases (see the module docs of
//! [`super`]): *claimed* by an owner that has not started the call (with a short lease),
//! *started* (the call may have run; never run again), or *done* (with the kept outcome, if
//! any); each with an expiry instant. Claiming uses the map's entry API, so the check and the
//! insert happen under one shard lock: of any number of concurrent claims of one id, exactly
//! one acquires it.
//!
//! Bounds, each enforced here and counted by the caller:
//! - `max_entries` ids at once. A claim that would exceed it fails with [`StoreError::Full`]
//!   (fail closed). Nothing live is ever evicted to make room, because an evicted claim is a
//!   replay window; expired entries are reclaimed first (at most every [`RECLAIM_GAP`]).
//! - `max_entries_per_principal` ids per caller (claims and kept outcomes alike), so that one
//!   caller cannot fill the store and lock everyone else out: once the store is half full, a
//!   claim beyond it fails with [`StoreError::PrincipalQuota`]. Below half there is room for
//!   everyone, and nobody to protect: refusing then would only turn a single busy caller (all
//!   traffic through one proxy, say) away from an empty store. The caller is the principal, or
//!   for anonymous callers the principal and the source address
//!   ([`crate::caller_scope::Caller`]).
//! - `max_outcome_bytes` per kept outcome and `max_total_outcome_bytes` across all of them: an
//!   outcome over either is not kept, and its duplicates are told the state was already used.
//!
//! The limits can change while the store runs ([`MemoryStore::set_limits`], used by a
//! configuration reload): claims already held are kept, and a lowered limit only refuses new
//! claims until enough entries expire.
//!
//! Expiry is lazy (an expired entry counts as absent on access) and swept every
//! `sweep_interval` by a background task that holds only a weak reference, so dropping the
//! store ends the task.
//!
//! Counting: `held` is raised *before* an insert and lowered *after* a removal, so it is never
//! below the real size and the cap is never exceeded, even under races. The per-principal
//! counts are changed under the shard lock of the entry they count.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use dashmap::DashMap;
use dashmap::mapref::entry::Entry as MapEntry;
use prometheus::IntGauge;
use tokio::time::Instant;

use super::{Claim, Completion, Owner, StoreError};

/// Shortest gap between two sweeps run by claims that found the store full; bounds the O(n)
/// work an attacker can trigger by filling the store.
pub const RECLAIM_GAP: Duration = Duration::from_millis(100);

/// The memory store's limits (from `[single_use]`).
#[derive(Debug, Clone, Copy)]
pub struct MemoryLimits {
    pub max_entries: usize,
    pub max_entries_per_principal: usize,
    pub max_outcome_bytes: usize,
    pub max_total_outcome_bytes: usize,
    pub sweep_interval: Duration,
    /// How long a claim whose owner has not started its call keeps others out.
    pub claim_lease: Duration,
}

/// Cheap to clone; clones share the map.
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    map: DashMap<String, Entry>,
    /// Ids held per caller.
    per_principal: DashMap<Arc<str>, usize>,
    /// Ids in the map (an upper bound while an insert or removal is under way).
    held: AtomicUsize,
    /// Bytes of kept outcomes in the map (same convention as `held`).
    kept_bytes: AtomicUsize,
    limits: ArcSwap<MemoryLimits>,
    last_reclaim: Mutex<Option<Instant>>,
    entries_gauge: IntGauge,
}

struct Entry {
    phase: Phase,
    expires_at: Instant,
    /// The caller the id counts against.
    principal: Arc<str>,
}

enum Phase {
    /// Owned by `owner`, whose call has not started; another claim may take it over once
    /// `lease_until` has passed.
    Claimed {
        owner: Arc<str>,
        lease_until: Instant,
    },
    /// `owner`'s call may have reached the legacy server: it never runs again. Until
    /// `lease_until` its outcome is awaited; after it, with none recorded, it is lost.
    Started {
        owner: Arc<str>,
        lease_until: Instant,
    },
    /// Finished; the outcome when it was kept.
    Done(Option<Bytes>),
}

impl Entry {
    fn kept_len(&self) -> usize {
        match &self.phase {
            Phase::Done(Some(b)) => b.len(),
            _ => 0,
        }
    }

    /// What a claim (or a look) finds in a live entry.
    fn found(&self, now: Instant) -> Claim {
        match &self.phase {
            Phase::Claimed { .. } => Claim::InProgress,
            Phase::Started { lease_until, .. } if *lease_until > now => Claim::InProgress,
            Phase::Started { .. } => Claim::Lost,
            Phase::Done(Some(outcome)) => Claim::Done(outcome.clone()),
            Phase::Done(None) => Claim::DoneNotKept,
        }
    }

    fn owned_by(&self, owner: &Owner) -> bool {
        match &self.phase {
            Phase::Claimed { owner: o, .. } | Phase::Started { owner: o, .. } => {
                **o == *owner.token()
            }
            Phase::Done(_) => false,
        }
    }
}

impl MemoryStore {
    /// Creates the store and starts its sweeper; must be called inside a Tokio runtime.
    pub fn new(limits: MemoryLimits, entries_gauge: IntGauge) -> MemoryStore {
        let inner = Arc::new(Inner {
            map: DashMap::new(),
            per_principal: DashMap::new(),
            held: AtomicUsize::new(0),
            kept_bytes: AtomicUsize::new(0),
            limits: ArcSwap::from_pointee(limits),
            last_reclaim: Mutex::new(None),
            entries_gauge,
        });
        inner.entries_gauge.set(0);
        tokio::spawn(sweep_periodically(Arc::downgrade(&inner)));
        MemoryStore { inner }
    }

    /// The limits in force.
    pub fn limits(&self) -> MemoryLimits {
        **self.inner.limits.load()
    }

    /// Replaces the limits; every entry held stays (a reload never forgets a claim).
    pub fn set_limits(&self, limits: MemoryLimits) {
        self.inner.limits.store(Arc::new(limits));
    }

    /// Claims `id` for `owner` for `ttl`, or reports what holds it.
    pub fn claim(&self, id: &str, owner: &Owner, ttl: Duration) -> Result<Claim, StoreError> {
        let inner = &self.inner;
        let limits = self.limits();
        let now = Instant::now();
        let claimed = |expires_at| Entry {
            phase: Phase::Claimed {
                owner: owner.token_arc(),
                lease_until: deadline(now, limits.claim_lease),
            },
            expires_at,
            principal: owner.quota_principal(),
        };
        for attempt in 0..2 {
            match inner.map.entry(id.to_owned()) {
                MapEntry::Occupied(mut slot) => {
                    let e = slot.get_mut();
                    let live = e.expires_at > now;
                    if live {
                        match &e.phase {
                            // The owner never started its call and its lease ran out (its reply
                            // was lost, or it died): take the claim over. The entry keeps its
                            // principal: a state id belongs to one principal.
                            Phase::Claimed { lease_until, .. } if *lease_until <= now => {
                                e.phase = claimed(e.expires_at).phase;
                                return Ok(Claim::TakenOver);
                            }
                            _ => return Ok(e.found(now)),
                        }
                    }
                    // Expired but not swept yet: it is as good as absent, take it over.
                    inner.kept_bytes.fetch_sub(e.kept_len(), Ordering::AcqRel);
                    let principal = e.principal.clone();
                    *e = claimed(deadline(now, ttl));
                    e.principal = principal;
                    return Ok(Claim::Acquired);
                }
                MapEntry::Vacant(slot) => {
                    let p = owner.quota_principal();
                    if !inner.reserve_for(&p, limits.max_entries_per_principal, limits.max_entries)
                    {
                        return Err(StoreError::PrincipalQuota {
                            limit: limits.max_entries_per_principal,
                            retry_after: limits.sweep_interval,
                        });
                    }
                    if inner.reserve_entry(limits.max_entries) {
                        slot.insert(claimed(deadline(now, ttl)));
                        inner.publish_len();
                        return Ok(Claim::Acquired);
                    }
                    inner.unreserve_for(&p);
                    // Full. The shard lock is released at the end of this arm, before any
                    // sweep takes every shard lock in turn.
                }
            }
            if attempt == 0 && !inner.reclaim_when_full(now) {
                break;
            }
        }
        Err(StoreError::Full {
            retry_after: limits.sweep_interval,
        })
    }

    /// What holds `id` now, without claiming it (`None`: nothing live). A retired store (one
    /// replaced by a reload) is asked this way before the new store is claimed in.
    pub fn peek(&self, id: &str) -> Option<Claim> {
        let now = Instant::now();
        let e = self.inner.map.get(id)?;
        (e.expires_at > now).then(|| e.found(now))
    }

    /// Moves `owner`'s claim on `id` to *started*, with `run_lease` to record its outcome.
    /// False when the claim is not `owner`'s any more (it was taken over): the call must not run.
    pub fn start(&self, id: &str, owner: &Owner, run_lease: Duration) -> bool {
        let now = Instant::now();
        let Some(mut e) = self.inner.map.get_mut(id) else {
            return false;
        };
        if e.expires_at <= now || !matches!(e.phase, Phase::Claimed { .. }) || !e.owned_by(owner) {
            return false;
        }
        e.phase = Phase::Started {
            owner: owner.token_arc(),
            lease_until: deadline(now, run_lease),
        };
        true
    }

    /// Records how `owner`'s started call on `id` ended; `outcome` is kept for `ttl` when it
    /// fits.
    pub fn complete(
        &self,
        id: &str,
        owner: &Owner,
        outcome: Option<&[u8]>,
        ttl: Duration,
    ) -> Completion {
        let inner = &self.inner;
        let limits = self.limits();
        // Copy before taking the shard lock; an outcome too large to keep is never copied.
        let copy = outcome
            .filter(|b| b.len() <= limits.max_outcome_bytes)
            .map(Bytes::copy_from_slice);
        let now = Instant::now();
        let Some(mut e) = inner.map.get_mut(id) else {
            return Completion::NoClaim;
        };
        if e.expires_at <= now || !matches!(e.phase, Phase::Started { .. }) || !e.owned_by(owner) {
            return Completion::NoClaim;
        }
        let (kept, result) = match (outcome, copy) {
            (None, _) => (None, Completion::NoOutcome),
            (Some(_), None) => (None, Completion::TooLarge),
            (Some(_), Some(b)) if inner.reserve_bytes(b.len(), limits.max_total_outcome_bytes) => {
                (Some(b), Completion::Kept)
            }
            (Some(_), Some(_)) => (None, Completion::OverTotal),
        };
        e.phase = Phase::Done(kept);
        e.expires_at = deadline(now, ttl);
        result
    }

    /// Gives back `owner`'s claim on `id` (claimed or started, never done): its call never
    /// ran. True when there was one.
    pub fn release(&self, id: &str, owner: &Owner) -> bool {
        let inner = &self.inner;
        let removed = inner.map.remove_if(id, |_, e| e.owned_by(owner));
        match removed {
            Some((_, e)) => {
                inner.unreserve_for(&e.principal);
                inner.held.fetch_sub(1, Ordering::AcqRel);
                inner.publish_len();
                true
            }
            None => false,
        }
    }

    /// Ids held (claims in progress and finished ones not yet swept).
    pub fn len(&self) -> usize {
        self.inner.held.load(Ordering::Acquire)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Ids held for `principal` (a caller key).
    pub fn held_by(&self, principal: &str) -> usize {
        self.inner
            .per_principal
            .get(principal)
            .map_or(0, |n| *n.value())
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
    fn reserve_entry(&self, max_entries: usize) -> bool {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max_entries).then_some(n + 1)
            })
            .is_ok()
    }

    /// Counts one more id for `principal`, unless it already holds `quota` while the store
    /// is at least half full (of `max_entries`).
    fn reserve_for(&self, principal: &Arc<str>, quota: usize, max_entries: usize) -> bool {
        let contended = self.held.load(Ordering::Acquire).saturating_mul(2) >= max_entries;
        let mut n = self.per_principal.entry(principal.clone()).or_insert(0);
        if *n >= quota && contended {
            return false;
        }
        *n += 1;
        true
    }

    fn unreserve_for(&self, principal: &Arc<str>) {
        if let Some(mut n) = self.per_principal.get_mut(principal) {
            *n = n.saturating_sub(1);
        }
        self.per_principal.remove_if(principal, |_, n| *n == 0);
    }

    fn reserve_bytes(&self, len: usize, max_total: usize) -> bool {
        self.kept_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                n.checked_add(len).filter(|total| *total <= max_total)
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
        let mut principals: Vec<Arc<str>> = Vec::new();
        self.map.retain(|_, e| {
            if e.expires_at > now {
                return true;
            }
            removed += 1;
            freed += e.kept_len();
            principals.push(e.principal.clone());
            false
        });
        // Outside the map's locks: the per-principal counts are a map of their own.
        for p in &principals {
            self.unreserve_for(p);
        }
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

/// Sweeps every `sweep_interval` (read anew each time, so a reload applies) until the store
/// is dropped. The O(n) pass runs on the blocking pool so that a large map never stalls a
/// runtime worker.
async fn sweep_periodically(store: Weak<Inner>) {
    loop {
        let every = match store.upgrade() {
            Some(inner) => inner.limits.load().sweep_interval,
            None => return,
        };
        tokio::time::sleep(every).await;
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

    fn limits(max_entries: usize, sweep_interval: Duration) -> MemoryLimits {
        MemoryLimits {
            max_entries,
            // Out of the way unless a test is about it.
            max_entries_per_principal: 1000,
            max_outcome_bytes: 16,
            max_total_outcome_bytes: 40,
            sweep_interval,
            claim_lease: MINUTE,
        }
    }

    fn store(max_entries: usize, sweep_interval: Duration) -> MemoryStore {
        MemoryStore::new(
            limits(max_entries, sweep_interval),
            IntGauge::new("entries", "test").unwrap(),
        )
    }

    fn owner() -> Owner {
        Owner::new("alice")
    }

    /// Claims and starts `id` for a fresh owner, as the engine does before running a call.
    fn run(s: &MemoryStore, id: &str, ttl: Duration) -> Owner {
        let o = owner();
        assert_eq!(s.claim(id, &o, ttl).unwrap(), Claim::Acquired);
        assert!(s.start(id, &o, MINUTE));
        o
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
        let a = run(&s, "a", MINUTE);
        assert_eq!(s.claim("a", &owner(), MINUTE).unwrap(), Claim::InProgress);
        assert_eq!(
            s.complete("a", &a, Some(br#"{"ok":1}"#), MINUTE),
            Completion::Kept
        );
        assert_eq!(
            s.claim("a", &owner(), MINUTE).unwrap(),
            Claim::Done(Bytes::from_static(br#"{"ok":1}"#))
        );
        assert_eq!(s.kept_bytes(), 8);
        // A second completion of a finished claim changes nothing.
        assert_eq!(
            s.complete("a", &a, Some(b"other"), MINUTE),
            Completion::NoClaim
        );
        assert_eq!(
            s.claim("a", &owner(), MINUTE).unwrap(),
            Claim::Done(Bytes::from_static(br#"{"ok":1}"#))
        );
        // Other ids are independent.
        assert_eq!(s.claim("b", &owner(), MINUTE).unwrap(), Claim::Acquired);
        assert_eq!(s.len(), 2);
    }

    #[tokio::test]
    async fn only_the_owner_starts_completes_or_releases_its_claim() {
        let s = store(10, MINUTE);
        let (mine, other) = (owner(), owner());
        s.claim("a", &mine, MINUTE).unwrap();
        assert!(!s.start("a", &other, MINUTE));
        assert!(!s.release("a", &other));
        // Not started yet: nothing to complete.
        assert_eq!(s.complete("a", &mine, None, MINUTE), Completion::NoClaim);
        assert!(s.start("a", &mine, MINUTE));
        assert!(!s.start("a", &mine, MINUTE), "started once");
        assert_eq!(s.complete("a", &other, None, MINUTE), Completion::NoClaim);
        assert_eq!(s.complete("a", &mine, None, MINUTE), Completion::NoOutcome);
        assert_eq!(s.claim("a", &other, MINUTE).unwrap(), Claim::DoneNotKept);
    }

    #[tokio::test]
    async fn an_unstarted_claim_is_taken_over_after_its_lease_and_its_owner_cannot_start() {
        let s = store(10, MINUTE);
        s.set_limits(MemoryLimits {
            claim_lease: Duration::from_millis(30),
            ..s.limits()
        });
        let (first, second) = (owner(), owner());
        assert_eq!(s.claim("a", &first, MINUTE).unwrap(), Claim::Acquired);
        assert_eq!(s.claim("a", &second, MINUTE).unwrap(), Claim::InProgress);
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert_eq!(s.claim("a", &second, MINUTE).unwrap(), Claim::TakenOver);
        assert!(!s.start("a", &first, MINUTE), "the first owner lost it");
        assert!(s.start("a", &second, MINUTE));
        // A started claim is never taken over, whatever its lease.
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert_eq!(s.claim("a", &first, MINUTE).unwrap(), Claim::InProgress);
        assert_eq!(s.len(), 1);
    }

    #[tokio::test]
    async fn a_started_claim_without_an_outcome_past_its_run_lease_is_lost_not_rerun() {
        let s = store(10, MINUTE);
        let o = owner();
        s.claim("a", &o, MINUTE).unwrap();
        assert!(s.start("a", &o, Duration::from_millis(20)));
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(s.claim("a", &owner(), MINUTE).unwrap(), Claim::Lost);
        // A late outcome still lands and is then served.
        assert_eq!(s.complete("a", &o, Some(b"late"), MINUTE), Completion::Kept);
        assert_eq!(
            s.claim("a", &owner(), MINUTE).unwrap(),
            Claim::Done(Bytes::from_static(b"late"))
        );
    }

    #[tokio::test]
    async fn outcomes_over_either_bound_or_absent_are_not_kept() {
        let s = store(10, MINUTE);
        let o = run(&s, "big", MINUTE);
        assert_eq!(
            s.complete("big", &o, Some(&[b'x'; 17]), MINUTE),
            Completion::TooLarge
        );
        assert_eq!(s.claim("big", &o, MINUTE).unwrap(), Claim::DoneNotKept);

        let o = run(&s, "none", MINUTE);
        assert_eq!(s.complete("none", &o, None, MINUTE), Completion::NoOutcome);
        assert_eq!(s.claim("none", &o, MINUTE).unwrap(), Claim::DoneNotKept);

        // 16 + 16 fit in the 40-byte total; a third 16-byte outcome does not.
        let owners: Vec<Owner> = ["t1", "t2", "t3"]
            .iter()
            .map(|id| run(&s, id, MINUTE))
            .collect();
        assert_eq!(
            s.complete("t1", &owners[0], Some(&[1; 16]), MINUTE),
            Completion::Kept
        );
        assert_eq!(
            s.complete("t2", &owners[1], Some(&[2; 16]), MINUTE),
            Completion::Kept
        );
        assert_eq!(
            s.complete("t3", &owners[2], Some(&[3; 16]), MINUTE),
            Completion::OverTotal
        );
        assert_eq!(s.claim("t3", &owner(), MINUTE).unwrap(), Claim::DoneNotKept);
        assert_eq!(s.kept_bytes(), 32);
    }

    #[tokio::test]
    async fn release_makes_the_id_claimable_again_but_never_undoes_a_finished_claim() {
        let s = store(10, MINUTE);
        let o = owner();
        s.claim("a", &o, MINUTE).unwrap();
        assert!(s.release("a", &o));
        assert_eq!(s.len(), 0);
        // A started claim can be given back too (its owner knows the call never ran).
        let o = run(&s, "a", MINUTE);
        assert!(s.release("a", &o));
        let o = run(&s, "a", MINUTE);
        s.complete("a", &o, Some(b"1"), MINUTE);
        assert!(!s.release("a", &o));
        assert_eq!(
            s.claim("a", &owner(), MINUTE).unwrap(),
            Claim::Done(Bytes::from_static(b"1"))
        );
        assert!(!s.release("never-claimed", &o));
        assert_eq!(
            s.complete("never-claimed", &o, None, MINUTE),
            Completion::NoClaim
        );
    }

    #[tokio::test]
    async fn expired_entries_are_claimable_and_swept() {
        let s = store(10, Duration::from_millis(20));
        let ttl = Duration::from_millis(50);
        let until = Instant::now() + ttl;
        s.claim("p", &owner(), ttl).unwrap();
        let d = run(&s, "d", ttl);
        s.complete("d", &d, Some(b"x"), ttl);
        assert_eq!(s.claim("p", &owner(), ttl).unwrap(), Claim::InProgress);
        tokio::time::sleep_until(until).await;
        // Lazy expiry: an expired claim is taken over even before the sweeper ran.
        assert_eq!(s.claim("p", &owner(), MINUTE).unwrap(), Claim::Acquired);
        // The sweeper removes the expired "d" (and its kept bytes) but not the fresh "p".
        eventually(Duration::from_secs(5), || s.len() == 1).await;
        assert_eq!(s.kept_bytes(), 0);
        assert_eq!(s.held_by("alice"), 1);
        assert_eq!(s.claim("p", &owner(), MINUTE).unwrap(), Claim::InProgress);
        assert_eq!(s.claim("d", &owner(), MINUTE).unwrap(), Claim::Acquired);
    }

    #[tokio::test]
    async fn a_full_store_refuses_and_never_evicts_a_live_claim() {
        let s = store(3, MINUTE);
        let a = owner();
        s.claim("a", &a, MINUTE).unwrap();
        s.claim("b", &owner(), MINUTE).unwrap();
        let c = run(&s, "c", MINUTE);
        s.complete("c", &c, Some(b"kept"), MINUTE);
        let err = s.claim("d", &owner(), MINUTE).unwrap_err();
        assert_eq!(
            err,
            StoreError::Full {
                retry_after: MINUTE
            }
        );
        // Refused claims do not disturb the held ones.
        assert_eq!(s.claim("a", &owner(), MINUTE).unwrap(), Claim::InProgress);
        assert_eq!(s.claim("b", &owner(), MINUTE).unwrap(), Claim::InProgress);
        assert_eq!(
            s.claim("c", &owner(), MINUTE).unwrap(),
            Claim::Done(Bytes::from_static(b"kept"))
        );
        assert_eq!(s.len(), 3);
        assert_eq!(s.held_by("alice"), 3, "a refused claim is not counted");
        // Releasing one makes room for exactly one more.
        assert!(s.release("a", &a));
        assert_eq!(s.claim("d", &owner(), MINUTE).unwrap(), Claim::Acquired);
        assert!(matches!(
            s.claim("e", &owner(), MINUTE),
            Err(StoreError::Full { .. })
        ));
    }

    #[tokio::test]
    async fn one_principal_cannot_take_more_than_its_quota_and_others_still_claim() {
        let s = store(4, MINUTE);
        s.set_limits(MemoryLimits {
            max_entries_per_principal: 1,
            ..s.limits()
        });
        // Below half of max_entries the quota does not bite: nobody else needs the room.
        let mallory = Owner::new("mallory");
        s.claim("m1", &mallory, MINUTE).unwrap();
        let m2 = Owner::new("mallory");
        s.claim("m2", &m2, MINUTE).unwrap();
        s.set_limits(MemoryLimits {
            max_entries_per_principal: 2,
            ..s.limits()
        });
        assert_eq!(
            s.claim("m3", &Owner::new("mallory"), MINUTE),
            Err(StoreError::PrincipalQuota {
                limit: 2,
                retry_after: MINUTE
            })
        );
        // Everyone else is unaffected.
        assert_eq!(
            s.claim("a1", &Owner::new("alice"), MINUTE).unwrap(),
            Claim::Acquired
        );
        assert_eq!((s.held_by("mallory"), s.held_by("alice")), (2, 1));
        // A released claim frees its principal's slot.
        assert!(s.release("m2", &m2));
        assert_eq!(
            s.claim("m3", &Owner::new("mallory"), MINUTE).unwrap(),
            Claim::Acquired
        );
        assert_eq!(s.len(), 3);
    }

    #[tokio::test]
    async fn new_limits_apply_to_new_claims_and_keep_every_held_one() {
        let s = store(10, MINUTE);
        let a = run(&s, "a", MINUTE);
        s.claim("b", &owner(), MINUTE).unwrap();
        s.set_limits(MemoryLimits {
            max_entries: 1,
            ..s.limits()
        });
        assert!(matches!(
            s.claim("c", &owner(), MINUTE),
            Err(StoreError::Full { .. })
        ));
        assert_eq!(s.claim("b", &owner(), MINUTE).unwrap(), Claim::InProgress);
        assert_eq!(s.complete("a", &a, Some(b"x"), MINUTE), Completion::Kept);
        assert_eq!(s.peek("a"), Some(Claim::Done(Bytes::from_static(b"x"))));
        assert_eq!(s.peek("nothing"), None);
    }

    #[tokio::test]
    async fn a_full_store_reclaims_expired_entries_first() {
        // The sweeper is far away: only the reclaim-on-full path can free the slots.
        let s = store(2, Duration::from_secs(3600));
        let short = Duration::from_millis(30);
        let until = Instant::now() + short;
        s.claim("old1", &owner(), short).unwrap();
        s.claim("old2", &owner(), short).unwrap();
        assert!(matches!(
            s.claim("new", &owner(), MINUTE),
            Err(StoreError::Full { .. })
        ));
        // That refusal swept (finding nothing); the next sweep may run RECLAIM_GAP later.
        tokio::time::sleep_until(until.max(Instant::now() + RECLAIM_GAP)).await;
        assert_eq!(s.claim("new", &owner(), MINUTE).unwrap(), Claim::Acquired);
        assert_eq!(s.len(), 1);
        assert_eq!(s.held_by("alice"), 1);
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
                s.claim("same", &owner(), MINUTE).unwrap()
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
