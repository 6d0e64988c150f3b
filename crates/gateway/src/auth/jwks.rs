//! The JWKS fetched from `auth.jwt.jwks_url`: a cached key set and the policy for refreshing it.
//!
//! - The current key set sits behind an [`ArcSwap`]: a lookup on the request path is one
//!   atomic load and a hash lookup, never a lock.
//! - **Interval.** When the set is older than `jwks_refresh`, the request that notices starts a
//!   refresh in the background and carries on with the current keys. Doing it on demand rather
//!   than from a timer task means no task outlives an `Authenticator` that a config reload
//!   replaced, and an idle gateway does not poll its identity provider.
//! - **Unknown kid.** A token signed with a key the set does not hold (the provider rotated)
//!   triggers a fetch before the request is answered, but at most one fetch per
//!   `jwks_min_refresh_interval`, counting every attempt, failed ones included, so a stream of
//!   tokens with made-up kids cannot turn the gateway into a load generator against the
//!   provider. Fetches are serialized by one async mutex: requests that arrive during a fetch
//!   wait for it and then look again instead of starting their own.
//! - A failed fetch keeps the previous set. Before any fetch has succeeded there are no keys;
//!   requests then get [`Lookup::Unavailable`] (HTTP 503) rather than a 401 that would blame
//!   the client for the provider's outage.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use jsonwebtoken::Algorithm;
use tokio::sync::OwnedMutexGuard;

use super::config::RemoteJwksConfig;
use super::jwks_fetch::{FetchError, JwksFetcher};
use super::keys::{self, VerifyKey};

/// Counters for the JWKS fetcher, for export as metrics.
///
/// Shared by `Arc` so that a caller which rebuilds the authenticator on reload can keep one set
/// of counters across rebuilds (see [`super::Authenticator::with_counters`]).
#[derive(Debug, Default)]
pub struct JwksCounters {
    /// Fetches that returned a usable document.
    pub fetch_ok: AtomicU64,
    /// Fetches that hit `jwks_fetch_timeout`.
    pub fetch_timeout: AtomicU64,
    /// Fetches refused because the body exceeded `jwks_max_bytes`.
    pub fetch_too_large: AtomicU64,
    /// Fetches answered with a non-2xx status.
    pub fetch_bad_status: AtomicU64,
    /// Fetches that failed to connect or read.
    pub fetch_transport: AtomicU64,
    /// Documents fetched but not parseable as a JWKS.
    pub fetch_invalid: AtomicU64,
    /// Unknown-kid lookups that did not fetch because of `jwks_min_refresh_interval`.
    pub unknown_kid_rate_limited: AtomicU64,
}

/// A point-in-time copy of [`JwksCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JwksCountersSnapshot {
    pub fetch_ok: u64,
    pub fetch_timeout: u64,
    pub fetch_too_large: u64,
    pub fetch_bad_status: u64,
    pub fetch_transport: u64,
    pub fetch_invalid: u64,
    pub unknown_kid_rate_limited: u64,
}

impl JwksCounters {
    pub fn snapshot(&self) -> JwksCountersSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        JwksCountersSnapshot {
            fetch_ok: get(&self.fetch_ok),
            fetch_timeout: get(&self.fetch_timeout),
            fetch_too_large: get(&self.fetch_too_large),
            fetch_bad_status: get(&self.fetch_bad_status),
            fetch_transport: get(&self.fetch_transport),
            fetch_invalid: get(&self.fetch_invalid),
            unknown_kid_rate_limited: get(&self.unknown_kid_rate_limited),
        }
    }

    fn count_failure(&self, e: &FetchError) {
        let c = match e {
            FetchError::Timeout(_) => &self.fetch_timeout,
            FetchError::TooLarge(_) => &self.fetch_too_large,
            FetchError::Status(_) => &self.fetch_bad_status,
            FetchError::Transport(_) => &self.fetch_transport,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// The key set as of one successful fetch.
#[derive(Default)]
struct KeySet {
    keys: HashMap<String, Arc<VerifyKey>>,
    /// When the fetch that produced this set completed; `None` before the first success.
    loaded_at: Option<Instant>,
}

/// Held under the fetch mutex.
#[derive(Default)]
struct FetchLog {
    last_attempt: Option<Instant>,
}

/// Counts a request as queued behind a fetch for as long as it waits, even if it is dropped
/// while waiting.
struct WaitingGuard<'a>(&'a AtomicUsize);

impl<'a> WaitingGuard<'a> {
    fn enter(counter: &'a AtomicUsize) -> Self {
        counter.fetch_add(1, Ordering::AcqRel);
        WaitingGuard(counter)
    }
}

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The answer to "which key has this kid?" after the unknown-kid policy ran.
pub(crate) enum Lookup {
    Found(Arc<VerifyKey>),
    NotFound,
    /// No key set has ever been loaded, so the kid cannot be judged.
    Unavailable,
}

pub(crate) struct RemoteJwks {
    fetcher: JwksFetcher,
    refresh: Duration,
    min_refresh_interval: Duration,
    rsa_algorithm: Algorithm,
    current: ArcSwap<KeySet>,
    /// Serializes fetches. Owned guards let a fetch run in its own task with the gate held.
    fetch_gate: Arc<tokio::sync::Mutex<FetchLog>>,
    /// Set while a background refresh task exists, so that only one is started.
    background: AtomicBool,
    /// Requests queued behind a fetch in progress (observable so tests can line them up).
    waiting: AtomicUsize,
    counters: Arc<JwksCounters>,
    source: String,
}

impl RemoteJwks {
    pub(crate) fn new(
        cfg: &RemoteJwksConfig,
        counters: Arc<JwksCounters>,
    ) -> Result<RemoteJwks, String> {
        Ok(RemoteJwks {
            fetcher: JwksFetcher::new(cfg)?,
            refresh: cfg.refresh,
            min_refresh_interval: cfg.min_refresh_interval,
            rsa_algorithm: cfg.rsa_algorithm,
            current: ArcSwap::from_pointee(KeySet::default()),
            fetch_gate: Arc::new(tokio::sync::Mutex::new(FetchLog::default())),
            background: AtomicBool::new(false),
            waiting: AtomicUsize::new(0),
            counters,
            source: cfg.url.to_string(),
        })
    }

    /// The cached key for `kid`, without any fetching.
    pub(crate) fn get(&self, kid: &str) -> Option<Arc<VerifyKey>> {
        self.current.load().keys.get(kid).cloned()
    }

    /// Starts a background refresh when the cached set is older than `jwks_refresh`.
    pub(crate) fn refresh_if_stale(self: &Arc<Self>) {
        let stale = self
            .current
            .load()
            .loaded_at
            .is_some_and(|t| t.elapsed() >= self.refresh);
        if !stale || self.background.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.background.store(false, Ordering::Release);
            return;
        };
        let this = Arc::clone(self);
        runtime.spawn(async move {
            {
                let mut log = this.fetch_gate.lock().await;
                let still_stale = this
                    .current
                    .load()
                    .loaded_at
                    .is_none_or(|t| t.elapsed() >= this.refresh);
                if still_stale && this.may_fetch(&log) {
                    // Failures are counted and logged inside; the old set stays in use.
                    this.fetch_locked(&mut log).await;
                }
            }
            this.background.store(false, Ordering::Release);
        });
    }

    /// The unknown-kid path: fetch (subject to the rate limit) and look again.
    pub(crate) async fn lookup_after_refresh(self: &Arc<Self>, kid: &str) -> Lookup {
        let log = {
            let _waiting = WaitingGuard::enter(&self.waiting);
            Arc::clone(&self.fetch_gate).lock_owned().await
        };
        // A fetch that finished while this request waited may have brought the key.
        if let Some(k) = self.get(kid) {
            return Lookup::Found(k);
        }
        if self.may_fetch(&log) {
            self.fetch_detached(log).await;
        } else {
            self.counters
                .unknown_kid_rate_limited
                .fetch_add(1, Ordering::Relaxed);
        }
        let set = self.current.load();
        match set.keys.get(kid) {
            Some(k) => Lookup::Found(Arc::clone(k)),
            None if set.loaded_at.is_none() => Lookup::Unavailable,
            None => Lookup::NotFound,
        }
    }

    /// Fetches now unless one was attempted within `jwks_min_refresh_interval`; for warming
    /// the cache at startup. Returns whether a key set is loaded afterwards.
    pub(crate) async fn prefetch(self: &Arc<Self>) -> bool {
        let log = Arc::clone(&self.fetch_gate).lock_owned().await;
        if self.may_fetch(&log) {
            self.fetch_detached(log).await;
        }
        self.current.load().loaded_at.is_some()
    }

    fn may_fetch(&self, log: &FetchLog) -> bool {
        log.last_attempt
            .is_none_or(|t| t.elapsed() >= self.min_refresh_interval)
    }

    /// Runs one fetch in a task of its own that keeps the gate until the fetch ends: a request
    /// that goes away (client disconnect, request timeout) must not cancel a fetch that other
    /// requests are queued behind, nor release the gate before the new keys are in place.
    async fn fetch_detached(self: &Arc<Self>, mut log: OwnedMutexGuard<FetchLog>) {
        let this = Arc::clone(self);
        let task = tokio::spawn(async move { this.fetch_locked(&mut log).await });
        // An error here means the task panicked or the runtime is shutting down; either way
        // the caller just reads whatever key set is current.
        let _ = task.await;
    }

    /// One fetch, with the gate held. Replaces the key set on success; on failure counts and
    /// logs it and leaves the set as it was.
    async fn fetch_locked(&self, log: &mut FetchLog) {
        log.last_attempt = Some(Instant::now());
        let body = match self.fetcher.fetch().await {
            Ok(body) => body,
            Err(e) => {
                self.counters.count_failure(&e);
                tracing::warn!(
                    source = %self.source,
                    outcome = e.outcome(),
                    error = %e,
                    "JWKS fetch failed; keeping the previous key set"
                );
                return;
            }
        };
        let parsed = match keys::keys_from_jwks(&body, self.rsa_algorithm) {
            Ok(parsed) => parsed,
            Err(e) => {
                self.counters.fetch_invalid.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(source = %self.source, error = %e, "JWKS document rejected");
                return;
            }
        };
        for problem in &parsed.skipped {
            tracing::warn!(source = %self.source, problem = %problem, "JWKS entry ignored");
        }
        let keys: HashMap<String, Arc<VerifyKey>> = parsed
            .keys
            .into_iter()
            .map(|k| (k.kid.clone(), Arc::new(k)))
            .collect();
        tracing::info!(source = %self.source, keys = keys.len(), "JWKS loaded");
        self.current.store(Arc::new(KeySet {
            keys,
            loaded_at: Some(Instant::now()),
        }));
        self.counters.fetch_ok.fetch_add(1, Ordering::Relaxed);
    }

    /// Requests currently waiting for a fetch in progress.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// Makes the cache behave as if `by` more time had passed since its last load and its
    /// last fetch attempt, so tests can cross the refresh and rate-limit intervals without
    /// sleeping through them.
    #[cfg(test)]
    pub(crate) async fn age_by(&self, by: Duration) {
        let mut log = self.fetch_gate.lock().await;
        log.last_attempt = log.last_attempt.and_then(|t| t.checked_sub(by));
        let set = self.current.load();
        self.current.store(Arc::new(KeySet {
            keys: set.keys.clone(),
            loaded_at: set.loaded_at.and_then(|t| t.checked_sub(by)),
        }));
    }
}
