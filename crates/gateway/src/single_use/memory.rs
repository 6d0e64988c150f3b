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
//! - each caller's share of those ids (claims and kept outcomes alike,
//!   `max_entries_per_principal`, by default a quarter of the store), from its first id, so
//!   that one caller cannot fill the store and lock everyone else out: a claim beyond it fails
//!   with [`StoreError::PrincipalQuota`]. The last ids (`quotas.newcomer_reserve`) go only to
//!   callers holding none yet ([`StoreError::NewcomerReserve`] for the others), so a caller
//!   that comes after several busy ones still gets its retries claimed. The division is
//!   [`crate::fair_share::FairShare`]; the caller is the principal, or for anonymous callers
//!   the principal and the source address ([`crate::caller_scope::Caller`]).
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
use crate::fair_share::{FairShare, ShareRefusal};

/// Shortest gap between two sweeps run by claims that found the store full; bounds the O(n)
/// work an attacker can trigger by filling the store.
pub const RECLAIM_GAP: Duration = Duration::from_millis(100);

/// The memory store's limits (from `[single_use]`).
#[derive(Debug, Clone, Copy)]
pub struct MemoryLimits {
    /// `max_entries` (the share's size), each caller's share and the newcomers' reserve.
    pub share: FairShare,
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
                    match inner.reserve_for(&p, &limits.share) {
                        Ok(()) => {}
                        // Full: counted below, after a sweep may have made room.
                        Err(ShareRefusal::Full) => {}
                        Err(ShareRefusal::CallerShare) => {
                            return Err(StoreError::PrincipalQuota {
                                limit: limits.share.per_caller,
                                retry_after: limits.sweep_interval,
                            });
                        }
                        Err(ShareRefusal::Reserve) => {
                            return Err(StoreError::NewcomerReserve {
                                reserve: limits.share.reserve,
                                retry_after: limits.sweep_interval,
                            });
                        }
                    }
                    if inner.reserve_entry(limits.share.size) {
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

    /// Ends the run lease of `owner`'s started claim on `id` now: its outcome is lost, and
    /// claims find [`Claim::Lost`]. False when the claim is not `owner`'s started one.
    pub fn abandon(&self, id: &str, owner: &Owner) -> bool {
        let now = Instant::now();
        let Some(mut e) = self.inner.map.get_mut(id) else {
            return false;
        };
        if e.expires_at <= now || !e.owned_by(owner) {
            return false;
        }
        match &mut e.phase {
            Phase::Started { lease_until, .. } => {
                *lease_until = now;
                true
            }
            _ => false,
        }
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

    /// Counts one more id for `principal`, unless `share` refuses it one more: its share is
    /// held, or only the newcomers' reserve is left and it holds some already. A full store is
    /// not decided here (the caller sweeps first): the id is counted and `reserve_entry` says.
    fn reserve_for(&self, principal: &Arc<str>, share: &FairShare) -> Result<(), ShareRefusal> {
        let taken = self.held.load(Ordering::Acquire);
        let mut n = self.per_principal.entry(principal.clone()).or_insert(0);
        if let Err(refusal @ (ShareRefusal::CallerShare | ShareRefusal::Reserve)) =
            share.admit(taken, *n)
        {
            drop(n);
            self.per_principal.remove_if(principal, |_, n| *n == 0);
            return Err(refusal);
        }
        *n += 1;
        Ok(())
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
#[path = "memory_tests.rs"]
mod tests;
