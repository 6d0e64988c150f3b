//! The gateway's shared state: configuration, upstream client, state codec, caches, metrics.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use http::HeaderMap;
use tokio::sync::mpsc;

use crate::auth::Authenticator;
use crate::config::{Config, PoolMode};
use crate::error::Rejection;
use crate::legacy::capabilities::Declared;
use crate::legacy::limit_hits::LimitHits;
use crate::legacy::pool::{Lease, PoolKey, PoolMetrics, SessionPool};
use crate::legacy::session::{Inbound, LegacySession};
use crate::legacy::upstream::Upstream;
use crate::metrics::Metrics;
use crate::mrtr::parking::ParkingLot;
use crate::single_use::{SingleUseMetrics, SingleUseStore};
use crate::state::{KeyRing, StateCodec, StateLimits};
use tokio_util::sync::CancellationToken;

pub struct Gateway {
    config: ArcSwap<Config>,
    upstream: ArcSwap<Upstream>,
    pub codec: StateCodec,
    pub metrics: Metrics,
    /// This process's identity among replicas (logs, metrics, parking references).
    pub instance_id: String,
    /// The wall clock the engine reads (a seam: tests give replicas clocks that differ).
    pub clock: crate::clock::Clock,
    /// Set once a drain has begun: readiness fails, new work is still served until the
    /// listener stops accepting.
    draining: AtomicBool,
    /// Bounds requests served at once (`listen.max_concurrent_requests`).
    request_slots: Arc<Semaphore>,
    request_slots_size: AtomicUsize,
    /// The cached `/readyz` check that the legacy server speaks MCP.
    upstream_check: crate::readiness::UpstreamCheck,
    /// Blocked legacy calls waiting for their retry on this replica.
    pub parking: Arc<ParkingLot>,
    /// Warm legacy sessions between calls.
    pub pool: Arc<SessionPool>,
    /// Who is calling (rebuilt on reload, so key files are re-read).
    auth: ArcSwap<Authenticator>,
    /// Where `requestState` ids are claimed (replaced on reload only as
    /// `SingleUseStore::reconfigured` decides, which never forgets a claim).
    single_use: ArcSwap<SingleUseStore>,
    /// Stops background tasks (the parking sweeper) when the gateway goes away.
    background: CancellationToken,
    /// Hook (long-lived responses): listen and legacy GET streams; their count, their shutdown.
    pub long_lived: crate::front::long_lived::LongLived,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.background.cancel();
    }
}

pub use crate::readiness::Readiness;

/// A random instance id: 8 bytes, hex.
pub fn random_instance_id() -> String {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).expect("the OS random source failed");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Gateway {
    /// Builds the gateway; panics on a configuration the loader should have refused (tests,
    /// demo). `serve` uses [`Gateway::try_new`].
    pub fn new(config: Config) -> Arc<Gateway> {
        Self::try_new(config).unwrap_or_else(|e| panic!("gateway configuration: {e}"))
    }

    /// Builds the gateway; must run inside a Tokio runtime.
    pub fn try_new(config: Config) -> Result<Arc<Gateway>, String> {
        Self::try_new_with_clock(config, crate::clock::Clock::system())
    }

    /// [`Gateway::try_new`] with the engine reading `clock`.
    pub fn try_new_with_clock(
        config: Config,
        clock: crate::clock::Clock,
    ) -> Result<Arc<Gateway>, String> {
        let instance_id = config.replica.id.clone().unwrap_or_else(random_instance_id);
        let slots = config.listen.max_concurrent_requests;
        let metrics = Metrics::new(&instance_id);
        let hits = LimitHits::new(metrics.limit_hits.clone());
        metrics.key_ring_keys.set(config.state.keys.len() as i64);
        let parking = ParkingLot::new(
            metrics.parked_calls.clone(),
            metrics.parked_evictions.clone(),
        );
        let auth = Authenticator::new(config.auth.clone()).map_err(|e| e.to_string())?;
        let single_use_metrics =
            SingleUseMetrics::register(&metrics.registry).map_err(|e| e.to_string())?;
        let single_use = SingleUseStore::build(&config.single_use, single_use_metrics)
            .map_err(|e| e.to_string())?;
        let long_lived = crate::front::long_lived::LongLived::new(
            metrics.listen_streams.clone(),
            metrics.legacy_get_streams.clone(),
        );
        let pool = Arc::new(SessionPool::new(
            PoolMetrics {
                idle: metrics.pool_idle.clone(),
                checkouts: metrics.pool_checkouts.clone(),
                discards: metrics.pool_discards.clone(),
            },
            config.pool.idle_timeout,
            Some(long_lived.relay_handle()),
        ));
        let background = CancellationToken::new();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(
                parking
                    .clone()
                    .run_sweeper(Duration::from_millis(500), background.clone()),
            );
            rt.spawn(pool.clone().run_sweeper(background.clone()));
        }
        let gateway = Arc::new(Gateway {
            parking,
            pool,
            background,
            auth: ArcSwap::from_pointee(auth),
            single_use: ArcSwap::from_pointee(single_use),
            draining: AtomicBool::new(false),
            request_slots: Arc::new(Semaphore::new(slots)),
            request_slots_size: AtomicUsize::new(slots),
            upstream_check: crate::readiness::UpstreamCheck::new(metrics.upstream_checks.clone()),
            upstream: ArcSwap::from_pointee(Upstream::from_config(&config.upstream, hits)),
            codec: StateCodec::new(&config.state.keys, config.state.ttl, config.state.max_bytes)
                .with_clock_skew(config.state.clock_skew),
            long_lived,
            metrics,
            instance_id,
            clock,
            config: ArcSwap::from_pointee(config),
        });
        if gateway.config().pool.warm_up > 0
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            // Bounded by the upstream timeouts; stops early once the gateway drains.
            let gw = gateway.clone();
            rt.spawn(async move { gw.warm_pool().await });
        }
        Ok(gateway)
    }

    pub fn auth(&self) -> Arc<Authenticator> {
        self.auth.load_full()
    }

    pub fn single_use(&self) -> Arc<SingleUseStore> {
        self.single_use.load_full()
    }

    /// The configuration in force (a snapshot: hold it for one request, not longer).
    pub fn config(&self) -> Arc<Config> {
        self.config.load_full()
    }

    /// The legacy server in force.
    pub fn upstream(&self) -> Arc<Upstream> {
        self.upstream.load_full()
    }

    /// Replaces the configuration (reload). The key ring, state limits and request-slot count
    /// follow; a changed `[upstream]` section swaps in a new upstream client.
    pub fn apply_config(&self, new: Config) -> Result<(), String> {
        let old = self.config();
        let auth = Authenticator::with_counters(new.auth.clone(), self.auth().counters().clone())
            .map_err(|e| e.to_string())?;
        // Never forgets a claim: see `SingleUseStore::reconfigured`.
        let single_use = self
            .single_use()
            .reconfigured(&new.single_use)
            .map_err(|e| e.to_string())?;
        self.auth.store(Arc::new(auth));
        if let Some(store) = single_use {
            tracing::info!(store = store.kind(), "single-use store replaced");
            self.single_use.store(Arc::new(store));
        }
        if format!("{:?}", old.upstream) != format!("{:?}", new.upstream) {
            let upstream = crate::config::redact::redacted_url(&new.upstream.url);
            tracing::info!(%upstream, "upstream changed; new calls use it");
            self.upstream.store(Arc::new(Upstream::from_config(
                &new.upstream,
                LimitHits::new(self.metrics.limit_hits.clone()),
            )));
            // Warm sessions belong to the old upstream.
            let pool = self.pool.clone();
            tokio::spawn(async move { pool.clear().await });
        }
        self.pool.set_idle_timeout(new.pool.idle_timeout);
        // A reload may follow an upgrade of the legacy server: learn its roots handling anew.
        self.pool.roots_memory().reset();
        self.codec.replace_ring(KeyRing::new(&new.state.keys));
        self.metrics.key_ring_keys.set(new.state.keys.len() as i64);
        self.codec.set_limits(StateLimits {
            ttl: new.state.ttl,
            max_bytes: new.state.max_bytes,
            clock_skew: new.state.clock_skew,
        });
        self.resize_request_slots(new.listen.max_concurrent_requests);
        self.config.store(Arc::new(new));
        Ok(())
    }

    fn resize_request_slots(&self, want: usize) {
        let have = self.request_slots_size.swap(want, Ordering::AcqRel);
        if want > have {
            self.request_slots.add_permits(want - have);
        } else if want < have {
            // Shrink by forgetting free permits now; the rest are forgotten as they return.
            let mut left = have - want;
            left -= self.request_slots.forget_permits(left);
            if left > 0 {
                let slots = self.request_slots.clone();
                tokio::spawn(async move {
                    while left > 0 {
                        match slots.acquire().await {
                            Ok(p) => {
                                p.forget();
                                left -= 1;
                            }
                            Err(_) => return,
                        }
                    }
                });
            }
        }
    }

    /// A slot for one request, or `None` when `listen.max_concurrent_requests` are in flight.
    pub fn try_request_slot(&self) -> Option<OwnedSemaphorePermit> {
        self.request_slots.clone().try_acquire_owned().ok()
    }

    /// Cancels every parked call upstream and closes warm sessions (shutdown).
    pub async fn release_parked(&self) {
        self.parking.clear().await;
        self.pool.clear().await;
    }

    /// A session for a call: a warm one from the pool, or a new one.
    pub async fn checkout_session(
        &self,
        key: &PoolKey,
        declared: &Declared,
        headers: HeaderMap,
    ) -> Result<Lease, Rejection> {
        let cfg = self.config();
        if let Some(s) = self.pool.checkout(key, &cfg.pool).await {
            return Ok(s);
        }
        // Idle children count against stdio's child limit: make room rather than wait.
        if self.upstream().at_capacity() {
            self.pool.evict_one().await;
        }
        let (session, inbound) = self.open_session(declared, headers).await?;
        Ok(Lease::fresh(session, inbound))
    }

    /// Opens `pool.warm_up` legacy sessions into the pool (at start), declaring
    /// `pool.warm_up_capabilities`, under the key an anonymous request with those capabilities
    /// will look for. Stops at the first failure (the legacy server may still be starting;
    /// calls then open their own sessions) and once the gateway drains (shutdown closes the
    /// pool; a session opened after that is closed, not pooled). Returns how many sessions
    /// were added.
    pub async fn warm_pool(&self) -> usize {
        let cfg = self.config();
        if cfg.pool.warm_up == 0 || cfg.pool.mode == PoolMode::PerCall {
            return 0;
        }
        let auth = self.auth();
        let nothing = HeaderMap::new();
        let declared = &cfg.pool.warm_up_declared;
        let scope = crate::caller_scope::CallerScope::new(
            crate::auth::ANONYMOUS,
            auth.credential_key(&nothing),
        );
        let key = PoolKey::new(&scope, declared);
        let mut warmed = 0;
        for _ in 0..cfg.pool.warm_up {
            if self.is_draining() {
                break;
            }
            match self
                .open_session(declared, auth.upstream_headers(&nothing))
                .await
            {
                Ok((session, _)) if self.is_draining() => {
                    session.close().await;
                    break;
                }
                Ok((session, inbound)) => {
                    self.pool
                        .checkin(key.clone(), Lease::fresh(session, inbound), &cfg.pool)
                        .await;
                    warmed += 1;
                }
                Err(rejection) => {
                    tracing::warn!(
                        reason = rejection.reason(),
                        error = %rejection.message(),
                        "pool warm-up stopped: could not open a legacy session (calls open their own)"
                    );
                    break;
                }
            }
        }
        tracing::info!(warmed, capabilities = %key.capabilities, "legacy session pool warmed");
        warmed
    }

    /// Gives a session back after a clean completion (pooled, or closed per `pool.mode`).
    pub async fn return_session(&self, key: PoolKey, lease: Lease) {
        self.pool.checkin(key, lease, &self.config().pool).await;
    }

    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
        self.metrics.draining.set(1);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Hook (long-lived responses): listen streams send their final response and
    /// end, legacy GET streams end. Call once the listener stops accepting (idempotent).
    pub fn begin_shutdown(&self) {
        self.long_lived.begin_shutdown();
    }

    /// The checks behind `/readyz` (see [`crate::readiness`]).
    pub async fn readiness(&self) -> Readiness {
        crate::readiness::evaluate(self, &self.upstream_check).await
    }

    /// Opens a legacy session declaring what `declared` allows, in the shape of the legacy
    /// version the server is expected to negotiate.
    pub async fn open_session(
        &self,
        declared: &Declared,
        headers: HeaderMap,
    ) -> Result<(LegacySession, mpsc::Receiver<Inbound>), Rejection> {
        match self.upstream().open(declared, headers).await {
            Ok((mut session, rx)) => {
                self.metrics.legacy_sessions_opened.inc();
                session.track_with(self.metrics.legacy_sessions_active.clone());
                Ok((session, rx))
            }
            Err(e) => {
                let rej = crate::upstream_error::session_rejection(&e);
                self.metrics
                    .legacy_sessions_failed
                    .with_label_values(&[rej.reason()])
                    .inc();
                Err(rej)
            }
        }
    }
}

/// How a legacy-session failure is reported to the modern client (see [`crate::upstream_error`]).
pub use crate::upstream_error::session_rejection;
