//! Single use of `requestState`: at most one execution per state, and the same answer for
//! every duplicate.
//!
//! Every sealed state carries a random id (`StatePayload::id`). Before a retry replays
//! anything, the engine *claims* that id here, atomically:
//!
//! ```text
//! claim(id, ttl) ── Acquired ──▶ replay the call ──▶ complete(id, Some(result bytes), ttl)
//!      │                  │                      └─▶ release(id)  (nothing was sent upstream)
//!      ├─ InProgress  ─▶ 409 "retry in progress"          (duplicate::in_progress)
//!      ├─ Done(bytes) ─▶ answer with exactly those result bytes
//!      ├─ DoneNotKept ─▶ 409 "already used"                (duplicate::already_used)
//!      └─ Err(_)      ─▶ 503, nothing runs (fail closed)   (Rejection::from(StoreError))
//! ```
//!
//! `ttl` is the state's remaining lifetime: once the state has expired no presentation of it
//! is accepted anyway, so the claim (and the kept outcome) need not outlive it. Remembering
//! the outcome is the idempotency-key pattern: a client whose response was lost presents the
//! state again and gets the same result instead of an error or a second execution.
//!
//! Two backends behind one type, [`SingleUseStore`]: [`memory::MemoryStore`] (default, one
//! replica) and [`redis_store::RedisStore`] (a fleet). Which retries claim at all is decided by
//! [`policy::PolicyTable`] (`[single_use] policy` and `[[single_use.rules]]`).
//!
//! Caveats for the caller:
//! - A claim whose holder dies (crash, lost Redis write) stays "in progress" until the state
//!   expires: duplicates are refused, never run. That is the price of at-most-once.
//! - If `complete` fails, still answer the client: the call ran. Duplicates will see
//!   "in progress" until the state expires.
//! - The memory store lives in the [`SingleUseStore`] value: keep that value across
//!   configuration reloads that do not change `[single_use]`, or in-flight claims are lost.

pub mod config;
pub mod duplicate;
pub mod memory;
pub mod metrics;
pub mod policy;
pub mod redis_store;
mod store_error;

use std::time::Duration;

use bytes::Bytes;

pub use config::{SingleUseConfig, StoreKind};
pub use duplicate::{already_used, in_progress};
pub use memory::{MemoryLimits, MemoryStore};
pub use metrics::SingleUseMetrics;
pub use policy::Policy;
pub use redis_store::RedisStore;
pub use store_error::StoreError;

/// What a claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This caller owns the id now and must later `complete` or `release` it.
    Acquired,
    /// Another presentation holds the id and has not finished.
    InProgress,
    /// Finished; the kept outcome (the JSON-RPC `result` bytes exactly as first sent).
    Done(Bytes),
    /// Finished; the outcome was too large to keep, or there was none.
    DoneNotKept,
}

impl Claim {
    /// The `result` label of `single_use_claims_total`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Claim::Acquired => "acquired",
            Claim::InProgress => "in_progress",
            Claim::Done(_) => "done",
            Claim::DoneNotKept => "not_kept",
        }
    }
}

/// What `complete` did with the outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// Kept: duplicates get it.
    Kept,
    /// Over `max_outcome_bytes`: duplicates are told the state was already used.
    TooLarge,
    /// Memory store only: the kept outcomes already fill `max_total_outcome_bytes`.
    OverTotal,
    /// No outcome was given.
    NoOutcome,
    /// There was no claim in progress for the id (expired, released or already completed);
    /// nothing was recorded.
    NoClaim,
}

impl Completion {
    /// The `result` label of `single_use_outcomes_total`.
    pub fn metric_label(self) -> &'static str {
        match self {
            Completion::Kept => "kept",
            Completion::TooLarge => "too_large",
            Completion::OverTotal => "over_total",
            Completion::NoOutcome => "none",
            Completion::NoClaim => "no_claim",
        }
    }
}

/// The claim store the engine uses; cheap to clone (clones share the backend).
#[derive(Clone)]
pub struct SingleUseStore {
    backend: Backend,
    metrics: SingleUseMetrics,
}

#[derive(Clone)]
enum Backend {
    Memory(MemoryStore),
    Redis(RedisStore),
}

/// Ids are minted by the gateway (22 characters of base64url); anything else is a bug, and a
/// `{` or `}` would break the Redis hash tag.
fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl SingleUseStore {
    /// Builds the configured backend; must be called inside a Tokio runtime. A Redis store does
    /// not connect here (see [`RedisStore`]), so an unreachable Redis is not an error yet.
    pub fn build(
        cfg: &SingleUseConfig,
        metrics: SingleUseMetrics,
    ) -> Result<SingleUseStore, StoreError> {
        let backend = match cfg.store {
            StoreKind::Memory => Backend::Memory(MemoryStore::new(
                MemoryLimits {
                    max_entries: cfg.max_entries,
                    max_outcome_bytes: cfg.max_outcome_bytes,
                    max_total_outcome_bytes: cfg.max_total_outcome_bytes,
                    sweep_interval: cfg.sweep_interval,
                },
                metrics.entries.clone(),
            )),
            StoreKind::Redis => {
                metrics.entries.set(0);
                Backend::Redis(RedisStore::new(&cfg.redis, cfg.max_outcome_bytes)?)
            }
        };
        Ok(SingleUseStore { backend, metrics })
    }

    /// [`SingleUseStore::build`], for async callers.
    pub async fn from_config(
        cfg: &SingleUseConfig,
        metrics: SingleUseMetrics,
    ) -> Result<SingleUseStore, StoreError> {
        Self::build(cfg, metrics)
    }

    /// Claims `id` for `ttl` (the state's remaining lifetime), or reports what holds it.
    pub async fn claim(&self, id: &str, ttl: Duration) -> Result<Claim, StoreError> {
        let result = if valid_id(id) {
            match &self.backend {
                Backend::Memory(m) => m.claim(id, ttl),
                Backend::Redis(r) => r.claim(id, ttl).await,
            }
        } else {
            Err(StoreError::InvalidId)
        };
        match &result {
            Ok(claim) => self
                .metrics
                .claims
                .with_label_values(&[claim.metric_label()])
                .inc(),
            Err(e) => self.count_error(e),
        }
        result
    }

    /// Records the outcome of an `Acquired` claim for `ttl`: `Some(result bytes)` is kept for
    /// duplicates when it fits `max_outcome_bytes`; `None` or a larger one makes duplicates
    /// get "already used".
    pub async fn complete(
        &self,
        id: &str,
        outcome: Option<&[u8]>,
        ttl: Duration,
    ) -> Result<Completion, StoreError> {
        let result = if valid_id(id) {
            match &self.backend {
                Backend::Memory(m) => Ok(m.complete(id, outcome, ttl)),
                Backend::Redis(r) => r.complete(id, outcome, ttl).await,
            }
        } else {
            Err(StoreError::InvalidId)
        };
        match &result {
            Ok(done) => self
                .metrics
                .outcomes
                .with_label_values(&[done.metric_label()])
                .inc(),
            Err(e) => self.count_error(e),
        }
        result
    }

    /// Gives back an `Acquired` claim when nothing was executed (e.g. the legacy server could
    /// not be reached before the call was sent), so the client may retry with the same state.
    /// A finished claim is never released. True when a claim in progress was removed.
    pub async fn release(&self, id: &str) -> Result<bool, StoreError> {
        let result = if valid_id(id) {
            match &self.backend {
                Backend::Memory(m) => Ok(m.release(id)),
                Backend::Redis(r) => r.release(id).await,
            }
        } else {
            Err(StoreError::InvalidId)
        };
        if let Err(e) = &result {
            self.count_error(e);
        }
        result
    }

    /// Readiness: Ok when claims can be made (always for memory; a PING for Redis).
    pub async fn health(&self) -> Result<(), StoreError> {
        match &self.backend {
            Backend::Memory(_) => Ok(()),
            Backend::Redis(r) => r.health().await,
        }
    }

    /// `"memory"` or `"redis"`, for logs and the readiness answer.
    pub fn kind(&self) -> &'static str {
        match &self.backend {
            Backend::Memory(_) => "memory",
            Backend::Redis(_) => "redis",
        }
    }

    /// Ids held by the memory store; `None` for Redis.
    pub fn entries(&self) -> Option<usize> {
        match &self.backend {
            Backend::Memory(m) => Some(m.len()),
            Backend::Redis(_) => None,
        }
    }

    fn count_error(&self, e: &StoreError) {
        // Each of these refused a client's call; the detail (Redis error text) is only here.
        tracing::warn!(store = self.kind(), error = %e, "single-use store failure");
        self.metrics
            .errors
            .with_label_values(&[e.metric_reason()])
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    async fn memory_store(metrics: &SingleUseMetrics, max_entries: usize) -> SingleUseStore {
        let raw = config::RawSingleUse {
            max_entries: max_entries as u64,
            ..Default::default()
        };
        let cfg = SingleUseConfig::from_raw(&raw, None).unwrap();
        SingleUseStore::from_config(&cfg, metrics.clone())
            .await
            .unwrap()
    }

    fn count(v: &prometheus::IntCounterVec, label: &str) -> u64 {
        v.with_label_values(&[label]).get()
    }

    #[tokio::test]
    async fn every_claim_completion_and_error_is_counted() {
        let m = SingleUseMetrics::unregistered();
        let s = memory_store(&m, 1).await;
        assert_eq!(s.kind(), "memory");
        assert_eq!(s.claim("id1", MINUTE).await.unwrap(), Claim::Acquired);
        assert_eq!(s.claim("id1", MINUTE).await.unwrap(), Claim::InProgress);
        assert_eq!(m.entries.get(), 1);
        assert!(matches!(
            s.claim("id2", MINUTE).await,
            Err(StoreError::Full { .. })
        ));
        assert_eq!(
            s.complete("id1", Some(b"{}"), MINUTE).await.unwrap(),
            Completion::Kept
        );
        assert_eq!(
            s.claim("id1", MINUTE).await.unwrap(),
            Claim::Done(Bytes::from_static(b"{}"))
        );
        assert_eq!(count(&m.claims, "acquired"), 1);
        assert_eq!(count(&m.claims, "in_progress"), 1);
        assert_eq!(count(&m.claims, "done"), 1);
        assert_eq!(count(&m.errors, "full"), 1);
        assert_eq!(count(&m.outcomes, "kept"), 1);
        assert_eq!(s.entries(), Some(1));
        s.health().await.unwrap();
    }

    /// The engine runs requests on spawned tasks, so every store future must be `Send`.
    #[tokio::test]
    async fn store_futures_are_send() {
        fn assert_send<T: Send>(_: &T) {}
        let s = memory_store(&SingleUseMetrics::unregistered(), 10).await;
        assert_send(&s.claim("a", MINUTE));
        assert_send(&s.complete("a", None, MINUTE));
        assert_send(&s.release("a"));
        assert_send(&s.health());
    }

    #[tokio::test]
    async fn ids_the_gateway_never_mints_are_refused() {
        let m = SingleUseMetrics::unregistered();
        let s = memory_store(&m, 10).await;
        for bad in ["", "a{b}", "with space", &"x".repeat(65)] {
            assert_eq!(s.claim(bad, MINUTE).await, Err(StoreError::InvalidId));
        }
        assert_eq!(count(&m.errors, "invalid_id"), 4);
        assert_eq!(s.entries(), Some(0));
        assert!(valid_id("AAECAwQFBgcICQoLDA0ODw"));
    }
}
