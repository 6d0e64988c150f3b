//! Warm legacy sessions, checked out exclusively by one call at a time.
//!
//! Opening a legacy session costs several round trips (`initialize`, `initialized`, the GET
//! stream) — for stdio, a whole process. The pool keeps sessions that ended a call cleanly and
//! hands them to the next call with the same key: the caller's scope (principal and forwarded
//! credential) and the declared capability set (a legacy session's capabilities are fixed at
//! `initialize`). A checked-out session belongs to one call only, so every server request on
//! it — GET stream included — belongs to that call. A session remembers whether its server has
//! asked for roots, so the next request declaring roots can make it ask again
//! ([`super::roots_refresh`]).
//!
//! A session is not returned after anything unusual (the engine abandons it instead: cancel,
//! timeout, error, parking). While a session sits idle its exchange answers the server's
//! `ping`s and relays its session-wide notifications; any other server request (no call can
//! own it) or a stream that ended discards the session at checkout.
//!
//! Who reads an idle session: under load a session given back is taken again within a
//! moment, so a task per idle spell (spawned at check-in, stopped and joined at checkout)
//! cost every call two task switches for nothing. A session given back *rests* unread; the
//! checkout handles what arrived meanwhile, in order, before the call uses it. One that rests
//! longer than `pool.idle_read_after` gets a task that reads it until it is taken
//! ([`SessionPool::run_sweeper`] starts them), so a quiet session still answers its server's
//! `ping`s and relays its notifications promptly. Bounds:
//! `pool.max_idle_per_key`, `pool.max_idle`, `pool.idle_timeout`, and each caller scope's
//! share of `max_idle` over all its capability sets (`pool.max_idle_per_principal`, unset a
//! quarter of `max_idle`; [`crate::fair_share`]). The pool evicts rather than refuses: a
//! session given back by a caller at its share replaces that caller's least recently used
//! idle session, and one given back to a full pool replaces the least recently used idle
//! session of any caller. So a caller cycling through many capability sets keeps its most
//! recent sessions without keeping every other caller from pooling.
//!
//! The pool follows the concurrency it sees: `max_idle_per_key` is where a key starts, not a
//! ceiling. A checkout that finds nothing idle is a miss; a session given back to a key that
//! is at its allowance and has had a miss since is kept, and the key's allowance grows by one
//! (up to the caller's share and `max_idle`). So 32 calls at once of one key settle at 32 warm
//! sessions instead of opening 24 new ones every round. An allowance shrinks back as the
//! sweeper closes the sessions nobody used for `idle_timeout`.
//! `pool.mode = "per-call"` turns pooling off for legacy servers that keep per-session state
//! across calls.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::exchange::{Event, Exchange};
use super::relay::{NotificationRelay, is_session_wide};
use super::roots_refresh::RootsRefreshMemory;
use crate::caller_scope::CallerScope;
use crate::config::{PoolConfig, PoolMode};
use crate::metrics::PoolMetrics;
use mrtr_wire::capabilities::Declared;

/// Which sessions may be shared.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolKey {
    /// Whom the session works for: principal and forwarded credential.
    pub scope: CallerScope,
    /// `Declared::label()` of the capabilities the session declared.
    pub capabilities: String,
}

impl PoolKey {
    /// The key a request of `scope` declaring `declared` uses.
    pub fn new(scope: &CallerScope, declared: &Declared) -> PoolKey {
        PoolKey {
            scope: scope.clone(),
            capabilities: declared.label(),
        }
    }
}

/// A session out of the pool (or newly opened), with what its earlier users left behind that
/// the next one must know.
pub struct Lease {
    pub exchange: Exchange,
    /// The server has asked this session's client for roots before: it may have cached them
    /// (see [`super::roots_refresh`]).
    pub roots_asked: bool,
}

impl Lease {
    /// A session nobody has used yet.
    pub fn fresh(exchange: Exchange) -> Lease {
        Lease {
            exchange,
            roots_asked: false,
        }
    }
}

struct Idle {
    roots_asked: bool,
    since: Instant,
    reading: Reading,
}

/// Who reads an idle session.
enum Reading {
    /// Nobody yet: whoever takes it reads what arrived meanwhile.
    Resting(Box<Exchange>),
    /// A task of its own, which hands the session back (with why it became unusable, if it
    /// did) when stopped.
    Watched {
        stop: CancellationToken,
        watcher: tokio::task::JoinHandle<(Box<Exchange>, Option<&'static str>)>,
    },
}

impl Idle {
    /// Stops the reading and ends the session.
    async fn close(self) {
        match self.reading {
            Reading::Resting(exchange) => exchange.close().await,
            Reading::Watched { stop, watcher } => {
                stop.cancel();
                if let Ok((exchange, _)) = watcher.await {
                    exchange.close().await;
                }
            }
        }
    }

    /// Gives a resting session a task that reads it; its notifications go to `scope`'s
    /// listen streams.
    fn watch(self, relay: Option<&Arc<NotificationRelay>>, scope: &CallerScope) -> Idle {
        let Reading::Resting(exchange) = self.reading else {
            return self;
        };
        let stop = CancellationToken::new();
        let relay = relay.map(|r| (r.clone(), scope.clone()));
        let watcher = tokio::spawn(watch(exchange, stop.clone(), relay));
        Idle {
            reading: Reading::Watched { stop, watcher },
            ..self
        }
    }

    /// The session back out of the pool, with why it became unusable, if it did: a resting
    /// session's arrivals are handled now; a watched one's task is stopped. `None`: the watch
    /// failed, and its session ended with it.
    async fn take(
        self,
        relay: Option<&Arc<NotificationRelay>>,
        scope: &CallerScope,
    ) -> Option<(Exchange, Option<&'static str>)> {
        match self.reading {
            Reading::Resting(mut exchange) => {
                let relay = relay.map(|r| (r, scope));
                while let Some(event) = exchange.next_ready().await {
                    if let Some(reason) = on_idle_event(event, relay) {
                        return Some((*exchange, Some(reason)));
                    }
                }
                Some((*exchange, None))
            }
            Reading::Watched { stop, watcher } => {
                stop.cancel();
                let (exchange, reason) = watcher.await.ok()?;
                Some((*exchange, reason))
            }
        }
    }
}

/// Reads an idle session's messages: relays session-wide notifications to the listen streams
/// of the caller the session works for (a change made by the call that just finished often
/// arrives after its response), ignores late leftovers of that call, and stops at the first
/// sign the session cannot be reused.
///
/// The task lives as long as the session idles, up to `pool.max_idle` of them, so its state
/// is kept small (a test holds it to a budget): the session stays in its box, the future
/// captures what it is given once (an `async fn` keeps a second copy), and it hands the box
/// back, since a task keeps room for its output as well.
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn would keep its arguments twice"
)]
fn watch(
    mut exchange: Box<Exchange>,
    stop: CancellationToken,
    relay: Option<(Arc<NotificationRelay>, CallerScope)>,
) -> impl Future<Output = (Box<Exchange>, Option<&'static str>)> + Send + 'static {
    async move {
        loop {
            let event = tokio::select! {
                biased;
                _ = stop.cancelled() => return (exchange, None),
                event = exchange.next() => event,
            };
            let relay = relay.as_ref().map(|(r, scope)| (r, scope));
            if let Some(reason) = on_idle_event(event, relay) {
                return (exchange, Some(reason));
            }
        }
    }
}

/// What an event read from an idle session does: a session-wide notification goes to the
/// listen streams of the session's caller; a request or the end of the server's stream makes
/// the session unusable (returned: why).
fn on_idle_event(
    event: Event,
    relay: Option<(&Arc<NotificationRelay>, &CallerScope)>,
) -> Option<&'static str> {
    match event {
        // `ping` never gets here (the exchange answers it, so a server's keep-alive does not
        // cost the session). Anything else nobody can answer now, and it may block the
        // server: start fresh later.
        Event::Request(_) => Some("unattributed_request"),
        Event::Notification { method, msg } => {
            if is_session_wide(&method)
                && let Some((relay, scope)) = relay
            {
                relay.publish(scope, &msg);
            }
            None
        }
        Event::StreamEnded { .. } | Event::Closed => Some("stream_ended"),
        // Late leftovers of the call that just finished.
        Event::Response { .. } | Event::CallEnded { .. } | Event::Invalid(_) => None,
    }
}

/// The idle sessions by key, with the counts every check-in asks for (all of them, and each
/// caller scope's) kept as sessions come and go, so no check-in walks every key under the
/// lock. Every change goes through these methods, which keep the counts right.
struct IdleSet<T = Idle> {
    by_key: HashMap<PoolKey, Vec<T>>,
    total: usize,
    by_scope: HashMap<CallerScope, usize>,
}

/// What the set needs of an entry: when it was given back (for the least recently used).
trait GivenBack {
    fn since(&self) -> Instant;
}

impl GivenBack for Idle {
    fn since(&self) -> Instant {
        self.since
    }
}

impl<T> Default for IdleSet<T> {
    fn default() -> Self {
        IdleSet {
            by_key: HashMap::new(),
            total: 0,
            by_scope: HashMap::new(),
        }
    }
}

impl<T: GivenBack> IdleSet<T> {
    fn total(&self) -> usize {
        self.total
    }

    /// Idle sessions working for `scope`, over all its capability sets.
    fn held_by(&self, scope: &CallerScope) -> usize {
        self.by_scope.get(scope).copied().unwrap_or(0)
    }

    fn contains_key(&self, key: &PoolKey) -> bool {
        self.by_key.contains_key(key)
    }

    fn len_of(&self, key: &PoolKey) -> usize {
        self.by_key.get(key).map_or(0, Vec::len)
    }

    fn push(&mut self, key: PoolKey, idle: T) {
        *self.by_scope.entry(key.scope.clone()).or_default() += 1;
        self.total += 1;
        self.by_key.entry(key).or_default().push(idle);
    }

    /// Counts `n` sessions of `scope` gone.
    fn forget(&mut self, scope: &CallerScope, n: usize) {
        if n == 0 {
            return;
        }
        self.total -= n;
        if let Some(c) = self.by_scope.get_mut(scope) {
            *c -= n;
            if *c == 0 {
                self.by_scope.remove(scope);
            }
        }
    }

    /// The session given back last under `key`.
    fn pop(&mut self, key: &PoolKey) -> Option<T> {
        let list = self.by_key.get_mut(key)?;
        let idle = list.pop();
        if list.is_empty() {
            self.by_key.remove(key);
        }
        if idle.is_some() {
            self.forget(&key.scope, 1);
        }
        idle
    }

    /// Takes the least recently given back idle session among the keys `which` accepts.
    fn take_lru(&mut self, which: impl Fn(&PoolKey) -> bool) -> Option<T> {
        let (key, i) = self
            .by_key
            .iter()
            .filter(|(k, _)| which(k))
            .flat_map(|(k, v)| v.iter().enumerate().map(move |(i, s)| (k, i, s.since())))
            .min_by_key(|(_, _, since)| *since)
            .map(|(k, i, _)| (k.clone(), i))?;
        let list = self.by_key.get_mut(&key)?;
        let victim = list.remove(i);
        if list.is_empty() {
            self.by_key.remove(&key);
        }
        self.forget(&key.scope, 1);
        Some(victim)
    }

    /// Takes every session `expired` accepts; each key that lost some is passed to `lost`
    /// with how many.
    fn take_where(
        &mut self,
        expired: impl Fn(&T) -> bool,
        mut lost: impl FnMut(&PoolKey, usize),
    ) -> Vec<T> {
        let mut out = Vec::new();
        let mut gone: Vec<(CallerScope, usize)> = Vec::new();
        for (key, list) in self.by_key.iter_mut() {
            if !list.iter().any(&expired) {
                continue;
            }
            let (old, keep): (Vec<T>, Vec<T>) =
                std::mem::take(list).into_iter().partition(&expired);
            *list = keep;
            lost(key, old.len());
            gone.push((key.scope.clone(), old.len()));
            out.extend(old);
        }
        self.by_key.retain(|_, v| !v.is_empty());
        for (scope, n) in gone {
            self.forget(&scope, n);
        }
        out
    }

    fn take_all(&mut self) -> Vec<T> {
        self.total = 0;
        self.by_scope.clear();
        self.by_key.drain().flat_map(|(_, v)| v).collect()
    }

    fn iter(&self) -> impl Iterator<Item = &T> {
        self.by_key.values().flatten()
    }

    /// Replaces, in place, each entry of every key `due` accepts with what `f` makes of it;
    /// no entry comes or goes, so the counts stay right. Keys with no entry `due` accepts are
    /// left as they are.
    fn replace_where(&mut self, due: impl Fn(&T) -> bool, f: impl Fn(&PoolKey, T) -> T) {
        for (key, list) in self.by_key.iter_mut() {
            if !list.iter().any(&due) {
                continue;
            }
            *list = std::mem::take(list)
                .into_iter()
                .map(|i| if due(&i) { f(key, i) } else { i })
                .collect();
        }
    }
}

/// What a key's calls have asked of the pool lately.
#[derive(Debug, Default, Clone, Copy)]
struct Demand {
    /// Idle sessions the key may keep beyond `max_idle_per_key`.
    extra: usize,
    /// Checkouts that found nothing idle since the key last grew.
    misses: usize,
}

/// Keys whose demand is remembered; past it the memory starts over (each key then starts
/// from `max_idle_per_key` again).
const DEMAND_KEYS_MAX: usize = 4096;

pub struct SessionPool {
    idle: Mutex<IdleSet>,
    /// Locked after `idle` when both are held.
    demand: Mutex<HashMap<PoolKey, Demand>>,
    metrics: Arc<PoolMetrics>,
    /// Where idle sessions' session-wide notifications go (this replica's listen streams of
    /// the session's caller).
    relay: Option<Arc<NotificationRelay>>,
    /// How this upstream answers `notifications/roots/list_changed` on reused sessions.
    roots_memory: RootsRefreshMemory,
    /// `pool.idle_timeout` in milliseconds, for the sweeper (updated on reload).
    idle_timeout_ms: std::sync::atomic::AtomicU64,
    /// `pool.idle_read_after` in microseconds (updated on reload).
    read_after_us: std::sync::atomic::AtomicU64,
    /// Wakes the task that starts reading rested sessions: when a session starts resting
    /// while it waits for one (`rest_awaited`), or when a reload changes the wait.
    resting: tokio::sync::Notify,
    /// The task has no resting session to wait on: the next one to rest must wake it. Set
    /// before it looks, so a session that starts resting meanwhile is never missed.
    rest_awaited: std::sync::atomic::AtomicBool,
    /// Sessions being closed in the background: a session the pool refuses or lets go on a
    /// call's way is closed in a task, so that the call does not wait for its DELETE (or its
    /// child's exit). [`SessionPool::clear`] waits for them.
    closing: tokio_util::task::TaskTracker,
}

impl SessionPool {
    pub fn new(
        metrics: Arc<PoolMetrics>,
        cfg: &PoolConfig,
        relay: Option<Arc<NotificationRelay>>,
    ) -> SessionPool {
        SessionPool {
            idle: Mutex::new(IdleSet::default()),
            demand: Mutex::new(HashMap::new()),
            metrics,
            relay,
            roots_memory: RootsRefreshMemory::default(),
            idle_timeout_ms: std::sync::atomic::AtomicU64::new(cfg.idle_timeout.as_millis() as u64),
            read_after_us: std::sync::atomic::AtomicU64::new(cfg.idle_read_after.as_micros() as u64),
            resting: tokio::sync::Notify::new(),
            rest_awaited: std::sync::atomic::AtomicBool::new(false),
            closing: tokio_util::task::TaskTracker::new(),
        }
    }

    /// Closes a session in a task of its own (see [`SessionPool::closing`]).
    fn close_later(&self, closing: impl Future<Output = ()> + Send + 'static) {
        self.closing.spawn(closing);
    }

    /// What the gateway learned about roots refreshes on this upstream (reset on reload).
    pub fn roots_memory(&self) -> &RootsRefreshMemory {
        &self.roots_memory
    }

    /// A reload's `[pool]` timings.
    pub fn set_timings(&self, cfg: &PoolConfig) {
        use std::sync::atomic::Ordering::Relaxed;
        self.idle_timeout_ms
            .store(cfg.idle_timeout.as_millis() as u64, Relaxed);
        self.read_after_us
            .store(cfg.idle_read_after.as_micros() as u64, Relaxed);
        // A shorter wait applies to the sessions resting now.
        self.resting.notify_one();
    }

    fn read_after(&self) -> Duration {
        Duration::from_micros(
            self.read_after_us
                .load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// Sweeps idle sessions every second, and starts reading the sessions that rested
    /// `pool.idle_read_after`, until `shutdown`; then closes them all.
    pub async fn run_sweeper(
        self: std::sync::Arc<Self>,
        shutdown: tokio_util::sync::CancellationToken,
    ) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let watching = self.clone().watch_rested();
        tokio::pin!(watching);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => {
                    self.clear().await;
                    return;
                }
                _ = &mut watching => {}
                _ = tick.tick() => {
                    let ms = self.idle_timeout_ms.load(std::sync::atomic::Ordering::Relaxed);
                    self.sweep(Duration::from_millis(ms)).await;
                }
            }
        }
    }

    /// Gives each session that has rested `pool.idle_read_after` a task that reads it. Sleeps
    /// until the oldest resting session is due, or until one starts resting; never returns.
    async fn watch_rested(self: Arc<Self>) {
        use std::sync::atomic::Ordering::SeqCst;
        loop {
            self.rest_awaited.store(true, SeqCst);
            let oldest = self
                .lock()
                .iter()
                .filter(|i| matches!(i.reading, Reading::Resting(_)))
                .map(|i| i.since)
                .min();
            match oldest {
                None => self.resting.notified().await,
                Some(since) => {
                    // Sessions given back meanwhile are due later: no need to wake for them.
                    self.rest_awaited.store(false, SeqCst);
                    let due = since + self.read_after();
                    tokio::select! {
                        _ = tokio::time::sleep_until(due.into()) => {}
                        // A reload may have shortened the wait.
                        _ = self.resting.notified() => {}
                    }
                    self.watch_due();
                }
            }
        }
    }

    /// Starts reading every session that has rested `pool.idle_read_after`.
    fn watch_due(&self) {
        let after = self.read_after();
        let relay = self.relay.as_ref();
        self.lock().replace_where(
            |i| matches!(i.reading, Reading::Resting(_)) && i.since.elapsed() >= after,
            |key, i| i.watch(relay, &key.scope),
        );
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, IdleSet> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn demand(&self) -> std::sync::MutexGuard<'_, HashMap<PoolKey, Demand>> {
        self.demand.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A checkout of `key` found nothing idle.
    fn missed(&self, key: &PoolKey) {
        let mut demand = self.demand();
        if demand.len() >= DEMAND_KEYS_MAX && !demand.contains_key(key) {
            demand.clear();
        }
        demand.entry(key.clone()).or_default().misses += 1;
    }

    pub fn idle_count(&self) -> usize {
        self.lock().total()
    }

    /// Idle sessions working for `scope` now.
    pub fn idle_of(&self, scope: &CallerScope) -> usize {
        self.lock().held_by(scope)
    }

    /// A warm session for `key`, if one is idle and still usable.
    pub async fn checkout(&self, key: &PoolKey, cfg: &PoolConfig) -> Option<Lease> {
        if cfg.mode == PoolMode::PerCall {
            return None;
        }
        loop {
            let candidate = {
                let mut map = self.lock();
                let c = map.pop(key);
                self.metrics.idle_now(map.total());
                c
            };
            let Some(idle) = candidate else {
                self.metrics.checkout_miss();
                self.missed(key);
                return None;
            };
            let since = idle.since;
            let roots_asked = idle.roots_asked;
            let Some((exchange, watched)) = idle.take(self.relay.as_ref(), &key.scope).await else {
                self.metrics.discarded("unhealthy");
                continue;
            };
            let reason = if since.elapsed() >= cfg.idle_timeout {
                Some("idle_timeout")
            } else if !exchange.session().is_healthy() {
                Some("unhealthy")
            } else {
                watched
            };
            match reason {
                None => {
                    self.metrics.checkout_hit();
                    return Some(Lease {
                        exchange,
                        roots_asked,
                    });
                }
                Some(r) => {
                    self.metrics.discarded(r);
                    self.close_later(exchange.close());
                }
            }
        }
    }

    /// Returns a session after a clean completion, or closes it (in the background) when
    /// pooling is off or full.
    pub async fn checkin(&self, key: PoolKey, lease: Lease, cfg: &PoolConfig) {
        let Lease {
            exchange,
            roots_asked,
        } = lease;
        let (refused, exchange) = if cfg.mode == PoolMode::PerCall {
            (None, exchange)
        } else if !exchange.session().is_healthy() {
            (Some("unhealthy"), exchange)
        } else {
            match self.keep(key, exchange, roots_asked, cfg) {
                Err((reason, exchange)) => (Some(reason), *exchange),
                Ok(evicted) => {
                    if let Some((victim, reason)) = evicted {
                        self.metrics.discarded(reason);
                        self.close_later(victim.close());
                    }
                    return;
                }
            }
        };
        if let Some(r) = refused {
            self.metrics.discarded(r);
        }
        self.close_later(exchange.close());
    }

    /// Keeps `exchange` idle under `key` until it is checked out, making room first:
    /// the caller's own least recently used session goes when the caller holds its share,
    /// anyone's when the pool is full (returned, to be closed with its discard reason outside
    /// the lock). The session comes back with why when it cannot be kept.
    #[allow(clippy::type_complexity)]
    fn keep(
        &self,
        key: PoolKey,
        exchange: Exchange,
        roots_asked: bool,
        cfg: &PoolConfig,
    ) -> Result<Option<(Idle, &'static str)>, (&'static str, Box<Exchange>)> {
        let mut map = self.lock();
        let here = map.len_of(&key);
        if cfg.idle_share.per_caller == 0 || !self.room_for(&key, here, cfg) {
            return Err(("pool_full", Box::new(exchange)));
        }
        let evicted = if map.held_by(&key.scope) >= cfg.idle_share.per_caller {
            map.take_lru(|k| k.scope == key.scope)
                .map(|i| (i, "caller_share"))
        } else if map.total() >= cfg.max_idle {
            map.take_lru(|_| true).map(|i| (i, "lru"))
        } else {
            None
        };
        if evicted.is_none() && map.total() >= cfg.max_idle {
            return Err(("pool_full", Box::new(exchange)));
        }
        let idle = Idle {
            roots_asked,
            since: Instant::now(),
            reading: Reading::Resting(Box::new(exchange)),
        };
        let idle = if cfg.idle_read_after.is_zero() {
            idle.watch(self.relay.as_ref(), &key.scope)
        } else {
            idle
        };
        map.push(key, idle);
        self.metrics.idle_now(map.total());
        drop(map);
        if self
            .rest_awaited
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            self.resting.notify_one();
        }
        Ok(evicted)
    }

    /// Whether `key`, holding `here` idle sessions, may keep one more: below its allowance, or
    /// at it with a miss since it last grew (then it grows, within the caller's share and
    /// `max_idle`).
    fn room_for(&self, key: &PoolKey, here: usize, cfg: &PoolConfig) -> bool {
        if here < cfg.max_idle_per_key {
            return true;
        }
        // Only a key that missed has an entry: the usual give-back builds no key.
        let mut demand = self.demand();
        let Some(d) = demand.get_mut(key) else {
            return false;
        };
        if here < cfg.max_idle_per_key + d.extra {
            return true;
        }
        let ceiling = cfg.idle_share.per_caller.min(cfg.max_idle);
        if d.misses == 0 || here >= ceiling {
            return false;
        }
        d.misses -= 1;
        d.extra += 1;
        true
    }

    /// Closes idle sessions past `idle_timeout`; returns how many.
    pub async fn sweep(&self, idle_timeout: Duration) -> usize {
        let expired: Vec<Idle> = {
            let mut map = self.lock();
            let mut demand = self.demand();
            let out = map.take_where(
                |i| i.since.elapsed() >= idle_timeout,
                |key, n| {
                    // Sessions nobody needed for a whole idle_timeout: the key's demand has
                    // fallen, and its allowance with it.
                    if let Some(d) = demand.get_mut(key) {
                        d.extra = d.extra.saturating_sub(n);
                        d.misses = 0;
                    }
                },
            );
            demand.retain(|k, d| d.extra > 0 || d.misses > 0 || map.contains_key(k));
            self.metrics.idle_now(map.total());
            out
        };
        let n = expired.len();
        for i in expired {
            self.metrics.discarded("idle_timeout");
            i.close().await;
        }
        n
    }

    /// Closes one idle session (any key), to make room when the upstream is at its limit of
    /// live sessions (stdio children). Returns whether one was closed.
    pub async fn evict_one(&self) -> bool {
        let victim = {
            let mut map = self.lock();
            let v = map.take_lru(|_| true);
            self.metrics.idle_now(map.total());
            v
        };
        match victim {
            Some(i) => {
                self.metrics.discarded("evicted");
                i.close().await;
                true
            }
            None => false,
        }
    }

    /// Closes every idle session (shutdown, or an upstream change), and waits for those
    /// closing in the background.
    pub async fn clear(&self) {
        let all: Vec<Idle> = {
            let mut map = self.lock();
            let v = map.take_all();
            self.demand().clear();
            self.metrics.idle_now(0);
            v
        };
        for i in all {
            i.close().await;
        }
        self.closing.close();
        self.closing.wait().await;
        self.closing.reopen();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every idle session has a watch task, up to `pool.max_idle` (1,024 by default) of them.
    /// The watch was 2,840 bytes: the session unboxed and kept twice, and a read of the
    /// session that kept room for answering a ping inline. At 400 bytes or less, the task
    /// with its header stays within jemalloc's 512-byte size class.
    #[test]
    fn an_idle_sessions_watch_stays_small() {
        let size = crate::future_size::returned3(watch);
        eprintln!("pool::watch: {size} bytes");
        assert!(size <= 400, "the watch's state grew to {size} bytes");
    }

    struct Entry(Instant);

    impl GivenBack for Entry {
        fn since(&self) -> Instant {
            self.0
        }
    }

    fn key(principal: &str, caps: &str) -> PoolKey {
        PoolKey {
            scope: CallerScope::new(principal, ""),
            capabilities: caps.into(),
        }
    }

    /// The kept counts against counting every entry.
    fn check(set: &IdleSet<Entry>) {
        let all: usize = set.by_key.values().map(Vec::len).sum();
        assert_eq!(set.total(), all, "total");
        let mut scopes: HashMap<&CallerScope, usize> = HashMap::new();
        for (k, v) in &set.by_key {
            assert!(!v.is_empty(), "no empty list is kept");
            *scopes.entry(&k.scope).or_default() += v.len();
        }
        for (scope, n) in &scopes {
            assert_eq!(set.held_by(scope), *n, "held by {scope:?}");
        }
        assert_eq!(set.by_scope.len(), scopes.len(), "no scope counted at zero");
    }

    #[test]
    fn the_kept_counts_follow_every_change() {
        let t0 = Instant::now();
        let at = |ms: u64| Entry(t0 + Duration::from_millis(ms));
        let keys = [
            key("alice", ""),
            key("alice", "roots"),
            key("bob", ""),
            key("carol", "roots"),
        ];
        let mut set: IdleSet<Entry> = IdleSet::default();
        // A deterministic mix of give-backs and takes over four keys and three scopes.
        let mut clock = 0;
        for round in 0..40usize {
            let k = &keys[round % keys.len()];
            for _ in 0..(round % 3) + 1 {
                clock += 1;
                set.push(k.clone(), at(clock));
            }
            check(&set);
            if round % 4 == 1 {
                assert!(set.pop(&keys[(round + 1) % keys.len()]).is_some() || round < 4);
                check(&set);
            }
            if round % 5 == 2 {
                let scope = k.scope.clone();
                set.take_lru(|key| key.scope == scope);
                check(&set);
            }
            if round % 7 == 3 {
                set.take_lru(|_| true);
                check(&set);
            }
        }
        assert!(set.total() > 10, "the mix leaves sessions idle");
        assert!(set.pop(&key("nobody", "")).is_none());
        check(&set);

        // The least recently given back goes first, within the accepted keys.
        let oldest = set
            .by_key
            .iter()
            .filter(|(k, _)| k.scope.principal == "bob")
            .flat_map(|(_, v)| v.iter().map(|e| e.0))
            .min()
            .expect("bob has sessions idle");
        let taken = set
            .take_lru(|k| k.scope.principal == "bob")
            .expect("one of bob's");
        assert_eq!(taken.0, oldest);
        check(&set);

        // Expiry by age, with what each key lost.
        let cut = t0 + Duration::from_millis(clock / 2);
        let before = set.total();
        let mut lost = 0;
        let expired = set.take_where(|e| e.0 < cut, |_, n| lost += n);
        assert_eq!(expired.len(), lost);
        assert!(!expired.is_empty() && expired.iter().all(|e| e.0 < cut));
        assert_eq!(set.total(), before - lost);
        assert!(set.iter().all(|e| e.0 >= cut));
        check(&set);

        let rest = set.take_all();
        assert_eq!(rest.len(), before - lost);
        assert_eq!(set.total(), 0);
        assert_eq!(set.held_by(&CallerScope::new("alice", "")), 0);
        check(&set);
    }
}
