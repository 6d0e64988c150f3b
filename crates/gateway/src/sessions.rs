//! Where a request's legacy sessions come from: the upstream in force and the pool of warm
//! sessions. Opening (counted in the session metrics), checkout (warm, or new), giving a
//! session back, warm-up at start and the switch to a new upstream on reload all live here,
//! so the layers above ask for a session and never assemble one.

use std::sync::Arc;

use arc_swap::ArcSwap;
use http::HeaderMap;

use crate::config::{Config, PoolConfig, PoolMode, UpstreamConfig};
use crate::error::Rejection;
use crate::legacy::exchange::{Exchange, Reader};
use crate::legacy::pool::{Lease, PoolKey, SessionPool};
use crate::legacy::upstream::Upstream;
use crate::metrics::{LimitHits, SessionMetrics};
use crate::upstream_check::{CheckCredentials, CheckTiming, UpstreamCheck};
use mrtr_wire::capabilities::Declared;

pub struct Sessions {
    upstream: ArcSwap<Upstream>,
    pool: Arc<SessionPool>,
    /// The configuration in force (the root's handle): `[pool]` is read from it at each use.
    config: Arc<ArcSwap<Config>>,
    /// The cached, single-flight check that the upstream in force speaks MCP (`/readyz`).
    check: UpstreamCheck,
    metrics: Arc<SessionMetrics>,
    /// Handed to each upstream client built, for the limits its transports enforce.
    limits: LimitHits,
}

impl Sessions {
    pub fn new(
        config: Arc<ArcSwap<Config>>,
        pool: Arc<SessionPool>,
        metrics: Arc<SessionMetrics>,
        limits: LimitHits,
    ) -> Sessions {
        let upstream = Upstream::from_config(
            &config.load().upstream,
            limits.clone(),
            metrics.connections(),
        );
        Sessions {
            upstream: ArcSwap::from_pointee(upstream),
            pool,
            config,
            check: UpstreamCheck::new(metrics.checks()),
            metrics,
            limits,
        }
    }

    /// The legacy server in force.
    pub fn upstream(&self) -> Arc<Upstream> {
        self.upstream.load_full()
    }

    /// Whether the upstream in force speaks MCP (see [`crate::upstream_check`]).
    pub async fn check_upstream(
        &self,
        credentials: CheckCredentials,
        timing: CheckTiming,
    ) -> Result<String, String> {
        self.check.check(self.upstream(), credentials, timing).await
    }

    /// The warm sessions between calls.
    pub fn pool(&self) -> &Arc<SessionPool> {
        &self.pool
    }

    /// A reload: a changed `[upstream]` swaps in a new upstream client (warm sessions belong
    /// to the old one and are closed); the pool takes its new settings.
    pub fn reconfigure(&self, old: &UpstreamConfig, new: &UpstreamConfig, pool: &PoolConfig) {
        if format!("{old:?}") != format!("{new:?}") {
            let upstream = crate::config::redact::redacted_url(&new.url);
            tracing::info!(%upstream, "upstream changed; new calls use it");
            let hits = self.limits.clone();
            let upstream = Upstream::from_config(new, hits, self.metrics.connections());
            self.upstream.store(Arc::new(upstream));
            let pool = self.pool.clone();
            tokio::spawn(async move { pool.clear().await });
            // Another server, or another way to it: learn its roots handling anew. A reload
            // that leaves `[upstream]` as it was keeps what was learned (re-learning costs
            // `pool.roots_refresh_probes` waits of `pool.roots_refresh_wait`).
            self.pool.roots_memory().reset();
        }
        self.pool.set_timings(pool);
    }

    /// Opens a legacy session declaring what `declared` allows, in the shape of the legacy
    /// version the server is expected to negotiate.
    pub async fn open(
        &self,
        declared: &Declared,
        headers: HeaderMap,
    ) -> Result<Exchange, Rejection> {
        // Boxed: a warm session is the common case, and opening one (its initialize, its
        // GET stream) would make every call's future as large as the opening.
        match Box::pin(self.upstream().open(declared, headers)).await {
            Ok((mut session, rx)) => {
                self.metrics.opened();
                session.track_with(self.metrics.open_sessions());
                Ok(Exchange::new(session, Reader::new(rx)))
            }
            Err(e) => {
                let rej = crate::upstream_error::session_rejection(&e);
                self.metrics.failed(rej.reason());
                Err(rej)
            }
        }
    }

    /// A session for a call: a warm one from the pool, or a new one.
    pub async fn checkout(
        &self,
        key: &PoolKey,
        declared: &Declared,
        headers: HeaderMap,
    ) -> Result<Lease, Rejection> {
        if let Some(s) = self.pool.checkout(key, &self.config.load().pool).await {
            return Ok(s);
        }
        // Idle children count against stdio's child limit: make room rather than wait.
        if self.upstream().at_capacity() {
            self.pool.evict_one().await;
        }
        Ok(Lease::fresh(self.open(declared, headers).await?))
    }

    /// Gives a session back after a clean completion (pooled, or closed per `pool.mode`).
    pub async fn give_back(&self, key: PoolKey, lease: Lease) {
        self.pool
            .checkin(key, lease, &self.config.load().pool)
            .await;
    }

    /// Opens `pool.warm_up` sessions into the pool under `key`, declaring `declared` and
    /// sending `headers`. Stops at the first failure (the legacy server may still be starting;
    /// calls then open their own sessions) and once `draining` says so (shutdown closes the
    /// pool; a session opened after that is closed, not pooled). Returns how many were added.
    pub async fn warm(
        &self,
        key: &PoolKey,
        declared: &Declared,
        headers: &HeaderMap,
        draining: impl Fn() -> bool,
    ) -> usize {
        let config = self.config.load_full();
        let cfg = &config.pool;
        if cfg.warm_up == 0 || cfg.mode == PoolMode::PerCall {
            return 0;
        }
        let mut warmed = 0;
        for _ in 0..cfg.warm_up {
            if draining() {
                break;
            }
            match self.open(declared, headers.clone()).await {
                Ok(exchange) if draining() => {
                    exchange.close().await;
                    break;
                }
                Ok(exchange) => {
                    self.pool
                        .checkin(key.clone(), Lease::fresh(exchange), cfg)
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
}
