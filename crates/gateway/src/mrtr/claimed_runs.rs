//! The claimed retries running on this replica, so that a drain can wait for them and settle
//! the ones it cannot wait for.
//!
//! A retry that has claimed and started its state ([`super::at_most_once`]) outlives its
//! client: once the client has gone, no connection holds the drain open for it, yet its
//! outcome is what the state's next presentation should get. So every started claim is
//! registered here until it settles, and the drain ([`ClaimedRuns::finish`]) first waits for
//! them, up to `drain.deadline` counted from the moment the listener stopped accepting. Those
//! still running then are given up: their legacy call is cancelled, and the single-use store
//! that granted the claim records at once that the outcome was lost (the run lease ends now),
//! so a duplicate presented to any replica sharing the store is told to start over at once
//! instead of "in progress" until the run lease (`upstream.call_timeout` + `claim_lease`)
//! runs out. A claim given up this way is never completed afterwards by its own run; the
//! drain gives those runs [`GIVE_UP_GRACE`] to cancel their call upstream before it goes on.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::single_use::{Owner, SingleUseStore};

/// How long runs given up at the deadline get to end after their cancel (to tell the legacy
/// server with `notifications/cancelled` and end their sessions) before the drain goes on.
pub const GIVE_UP_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// The started claims of this replica that have not settled yet.
#[derive(Default)]
pub struct ClaimedRuns {
    runs: Mutex<HashMap<u64, Entry>>,
    next: AtomicU64,
    /// Signalled whenever a run leaves.
    left: Notify,
}

struct Entry {
    store: Arc<SingleUseStore>,
    id: String,
    owner: Owner,
    cancel: CancellationToken,
    given_up: Arc<AtomicBool>,
}

/// One registered run; dropping it (after settling, or when the run ends any other way)
/// takes it off the list.
pub struct Registration {
    runs: Arc<ClaimedRuns>,
    key: u64,
    cancel: CancellationToken,
    given_up: Arc<AtomicBool>,
}

impl Registration {
    /// What cancels the run: only the drain giving it up (its client leaving does not).
    pub fn cancel(&self) -> &CancellationToken {
        &self.cancel
    }

    /// The drain gave this run up and recorded its outcome as lost: it must not record one.
    pub fn given_up(&self) -> bool {
        self.given_up.load(Ordering::Acquire)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.runs.lock().remove(&self.key);
        self.runs.left.notify_waiters();
    }
}

/// What a drain did with the claimed runs it found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Finished {
    /// Runs that settled while the drain waited.
    pub settled: usize,
    /// Runs still going at the deadline, recorded as outcome lost.
    pub given_up: usize,
}

impl ClaimedRuns {
    async fn wait_until_empty(&self, deadline: Instant) {
        loop {
            let left = self.left.notified();
            tokio::pin!(left);
            left.as_mut().enable();
            if self.is_empty() {
                return;
            }
            tokio::select! {
                _ = &mut left => {}
                _ = tokio::time::sleep_until(deadline) => return,
            }
        }
    }

    pub fn new() -> Arc<ClaimedRuns> {
        Arc::new(ClaimedRuns::default())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Entry>> {
        self.runs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers the started claim of `owner` on `id`, granted by `store`.
    pub fn register(
        self: &Arc<Self>,
        store: Arc<SingleUseStore>,
        id: &str,
        owner: &Owner,
    ) -> Registration {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        let cancel = CancellationToken::new();
        let given_up = Arc::new(AtomicBool::new(false));
        self.lock().insert(
            key,
            Entry {
                store,
                id: id.to_owned(),
                owner: owner.clone(),
                cancel: cancel.clone(),
                given_up: given_up.clone(),
            },
        );
        Registration {
            runs: self.clone(),
            key,
            cancel,
            given_up,
        }
    }

    /// Claimed runs going now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until every claimed run has settled or `deadline` passes; then gives up the rest:
    /// each one's outcome is recorded as lost in its store and its call cancelled.
    pub async fn finish(&self, deadline: Instant) -> Finished {
        let before = self.len();
        if before > 0 {
            tracing::info!(
                runs = before,
                "waiting for claimed retries (some may have lost their client) to finish"
            );
        }
        self.wait_until_empty(deadline).await;
        let rest: Vec<(Arc<SingleUseStore>, String, Owner)> = self
            .lock()
            .values()
            .map(|e| {
                // Marked before the cancel, so the run's own settle cannot record an outcome.
                e.given_up.store(true, Ordering::Release);
                e.cancel.cancel();
                (e.store.clone(), e.id.clone(), e.owner.clone())
            })
            .collect();
        for (store, id, owner) in &rest {
            store.metrics().lost_at_drain();
            if let Err(e) = store.abandon(id, owner).await {
                tracing::warn!(error = %e, "could not record a claimed retry's outcome as lost; its duplicates learn it when the run lease ends");
            }
        }
        if !rest.is_empty() {
            // Their cancel reaches the legacy server only if their tasks run before the exit.
            self.wait_until_empty(Instant::now() + GIVE_UP_GRACE).await;
            tracing::warn!(
                runs = rest.len(),
                "claimed retries still running at the drain deadline were cancelled and recorded as outcome lost"
            );
        }
        Finished {
            settled: before.saturating_sub(rest.len()),
            given_up: rest.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn memory_store() -> Arc<SingleUseStore> {
        let cfg = crate::single_use::SingleUseConfig::default();
        Arc::new(
            SingleUseStore::from_config(&cfg, crate::single_use::SingleUseMetrics::unregistered())
                .await
                .unwrap(),
        )
    }

    /// A started claim in `store`, registered in `runs`.
    async fn started(
        runs: &Arc<ClaimedRuns>,
        store: &Arc<SingleUseStore>,
        id: &str,
    ) -> (Owner, Registration) {
        let owner = Owner::new("alice");
        let minute = Duration::from_secs(60);
        assert!(store.claim(id, &owner, minute).await.unwrap().owned());
        assert!(store.start(id, &owner, minute).await.unwrap());
        let reg = runs.register(store.clone(), id, &owner);
        (owner, reg)
    }

    #[tokio::test]
    async fn the_drain_waits_for_runs_that_settle_in_time() {
        let runs = ClaimedRuns::new();
        let store = memory_store().await;
        let (owner, reg) = started(&runs, &store, "settles").await;
        let settling = {
            let store = store.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                store
                    .complete("settles", &owner, Some(b"{}"), Duration::from_secs(60))
                    .await
                    .unwrap();
                drop(reg);
            })
        };
        let done = runs.finish(Instant::now() + Duration::from_secs(10)).await;
        assert_eq!(
            done,
            Finished {
                settled: 1,
                given_up: 0
            }
        );
        settling.await.unwrap();
        let dup = store
            .claim("settles", &Owner::new("alice"), Duration::from_secs(60))
            .await
            .unwrap();
        assert!(matches!(dup, crate::single_use::Claim::Done(_)), "{dup:?}");
    }

    #[tokio::test]
    async fn a_run_past_the_deadline_is_cancelled_and_its_outcome_lost_at_once() {
        let runs = ClaimedRuns::new();
        let store = memory_store().await;
        let (_owner, reg) = started(&runs, &store, "slow").await;
        let cancel = reg.cancel().clone();
        let t0 = Instant::now();
        let done = runs.finish(t0 + Duration::from_millis(100)).await;
        assert_eq!(
            done,
            Finished {
                settled: 0,
                given_up: 1
            }
        );
        assert!(cancel.is_cancelled());
        assert!(reg.given_up(), "the run must not record an outcome now");
        assert_eq!(store.metrics().lost_at_drain_count(), 1);
        // A duplicate learns it now, not after the run lease of a minute.
        let dup = store
            .claim("slow", &Owner::new("alice"), Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(dup, crate::single_use::Claim::Lost);
        drop(reg);
        assert!(runs.is_empty());
    }
}
