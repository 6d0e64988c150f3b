//! Responses that outlive an ordinary request: `subscriptions/listen` streams and the
//! standalone GET streams of passed-through legacy clients.
//!
//! They would otherwise hold a drain until its deadline, so they watch one gateway-wide
//! signal, the drain's closing phase ([`crate::drain::Drain::close`], when the listener stops
//! accepting): a listen
//! stream then ends with its graceful final response, a legacy GET stream simply ends (the
//! legacy client reopens it, on another replica if need be).
//!
//! They do not hold a request slot once they stream ([`mark`], and
//! [`super::admission::hold_until_done`]); instead each kind has a cap per replica, divided
//! between callers ([`crate::caller_scope::Caller`]) as [`crate::fair_share::FairShare`] says:
//! a share per caller from its first stream and a reserve for callers holding none, counted
//! here: listen streams against `subscriptions.max_streams` / `max_streams_per_principal`,
//! legacy GET streams against `legacy_clients.max_get_streams` /
//! `max_get_streams_per_principal`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use http::Response;
use tokio_util::sync::CancellationToken;

use crate::caller_scope::Caller;
use crate::caller_scope::CallerScope;
use crate::fair_share::FairShare;
pub use crate::fair_share::ShareRefusal as StreamRefusal;
use crate::legacy::relay::NotificationRelay;

pub struct LongLived {
    shutdown: CancellationToken,
    listen: Arc<StreamCount>,
    legacy_get: Arc<StreamCount>,
    /// List-change and resource-update notifications seen on other sessions of this replica
    /// (per-call, pooled): many legacy servers (FastMCP among them) tell only the session whose
    /// request caused the change, which is never a listen stream's own session. Relayed per
    /// caller scope: only to the listen streams of the caller whose session heard them.
    relay: Arc<NotificationRelay>,
}

/// The open streams of one kind: in all (also readable without the lock), and per caller.
struct StreamCount {
    open: AtomicUsize,
    per_caller: Mutex<HashMap<Caller, usize>>,
    gauge: prometheus::IntGauge,
}

/// One admitted long-lived stream; dropping it frees the place.
pub struct StreamPlace {
    count: Weak<StreamCount>,
    caller: Caller,
}

impl Drop for StreamPlace {
    fn drop(&mut self) {
        if let Some(count) = self.count.upgrade() {
            let mut per = count.per_caller.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(n) = per.get_mut(&self.caller) {
                *n -= 1;
                if *n == 0 {
                    per.remove(&self.caller);
                }
            }
            count.open.fetch_sub(1, Ordering::AcqRel);
            count.gauge.dec();
        }
    }
}

impl StreamCount {
    fn new(gauge: prometheus::IntGauge) -> Arc<StreamCount> {
        Arc::new(StreamCount {
            open: AtomicUsize::new(0),
            per_caller: Mutex::new(HashMap::new()),
            gauge,
        })
    }

    fn admit(
        self: &Arc<Self>,
        caller: &Caller,
        share: &FairShare,
    ) -> Result<StreamPlace, StreamRefusal> {
        let mut per = self.per_caller.lock().unwrap_or_else(|e| e.into_inner());
        let mine = per.get(caller).copied().unwrap_or(0);
        share.admit(self.open.load(Ordering::Acquire), mine)?;
        per.insert(caller.clone(), mine + 1);
        self.open.fetch_add(1, Ordering::AcqRel);
        self.gauge.inc();
        Ok(StreamPlace {
            count: Arc::downgrade(self),
            caller: caller.clone(),
        })
    }
}

/// Marks a response as long-lived: it gives its request slot back once it starts.
#[derive(Debug, Clone, Copy)]
struct LongLivedResponse;

pub fn mark<B>(response: &mut Response<B>) {
    response.extensions_mut().insert(LongLivedResponse);
}

pub fn is_long_lived<B>(response: &Response<B>) -> bool {
    response.extensions().get::<LongLivedResponse>().is_some()
}

impl LongLived {
    /// The gauges show the listen streams and the legacy GET streams open now; `closing` is
    /// the drain's closing phase, which ends them all.
    pub fn new(
        listen_gauge: prometheus::IntGauge,
        legacy_get_gauge: prometheus::IntGauge,
        closing: CancellationToken,
    ) -> LongLived {
        LongLived {
            relay: Arc::new(NotificationRelay::new()),
            shutdown: closing,
            listen: StreamCount::new(listen_gauge),
            legacy_get: StreamCount::new(legacy_get_gauge),
        }
    }

    /// Fires once the shutdown has begun.
    pub fn shutdown(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// A place for one more listen stream of `caller` under `share` (of
    /// `subscriptions.max_streams`), or which limit refused it.
    pub fn admit_listen(
        &self,
        caller: &Caller,
        share: &FairShare,
    ) -> Result<StreamPlace, StreamRefusal> {
        self.listen.admit(caller, share)
    }

    /// A place for one more passed-through legacy GET stream of `caller` under `share` (of
    /// `legacy_clients.max_get_streams`).
    pub fn admit_legacy_get(
        &self,
        caller: &Caller,
        share: &FairShare,
    ) -> Result<StreamPlace, StreamRefusal> {
        self.legacy_get.admit(caller, share)
    }

    /// Offers a session-wide notification seen on a session working for `scope` to that
    /// caller's listen streams.
    pub fn relay(&self, scope: &CallerScope, msg: &serde_json::Value) {
        self.relay.publish(scope, msg);
    }

    /// The relay, for idle pooled sessions.
    pub fn relay_handle(&self) -> Arc<NotificationRelay> {
        self.relay.clone()
    }

    /// Notifications relayed from `scope`'s other sessions, for one listen stream of `scope`.
    pub fn relayed(
        &self,
        scope: &CallerScope,
    ) -> tokio::sync::broadcast::Receiver<serde_json::Value> {
        self.relay.subscribe(scope)
    }

    /// Listen streams open now.
    pub fn listen_streams(&self) -> usize {
        self.listen.open.load(Ordering::Acquire)
    }

    /// Passed-through legacy GET streams open now.
    pub fn legacy_get_streams(&self) -> usize {
        self.legacy_get.open.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(name: &str) -> Caller {
        Caller::of(name, "127.0.0.1".parse().unwrap(), false, 64)
    }

    fn share(size: usize, per_caller: usize, reserve: usize) -> FairShare {
        FairShare {
            size,
            per_caller,
            reserve,
            configured: true,
        }
    }

    #[test]
    fn places_are_bounded_in_all_and_per_caller_and_returned_on_drop() {
        let gauge = prometheus::IntGauge::new("g", "g").unwrap();
        let other = prometheus::IntGauge::new("o", "o").unwrap();
        let drain = crate::drain::Drain::new();
        let l = LongLived::new(gauge.clone(), other.clone(), drain.closing().clone());
        let (alice, bob, carol) = (caller("alice"), caller("bob"), caller("carol"));
        let three = share(3, 2, 0);
        let a = l.admit_listen(&alice, &three).unwrap();
        let _a2 = l.admit_listen(&alice, &three).unwrap();
        assert_eq!(
            l.admit_listen(&alice, &three).err(),
            Some(StreamRefusal::CallerShare)
        );
        let _b = l.admit_listen(&bob, &three).unwrap();
        assert_eq!(
            l.admit_listen(&carol, &three).err(),
            Some(StreamRefusal::Full)
        );
        assert_eq!((l.listen_streams(), gauge.get()), (3, 3));
        drop(a);
        assert_eq!((l.listen_streams(), gauge.get()), (2, 2));
        assert!(l.admit_listen(&alice, &three).is_ok());
        // The kinds are counted apart.
        let one = share(1, 1, 0);
        let _g = l.admit_legacy_get(&alice, &one).unwrap();
        assert_eq!((l.legacy_get_streams(), other.get()), (1, 1));
        assert_eq!(
            l.admit_legacy_get(&bob, &one).err(),
            Some(StreamRefusal::Full)
        );
        assert!(!l.shutdown().is_cancelled());
        drain.close();
        drain.close();
        assert!(l.shutdown().is_cancelled());
    }

    #[test]
    fn a_callers_share_applies_from_its_first_stream_and_newcomers_keep_room() {
        let l = LongLived::new(
            prometheus::IntGauge::new("g", "g").unwrap(),
            prometheus::IntGauge::new("o", "o").unwrap(),
            CancellationToken::new(),
        );
        let eight = share(8, 2, 1);
        let mut held = Vec::new();
        for name in ["a", "b", "c"] {
            let who = caller(name);
            held.push(l.admit_listen(&who, &eight).unwrap());
            held.push(l.admit_listen(&who, &eight).unwrap());
            // Held to its share with the replica far from full.
            assert_eq!(
                l.admit_listen(&who, &eight).err(),
                Some(StreamRefusal::CallerShare)
            );
        }
        let d = caller("d");
        held.push(l.admit_listen(&d, &eight).unwrap());
        assert_eq!(
            l.admit_listen(&d, &eight).err(),
            Some(StreamRefusal::Reserve)
        );
        held.push(l.admit_listen(&caller("e"), &eight).unwrap());
        assert_eq!(l.listen_streams(), 8);
    }

    #[test]
    fn a_marked_response_is_long_lived() {
        let mut r = Response::new(());
        assert!(!is_long_lived(&r));
        mark(&mut r);
        assert!(is_long_lived(&r));
    }
}
