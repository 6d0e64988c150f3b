//! Single use of `requestState`: at most one execution per state, and the same answer for
//! every duplicate — also when the store stalls, the client goes away, the configuration is
//! reloaded, or replicas' clocks differ.
//!
//! Every sealed state carries a random id (`StatePayload::id`). Before a retry replays
//! anything, the engine *claims* that id here for an [`Owner`] (a random token naming this one
//! presentation), then *starts* it, and finally records the outcome:
//!
//! ```text
//! claim(id, owner) ─ Acquired / TakenOver ─▶ start(id, owner) ─ true ─▶ run ─▶ complete(id, owner, result)
//!      │                                          │                      └──▶ release(id, owner)  (nothing ran)
//!      │                                          └ false: taken over ─▶ 409 "retry in progress"
//!      ├─ InProgress   ─▶ 409 "retry in progress"           (duplicate::in_progress)
//!      ├─ Done(bytes)  ─▶ answer with exactly those result bytes
//!      ├─ DoneNotKept / Lost ─▶ 409 "already used"          (duplicate::already_used)
//!      └─ Err(_)       ─▶ 503 (429 for a caller over its quota), nothing runs (fail closed)
//! ```
//!
//! Three phases, so that an outcome the gateway does not know is resolved, never stuck:
//! - **claimed** (not started) carries a short lease (`single_use.claim_lease`). If the
//!   claim's answer was lost (a store stall past its command timeout: the claim landed, the
//!   gateway had already refused the request) or its owner died before starting, a later
//!   presentation takes the claim over once the lease has passed and runs the call: once,
//!   because the first owner never started it. The owner also gives such a claim back in the
//!   background ([`SingleUseStore::release_eventually`]), so the retry usually need not wait.
//! - **started**: the call may have reached the legacy server, so it never runs again. Its
//!   owner records the outcome; a write that fails is retried in the background until it
//!   lands or the claim expires ([`SingleUseStore::complete_eventually`]), and duplicates see
//!   "in progress" meanwhile, then the outcome. The start carries a run lease (the call's
//!   longest life, `upstream.call_timeout`, plus the claim lease): a started claim with no
//!   outcome after it (its replica died) answers duplicates "already used", so the client
//!   starts over instead of waiting for the state to expire.
//! - **done**, with the outcome kept (within `max_outcome_bytes`) or not.
//!
//! `ttl` is how long the claim must live: at least until no replica can still accept the
//! state (the engine adds twice `state.clock_skew`, see `mrtr::at_most_once`). Remembering the
//! outcome is the idempotency-key pattern: a client whose response was lost presents the state
//! again and gets the same result instead of an error or a second execution.
//!
//! Two backends behind one type, [`SingleUseStore`]: [`memory::MemoryStore`] (default, one
//! replica: claims are **per replica**) and [`redis_store::RedisStore`] (a fleet). Which
//! retries claim at all is decided by [`policy::PolicyTable`] (`[single_use] policy` and
//! `[[single_use.rules]]`).
//!
//! Reloads ([`SingleUseStore::reconfigured`]) never forget a claim: when only limits change,
//! the memory store is kept and its limits replaced; when the claims move elsewhere (memory →
//! Redis, Redis → memory, other Redis servers, another `key_prefix`), the store they were in is
//! *retired*: still asked first (never claimed in) until the last claim it can hold has
//! expired, so a state claimed before the switch is never claimed again after it. A retired
//! memory store knows when it is empty; a retired Redis target is asked for the longest a claim
//! can live (`state.ttl` + 2 × `state.clock_skew`, or longer if this replica made a longer
//! claim there), and while it is, a lookup it cannot answer refuses the claim (fail closed, as
//! for the store in force). Claims settle in the store that granted them.

pub mod config;
pub mod duplicate;
mod eventual;
pub mod memory;
pub mod metrics;
pub mod policy;
pub mod redis_store;
mod store_error;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

pub use config::{SingleUseConfig, StoreKind};
pub use duplicate::{already_used, in_progress, outcome_lost};
pub use memory::{MemoryLimits, MemoryStore};
pub use metrics::SingleUseMetrics;
pub use policy::Policy;
pub use redis_store::RedisStore;
pub use store_error::StoreError;

/// What a claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This owner holds the id now and must `start` it, then `complete` or `release` it.
    Acquired,
    /// As `Acquired`, taking over a claim whose owner never started its call within the
    /// claim lease.
    TakenOver,
    /// Another presentation holds the id and has not finished.
    InProgress,
    /// Finished; the kept outcome (the JSON-RPC `result` bytes exactly as first sent).
    Done(Bytes),
    /// Finished; the outcome was too large to keep, or there was none.
    DoneNotKept,
    /// Its call started but no outcome was recorded within the run lease (its replica died):
    /// the call may have run, so it never runs again, and there is nothing to repeat.
    Lost,
}

impl Claim {
    /// The `result` label of `single_use_claims_total`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Claim::Acquired => "acquired",
            Claim::TakenOver => "taken_over",
            Claim::InProgress => "in_progress",
            Claim::Done(_) => "done",
            Claim::DoneNotKept => "not_kept",
            Claim::Lost => "lost",
        }
    }

    /// Whether the claimant now owns the id.
    pub fn owned(&self) -> bool {
        matches!(self, Claim::Acquired | Claim::TakenOver)
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
    /// There was no started claim of this owner for the id (expired, released, taken over or
    /// already completed); nothing was recorded.
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

/// Who claims an id: a random token naming one presentation of a state, and the principal it
/// runs for (the memory store's per-principal quota counts by it).
#[derive(Debug, Clone)]
pub struct Owner {
    token: Arc<str>,
    principal: Arc<str>,
}

impl Owner {
    /// A fresh owner whose ids count against `principal`'s quota.
    pub fn new(principal: &str) -> Owner {
        let mut b = [0u8; 16];
        getrandom::fill(&mut b).expect("the OS random source failed");
        Owner {
            token: b
                .iter()
                .map(|x| format!("{x:02x}"))
                .collect::<String>()
                .into(),
            principal: principal.into(),
        }
    }

    pub fn token(&self) -> &str {
        &self.token
    }

    pub fn principal(&self) -> &str {
        &self.principal
    }

    fn token_arc(&self) -> Arc<str> {
        self.token.clone()
    }

    /// The caller to count the id against.
    fn quota_principal(&self) -> Arc<str> {
        self.principal.clone()
    }
}

/// The claim store the engine uses; cheap to clone (clones share the backend).
#[derive(Clone)]
pub struct SingleUseStore {
    backend: Backend,
    /// Stores replaced by reloads that may still hold claims: asked before `backend`, oldest
    /// first, until they cannot hold any.
    retired: Arc<Vec<Retired>>,
    /// What `backend` was built from (`[single_use]` without the policy rules).
    settings: String,
    /// Where `backend` keeps claims, when that is Redis ([`redis_target`]).
    target: Option<String>,
    /// When the longest claim this store granted expires (a retired Redis target is asked at
    /// least until then).
    latest_expiry: Arc<std::sync::Mutex<Instant>>,
    metrics: SingleUseMetrics,
}

#[derive(Clone)]
enum Backend {
    Memory(MemoryStore),
    Redis(RedisStore),
}

/// A store a reload replaced while it could still hold claims.
#[derive(Clone)]
enum Retired {
    /// Asked while it holds entries (it knows when they expire).
    Memory(MemoryStore),
    /// Claims under another Redis target: asked (never claimed in) until `until`, when the
    /// last claim it can hold has expired.
    Redis {
        store: RedisStore,
        target: String,
        until: Instant,
    },
}

impl Retired {
    /// Whether it may still hold a claim.
    fn live(&self, now: Instant) -> bool {
        match self {
            Retired::Memory(m) => !m.is_empty(),
            Retired::Redis { until, .. } => *until > now,
        }
    }

    /// What holds `id` here (`None`: nothing, or this store cannot hold claims any more).
    async fn lookup(&self, id: &str, now: Instant) -> Result<Option<Claim>, StoreError> {
        match self {
            Retired::Memory(m) => Ok(m.peek(id)),
            Retired::Redis { until, .. } if *until <= now => Ok(None),
            Retired::Redis { store, .. } => store.lookup(id).await.map_err(|e| match e {
                StoreError::Unavailable(m) => StoreError::Unavailable(format!(
                    "the Redis store a reload retired (asked until its claims expire): {m}"
                )),
                other => other,
            }),
        }
    }
}

/// Where a Redis configuration keeps its claims: the servers (URLs without credentials: a new
/// password reaches the same data), cluster or not, and the key prefix. `None` for memory.
fn redis_target(cfg: &SingleUseConfig) -> Option<String> {
    if cfg.store != StoreKind::Redis {
        return None;
    }
    let urls: Vec<String> = cfg
        .redis
        .urls
        .iter()
        .map(|u| match url::Url::parse(u.as_str()) {
            Ok(mut url) => {
                let _ = url.set_username("");
                let _ = url.set_password(None);
                url.to_string()
            }
            Err(_) => u.as_str().to_string(),
        })
        .collect();
    Some(format!(
        "{urls:?} cluster={} prefix={:?}",
        cfg.redis.cluster, cfg.redis.key_prefix
    ))
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

fn memory_limits(cfg: &SingleUseConfig) -> MemoryLimits {
    MemoryLimits {
        share: cfg.entry_share,
        max_outcome_bytes: cfg.max_outcome_bytes,
        max_total_outcome_bytes: cfg.max_total_outcome_bytes,
        sweep_interval: cfg.sweep_interval,
        claim_lease: cfg.claim_lease,
    }
}

/// The parts of `[single_use]` the backend is built from (the policy rules are read per
/// request from the configuration in force, not from the store). The URLs are compared as
/// written: their `Debug` form hides the password, and a new password needs a new client.
fn settings_of(cfg: &SingleUseConfig) -> String {
    let urls: Vec<&str> = cfg.redis.urls.iter().map(|u| u.as_str()).collect();
    format!(
        "{:?} {urls:?} {:?} {:?} {:?}",
        cfg.store,
        cfg.redis,
        memory_limits(cfg),
        cfg.max_outcome_bytes
    )
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
                memory_limits(cfg),
                metrics.entries_gauge(),
            )),
            StoreKind::Redis => {
                metrics.entries_gauge().set(0);
                Backend::Redis(RedisStore::new(
                    &cfg.redis,
                    cfg.max_outcome_bytes,
                    cfg.claim_lease,
                )?)
            }
        };
        Ok(SingleUseStore {
            backend,
            retired: Arc::new(Vec::new()),
            settings: settings_of(cfg),
            target: redis_target(cfg),
            latest_expiry: Arc::new(std::sync::Mutex::new(Instant::now())),
            metrics,
        })
    }

    /// [`SingleUseStore::build`], for async callers.
    pub async fn from_config(
        cfg: &SingleUseConfig,
        metrics: SingleUseMetrics,
    ) -> Result<SingleUseStore, StoreError> {
        Self::build(cfg, metrics)
    }

    /// The store to use after a reload to `cfg`, or `None` when this one serves unchanged.
    /// Nothing claimed before is forgotten: memory → memory keeps the store (with the new
    /// limits); any other change builds the new backend and retires the old one when its
    /// claims are elsewhere than the new one's: a memory store while it holds entries, a Redis
    /// target for `claim_horizon` (how long a claim made under the configuration being
    /// replaced can live) or until the longest claim it granted here expires, whichever is
    /// later. Claims in flight settle in the store that granted them.
    pub fn reconfigured(
        &self,
        cfg: &SingleUseConfig,
        claim_horizon: Duration,
    ) -> Result<Option<SingleUseStore>, StoreError> {
        let settings = settings_of(cfg);
        if settings == self.settings {
            return Ok(None);
        }
        let now = Instant::now();
        let target = redis_target(cfg);
        let mut retired: Vec<Retired> = self
            .retired
            .iter()
            .filter(|r| r.live(now))
            .cloned()
            .collect();
        let backend = match (&self.backend, cfg.store) {
            (Backend::Memory(m), StoreKind::Memory) => {
                m.set_limits(memory_limits(cfg));
                tracing::info!(
                    entries = m.len(),
                    "single-use limits changed; the memory store and its claims are kept"
                );
                Backend::Memory(m.clone())
            }
            (old, _) => {
                let new = SingleUseStore::build(cfg, self.metrics.clone())?;
                match old {
                    Backend::Memory(m) if !m.is_empty() => {
                        tracing::info!(
                            entries = m.len(),
                            to = new.kind(),
                            "single-use store switched; the claims held in memory are still \
                             honoured on this replica until they expire"
                        );
                        retired.push(Retired::Memory(m.clone()));
                    }
                    Backend::Redis(r) if self.target != target => {
                        let latest = *self.latest_expiry.lock().expect("not poisoned");
                        let until = latest.max(now + claim_horizon);
                        tracing::warn!(
                            to = new.kind(),
                            asked_for_secs = until.saturating_duration_since(now).as_secs(),
                            "single-use claims moved to another store; the previous Redis \
                             target is still asked (never claimed in) until its claims have \
                             expired: keep it reachable until then, or retries that it must \
                             be asked about are refused (503)"
                        );
                        retired.push(Retired::Redis {
                            store: r.clone(),
                            target: self.target.clone().unwrap_or_default(),
                            until,
                        });
                    }
                    _ => {}
                }
                new.backend
            }
        };
        // A target in force again is asked as the backend, not as a retired store.
        if let Some(t) = &target {
            retired.retain(|r| !matches!(r, Retired::Redis { target, .. } if target == t));
        }
        if let Backend::Memory(_) = backend {
            warn_per_replica();
        }
        // The same target (new limits, timeouts or password) holds the same claims: the
        // longest one granted there carries over.
        let latest_expiry = if target == self.target {
            self.latest_expiry.clone()
        } else {
            Arc::new(std::sync::Mutex::new(now))
        };
        Ok(Some(SingleUseStore {
            backend,
            retired: Arc::new(retired),
            settings,
            target,
            latest_expiry,
            metrics: self.metrics.clone(),
        }))
    }

    /// Claims `id` for `owner` for `ttl` (how long no replica may claim it again), or
    /// reports what holds it. A retired store that still knows the id answers first.
    pub async fn claim(&self, id: &str, owner: &Owner, ttl: Duration) -> Result<Claim, StoreError> {
        let result = if !valid_id(id) {
            Err(StoreError::InvalidId)
        } else {
            match self.retired_lookup(id).await {
                Err(e) => Err(e),
                Ok(Some(found)) => Ok(found),
                Ok(None) => match &self.backend {
                    Backend::Memory(m) => m.claim(id, owner, ttl),
                    Backend::Redis(r) => r.claim(id, owner, ttl).await,
                },
            }
        };
        match &result {
            Ok(claim) => {
                if claim.owned() {
                    let mut latest = self.latest_expiry.lock().expect("not poisoned");
                    *latest = (*latest).max(Instant::now() + ttl);
                }
                self.metrics.claimed(claim.metric_label())
            }
            Err(e) => self.count_error(e),
        }
        result
    }

    /// What holds `id` now, without claiming it (`None`: nothing does). The retired stores
    /// answer first, as for [`SingleUseStore::claim`].
    pub async fn peek(&self, id: &str) -> Result<Option<Claim>, StoreError> {
        let result = match self.retired_lookup(id).await {
            Err(e) => Err(e),
            Ok(Some(found)) => Ok(Some(found)),
            Ok(None) => match self.backend_for(id) {
                Err(e) => Err(e),
                Ok(Backend::Memory(m)) => Ok(m.peek(id)),
                Ok(Backend::Redis(r)) => r.lookup(id).await,
            },
        };
        if let Err(e) = &result {
            self.count_error(e);
        }
        result
    }

    /// What the retired stores know of `id`, oldest first.
    async fn retired_lookup(&self, id: &str) -> Result<Option<Claim>, StoreError> {
        let now = Instant::now();
        for r in self.retired.iter() {
            if let Some(found) = r.lookup(id, now).await? {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    /// Marks `owner`'s claim on `id` started (its call may now reach the legacy server) with
    /// `run_lease` to record the outcome. `Ok(false)`: the claim was taken over, do not run.
    pub async fn start(
        &self,
        id: &str,
        owner: &Owner,
        run_lease: Duration,
    ) -> Result<bool, StoreError> {
        let result = match self.backend_for(id) {
            Err(e) => Err(e),
            Ok(Backend::Memory(m)) => Ok(m.start(id, owner, run_lease)),
            Ok(Backend::Redis(r)) => r.start(id, owner, run_lease).await,
        };
        if let Err(e) = &result {
            self.count_error(e);
        }
        result
    }

    /// Records the outcome of `owner`'s started claim for `ttl`: `Some(result bytes)` is kept
    /// for duplicates when it fits `max_outcome_bytes`; `None` or a larger one makes
    /// duplicates get "already used".
    pub async fn complete(
        &self,
        id: &str,
        owner: &Owner,
        outcome: Option<&[u8]>,
        ttl: Duration,
    ) -> Result<Completion, StoreError> {
        let result = self.backend_complete(id, owner, outcome, ttl).await;
        match &result {
            Ok(done) => self.metrics.completed(done.metric_label()),
            Err(e) => self.count_error(e),
        }
        result
    }

    /// Gives back `owner`'s claim when its call never ran (the legacy server could not be
    /// reached before the call was sent, or the owner refused to run it), so the client may
    /// retry with the same state. A finished claim is never released. True when a claim was
    /// removed.
    pub async fn release(&self, id: &str, owner: &Owner) -> Result<bool, StoreError> {
        let result = self.backend_release(id, owner).await;
        if let Err(e) = &result {
            self.count_error(e);
        }
        result
    }

    /// Ends the run lease of `owner`'s started claim on `id` now, without an outcome: its
    /// duplicates are told at once that the outcome was lost (a drain gives up a call it could
    /// not wait for). True when there was such a claim.
    pub async fn abandon(&self, id: &str, owner: &Owner) -> Result<bool, StoreError> {
        let result = match self.backend_for(id) {
            Err(e) => Err(e),
            Ok(Backend::Memory(m)) => Ok(m.abandon(id, owner)),
            Ok(Backend::Redis(r)) => r.abandon(id, owner).await,
        };
        if let Err(e) = &result {
            self.count_error(e);
        }
        result
    }

    /// [`SingleUseStore::complete`], and when that fails, retries in the background until the
    /// outcome lands or `until` (the claim's expiry) passes. Duplicates see "in progress"
    /// until then.
    pub async fn complete_eventually(
        &self,
        id: &str,
        owner: &Owner,
        outcome: Option<Vec<u8>>,
        until: Instant,
    ) {
        let ttl = until.saturating_duration_since(Instant::now());
        if let Err(e) = self.complete(id, owner, outcome.as_deref(), ttl).await {
            tracing::warn!(error = %e, "could not record a single-use outcome; retrying in the background");
            eventual::retry(
                self.clone(),
                eventual::Write::Complete {
                    id: id.to_owned(),
                    owner: owner.clone(),
                    outcome,
                },
                until,
            );
        }
    }

    /// [`SingleUseStore::release`], retried in the background (until `until`) when it fails.
    /// For an owner whose claim or start failed in a way that may still have landed: it never
    /// runs the call, so its claim can go.
    pub async fn release_eventually(&self, id: &str, owner: &Owner, until: Instant) {
        if let Err(e) = self.release(id, owner).await {
            tracing::warn!(error = %e, "could not give back a single-use claim; retrying in the background");
            eventual::retry(
                self.clone(),
                eventual::Write::Release {
                    id: id.to_owned(),
                    owner: owner.clone(),
                },
                until,
            );
        }
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

    /// The Redis store, when claims are kept there: the fleet store other fleet-wide records
    /// (tasks) share, with its connection, key prefix and timeouts.
    pub fn redis(&self) -> Option<RedisStore> {
        match &self.backend {
            Backend::Memory(_) => None,
            Backend::Redis(r) => Some(r.clone()),
        }
    }

    /// Whether claims are this replica's alone (the memory store).
    pub fn per_replica(&self) -> bool {
        matches!(self.backend, Backend::Memory(_))
    }

    /// Ids held by the memory store; `None` for Redis.
    pub fn entries(&self) -> Option<usize> {
        match &self.backend {
            Backend::Memory(m) => Some(m.len()),
            Backend::Redis(_) => None,
        }
    }

    /// Stores retired by reloads that may still hold claims (memory stores holding entries,
    /// Redis targets within their time).
    pub fn retired_stores(&self) -> usize {
        let now = Instant::now();
        self.retired.iter().filter(|r| r.live(now)).count()
    }

    pub(crate) fn metrics(&self) -> &SingleUseMetrics {
        &self.metrics
    }

    fn backend_for(&self, id: &str) -> Result<&Backend, StoreError> {
        if valid_id(id) {
            Ok(&self.backend)
        } else {
            Err(StoreError::InvalidId)
        }
    }

    /// `complete` without counting (background retries count once, when they give up).
    async fn backend_complete(
        &self,
        id: &str,
        owner: &Owner,
        outcome: Option<&[u8]>,
        ttl: Duration,
    ) -> Result<Completion, StoreError> {
        match self.backend_for(id)? {
            Backend::Memory(m) => Ok(m.complete(id, owner, outcome, ttl)),
            Backend::Redis(r) => r.complete(id, owner, outcome, ttl).await,
        }
    }

    /// `release` without counting.
    async fn backend_release(&self, id: &str, owner: &Owner) -> Result<bool, StoreError> {
        match self.backend_for(id)? {
            Backend::Memory(m) => Ok(m.release(id, owner)),
            Backend::Redis(r) => r.release(id, owner).await,
        }
    }

    fn count_error(&self, e: &StoreError) {
        if let StoreError::PrincipalQuota { .. } | StoreError::NewcomerReserve { .. } = e {
            // The caller's own doing; counted, not worth a warning per request.
            tracing::debug!(error = %e, "single-use claim refused");
        } else {
            // Each of these refused a client's call; the detail (Redis error text) is only here.
            tracing::warn!(store = self.kind(), error = %e, "single-use store failure");
        }
        self.metrics.failed(e.metric_reason());
    }
}

/// The start-up (and reload) notice for the memory store.
pub fn warn_per_replica() {
    tracing::warn!(
        store = "memory",
        "single-use claims are kept per replica: a duplicate retry that reaches another replica \
         is not recognised and runs the call again; run one replica, or set [single_use] store \
         = \"redis\" for a fleet"
    );
}

#[cfg(test)]
mod tests;
