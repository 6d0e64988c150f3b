//! Tests of the in-memory store: claim phases and leases, bounds and quotas, expiry, the
//! sweeper, and concurrent claims of one id.

use super::*;

const MINUTE: Duration = Duration::from_secs(60);

fn limits(max_entries: usize, sweep_interval: Duration) -> MemoryLimits {
    MemoryLimits {
        // The caller's share is out of the way unless a test is about it.
        share: crate::fair_share::FairShare::unshared(max_entries),
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
async fn one_principal_cannot_take_more_than_its_share_and_newcomers_still_claim() {
    let s = store(8, MINUTE);
    let share = |per_caller, reserve| crate::fair_share::FairShare {
        size: 8,
        per_caller,
        reserve,
        configured: true,
    };
    s.set_limits(MemoryLimits {
        share: share(2, 1),
        ..s.limits()
    });
    // The share holds from the first claim, with the store nearly empty.
    let mallory = Owner::new("mallory");
    s.claim("m1", &mallory, MINUTE).unwrap();
    let m2 = Owner::new("mallory");
    s.claim("m2", &m2, MINUTE).unwrap();
    assert_eq!(
        s.claim("m3", &Owner::new("mallory"), MINUTE),
        Err(StoreError::PrincipalQuota {
            limit: 2,
            retry_after: MINUTE
        })
    );
    assert_eq!(s.held_by("mallory"), 2, "a refused claim is not counted");
    // Two more callers take their share: 6 of 8 held.
    for who in ["bob", "carol"] {
        for n in 0..2 {
            let id = format!("{who}{n}");
            assert_eq!(
                s.claim(&id, &Owner::new(who), MINUTE).unwrap(),
                Claim::Acquired
            );
        }
    }
    // A fourth caller still gets a claim; its second would take the newcomers' reserve.
    let dave = Owner::new("dave");
    assert_eq!(s.claim("d1", &dave, MINUTE).unwrap(), Claim::Acquired);
    assert_eq!(
        s.claim("d2", &Owner::new("dave"), MINUTE),
        Err(StoreError::NewcomerReserve {
            reserve: 1,
            retry_after: MINUTE
        })
    );
    assert_eq!(
        s.claim("e1", &Owner::new("erin"), MINUTE).unwrap(),
        Claim::Acquired
    );
    assert_eq!(s.len(), 8);
    // A released claim frees its principal's place.
    assert!(s.release("m2", &m2));
    assert_eq!(
        s.claim("m3", &Owner::new("mallory"), MINUTE),
        Err(StoreError::NewcomerReserve {
            reserve: 1,
            retry_after: MINUTE
        }),
        "the freed place is the reserve now"
    );
    assert_eq!(
        s.claim("f1", &Owner::new("frank"), MINUTE).unwrap(),
        Claim::Acquired
    );
}

#[tokio::test]
async fn new_limits_apply_to_new_claims_and_keep_every_held_one() {
    let s = store(10, MINUTE);
    let a = run(&s, "a", MINUTE);
    s.claim("b", &owner(), MINUTE).unwrap();
    s.set_limits(MemoryLimits {
        share: crate::fair_share::FairShare::unshared(1),
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
