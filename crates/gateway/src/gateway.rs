//! The composition root of the gateway library: every part built once, and reload.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use http::HeaderMap;

use crate::auth::Authenticator;
use crate::config::Config;
use crate::drain::Drain;
use crate::front::deps::{Front, RequestSlots};
use crate::front::long_lived::LongLived;
use crate::legacy::pool::{PoolKey, SessionPool};
use crate::metrics::Metrics;
use crate::mrtr::deps::Engine;
use crate::mrtr::parking::ParkingLot;
use crate::sessions::Sessions;
use crate::single_use::SingleUseStore;
use crate::state::{KeyRing, StateCodec, StateLimits};

/// The composition root of the library: builds every part once, hands each layer its own
/// runtime ([`Engine`] for the MRTR engine and the paths that share its sessions, [`Front`] for
/// the HTTP side), swaps what a reload changes, and owns the drain. No layer below takes a
/// `Gateway`; the admin listener, readiness and reload (above it) and tests do.
pub struct Gateway {
    config: Arc<ArcSwap<Config>>,
    /// The front's runtime: what the listener and the request path are handed.
    pub front: Arc<Front>,
    /// The engine's runtime.
    pub engine: Arc<Engine>,
    pub codec: Arc<StateCodec>,
    pub metrics: Arc<Metrics>,
    /// This process's identity among replicas (logs, metrics, parking references).
    pub instance_id: String,
    /// The wall clock the engine reads (a seam: tests give replicas clocks that differ).
    pub clock: crate::clock::Clock,
    /// The shutdown sequence (see [`crate::drain`]): readiness, the listener, long-lived
    /// responses and background tasks all watch it.
    pub drain: Drain,
    /// Blocked legacy calls waiting for their retry on this replica.
    pub parking: Arc<ParkingLot>,
    /// The upstream in force and the warm sessions between calls.
    pub sessions: Arc<Sessions>,
    /// Who is calling (rebuilt on reload, so key files are re-read).
    auth: Arc<ArcSwap<Authenticator>>,
    /// Where `requestState` ids are claimed (replaced on reload only as
    /// `SingleUseStore::reconfigured` decides, which never forgets a claim).
    single_use: Arc<ArcSwap<SingleUseStore>>,
    /// Hook (long-lived responses): listen and legacy GET streams; their count, their quotas.
    pub long_lived: Arc<LongLived>,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        // Whoever built the gateway may never have stopped it (tests, the demo).
        self.drain.stop();
    }
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
        let instance_id = config
            .replica
            .id
            .clone()
            .unwrap_or_else(crate::request_id::random_id);
        let metrics = Metrics::new(&instance_id);
        metrics.process().key_ring(config.state.keys.len());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            metrics.process().worker_threads(rt.metrics().num_workers());
        }
        metrics
            .engine()
            .state_keys(config.state.keys.iter().map(|k| k.id.as_str()));
        let parking = ParkingLot::new(metrics.parking());
        let auth = Authenticator::new(config.auth.clone()).map_err(|e| e.to_string())?;
        let single_use = SingleUseStore::build(&config.single_use, metrics.single_use())
            .map_err(|e| e.to_string())?;
        let drain = Drain::new();
        let (listen_streams, legacy_get_streams) = metrics.front().stream_gauges();
        let long_lived = crate::front::long_lived::LongLived::new(
            listen_streams,
            legacy_get_streams,
            drain.closing().clone(),
        );
        let pool = Arc::new(SessionPool::new(
            metrics.pool(),
            &config.pool,
            Some(long_lived.relay_handle()),
        ));
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(
                parking
                    .clone()
                    .run_sweeper(Duration::from_millis(500), drain.stopped().clone()),
            );
            rt.spawn(pool.clone().run_sweeper(drain.stopped().clone()));
        }
        let codec = Arc::new(
            StateCodec::new(&config.state.keys, config.state.ttl, config.state.max_bytes)
                .with_clock_skew(config.state.clock_skew),
        );
        let config = Arc::new(ArcSwap::from_pointee(config));
        let sessions = Arc::new(Sessions::new(
            config.clone(),
            pool.clone(),
            metrics.sessions(),
            metrics.limits(),
        ));
        let auth = Arc::new(ArcSwap::from_pointee(auth));
        let single_use = Arc::new(ArcSwap::from_pointee(single_use));
        let metrics = Arc::new(metrics);
        let long_lived = Arc::new(long_lived);
        let engine = Arc::new(Engine {
            config: config.clone(),
            codec: codec.clone(),
            metrics: metrics.engine(),
            limits: metrics.limits(),
            instance_id: instance_id.clone(),
            clock,
            parking: parking.clone(),
            sessions: sessions.clone(),
            auth: auth.clone(),
            single_use: single_use.clone(),
            relay: long_lived.relay_handle(),
            round_shapes: Default::default(),
            running: Default::default(),
            claimed_runs: crate::mrtr::claimed_runs::ClaimedRuns::new(),
        });
        let front = Arc::new(Front {
            engine: engine.clone(),
            config: config.clone(),
            auth: auth.clone(),
            codec: codec.clone(),
            metrics: metrics.front(),
            limits: metrics.limits(),
            sessions: sessions.clone(),
            long_lived: long_lived.clone(),
            instance_id: instance_id.as_str().into(),
            request_slots: RequestSlots::new(config.load().listen.max_concurrent_requests),
            tasks: Arc::new(crate::tasks::Tasks::new(
                metrics.tasks(),
                metrics.limits(),
                drain.draining().clone(),
            )),
        });
        let gateway = Arc::new(Gateway {
            config,
            front,
            engine,
            codec,
            metrics,
            instance_id,
            clock,
            drain,
            parking,
            sessions,
            auth,
            single_use,
            long_lived,
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

    /// Replaces the configuration (reload). The key ring, state limits and request-slot count
    /// follow; a changed `[upstream]` section swaps in a new upstream client.
    pub fn apply_config(&self, new: Config) -> Result<(), String> {
        let old = self.config();
        let auth = Authenticator::with_counters(new.auth.clone(), self.auth().counters().clone())
            .map_err(|e| e.to_string())?;
        // Never forgets a claim: see `SingleUseStore::reconfigured`. A store the claims move
        // away from is asked for as long as a claim made before this reload can live.
        let claim_horizon = [&old.state, &new.state]
            .iter()
            .map(|s| crate::mrtr::at_most_once::longest_claim(s.ttl, s.clock_skew))
            .max()
            .unwrap_or_default();
        let single_use = self
            .single_use()
            .reconfigured(&new.single_use, claim_horizon)
            .map_err(|e| e.to_string())?;
        self.auth.store(Arc::new(auth));
        if let Some(store) = single_use {
            tracing::info!(store = store.kind(), "single-use store replaced");
            self.single_use.store(Arc::new(store));
        }
        if format!("{:?}", old.upstream) != format!("{:?}", new.upstream) {
            // Another server (or another way to reach it) may ask other questions, and
            // describe its tools otherwise.
            self.engine.round_shapes.clear();
            self.engine.metrics.learned_rounds(0);
            self.front.tasks.forget_declared();
        }
        self.sessions
            .reconfigure(&old.upstream, &new.upstream, &new.pool);
        self.codec.replace_ring(KeyRing::new(&new.state.keys));
        self.metrics.process().key_ring(new.state.keys.len());
        self.engine
            .metrics
            .state_keys(new.state.keys.iter().map(|k| k.id.as_str()));
        self.codec.set_limits(StateLimits {
            ttl: new.state.ttl,
            max_bytes: new.state.max_bytes,
            clock_skew: new.state.clock_skew,
        });
        self.front
            .request_slots
            .resize(new.listen.max_concurrent_requests);
        self.config.store(Arc::new(new));
        Ok(())
    }

    /// The drain's wait for claimed retries (those whose client went away included): until
    /// they settle or `deadline` (`drain.deadline` after the listener stopped accepting);
    /// the ones still running then are cancelled and recorded as outcome lost at once.
    pub async fn finish_claimed_runs(
        &self,
        deadline: tokio::time::Instant,
    ) -> crate::mrtr::claimed_runs::Finished {
        self.engine.claimed_runs.finish(deadline).await
    }

    /// The drain's wait for unfinished tasks (see [`crate::tasks::Tasks::finish`]); returns
    /// how many it gave up on.
    pub async fn finish_tasks(&self, deadline: tokio::time::Instant) -> usize {
        self.front.tasks.finish(deadline).await
    }

    /// Cancels every parked call upstream and closes warm sessions (shutdown).
    pub async fn release_parked(&self) {
        self.parking.clear().await;
        self.sessions.pool().clear().await;
    }

    /// Opens `pool.warm_up` legacy sessions into the pool (at start), declaring
    /// `pool.warm_up_capabilities`, under the key an anonymous request with those capabilities
    /// will look for (see [`Sessions::warm`]); stops once the gateway drains.
    pub async fn warm_pool(&self) -> usize {
        let cfg = self.config();
        let auth = self.auth();
        let nothing = HeaderMap::new();
        let declared = &cfg.pool.warm_up_declared;
        let scope = crate::caller_scope::CallerScope::new(
            crate::auth::ANONYMOUS,
            auth.credential_key(&nothing),
        );
        let key = PoolKey::new(&scope, declared);
        self.sessions
            .warm(&key, declared, &auth.upstream_headers(&nothing), || {
                self.is_draining()
            })
            .await
    }

    /// The drain's first phase: readiness off (and the `draining` gauge at 1).
    pub fn start_draining(&self) {
        self.drain.begin();
        self.metrics.process().draining();
    }

    pub fn is_draining(&self) -> bool {
        self.drain.is_draining()
    }
}
