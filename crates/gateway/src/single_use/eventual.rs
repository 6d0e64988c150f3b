//! Writes that must land: an outcome to record, or a claim to give back, retried in the
//! background after a store failure until they succeed or their claim expires.
//!
//! Why they matter: an outcome that never lands leaves duplicates "in progress" for the
//! state's whole life; a claim whose owner refused to run (its claim or start may have landed
//! after the store stalled) would keep others out until its lease runs out. Each retry is one
//! store call bounded by the store's own timeouts; the gaps grow from [`FIRST_GAP`] to
//! [`LONGEST_GAP`]; the loop ends at the claim's expiry, after which nothing can be claimed
//! under that id again anyway. `single_use_pending_writes` counts the loops running now.

use std::time::Duration;

use tokio::time::Instant;

use super::{Completion, Owner, SingleUseStore};

pub(super) const FIRST_GAP: Duration = Duration::from_millis(100);
pub(super) const LONGEST_GAP: Duration = Duration::from_secs(2);

/// A write to retry.
pub(super) enum Write {
    Complete {
        id: String,
        owner: Owner,
        outcome: Option<Vec<u8>>,
    },
    Release {
        id: String,
        owner: Owner,
    },
}

impl Write {
    fn op(&self) -> &'static str {
        match self {
            Write::Complete { .. } => "complete",
            Write::Release { .. } => "release",
        }
    }
}

/// Retries `write` in a task of its own until it lands or `until` passes.
pub(super) fn retry(store: SingleUseStore, write: Write, until: Instant) {
    let metrics = store.metrics().clone();
    metrics.retrying(write.op());
    tokio::spawn(async move {
        let op = write.op();
        let mut gap = FIRST_GAP;
        let mut attempts = 0u32;
        let landed = loop {
            let now = Instant::now();
            if now + gap >= until {
                break false;
            }
            tokio::time::sleep(gap).await;
            gap = (gap * 2).min(LONGEST_GAP);
            attempts += 1;
            let attempt = match &write {
                Write::Complete { id, owner, outcome } => {
                    let ttl = until.saturating_duration_since(Instant::now());
                    store
                        .backend_complete(id, owner, outcome.as_deref(), ttl)
                        .await
                        .map(|done| {
                            metrics.completed(done.metric_label());
                            done != Completion::NoClaim
                        })
                }
                Write::Release { id, owner } => store.backend_release(id, owner).await,
            };
            match attempt {
                Ok(applied) => {
                    tracing::info!(
                        op,
                        attempts,
                        applied,
                        "single-use write landed after a store failure"
                    );
                    break true;
                }
                Err(e) => {
                    tracing::debug!(op, attempts, error = %e, "single-use write still failing")
                }
            }
        };
        if !landed {
            tracing::warn!(
                op,
                attempts,
                "gave up a single-use write: its claim has expired (duplicates saw \"in progress\" \
                 until then)"
            );
        }
        metrics.retry_ended();
    });
}
