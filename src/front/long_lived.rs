//! Responses that outlive an ordinary request: `subscriptions/listen` streams and the
//! standalone GET streams of passed-through legacy clients.
//!
//! They would otherwise hold a drain until its deadline, so they watch one gateway-wide
//! signal, fired when the listener stops accepting ([`LongLived::begin_shutdown`]): a listen
//! stream then ends with its graceful final response, a legacy GET stream simply ends (the
//! legacy client reopens it, on another replica if need be). This module also counts the
//! listen streams against `subscriptions.max_streams`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use tokio_util::sync::CancellationToken;

use crate::caller_scope::CallerScope;
use crate::legacy::relay::NotificationRelay;

pub struct LongLived {
    shutdown: CancellationToken,
    listen: Arc<ListenCount>,
    /// List-change and resource-update notifications seen on other sessions of this replica
    /// (per-call, pooled): many legacy servers (FastMCP among them) tell only the session whose
    /// request caused the change, which is never a listen stream's own session. Relayed per
    /// caller scope: only to the listen streams of the caller whose session heard them.
    relay: Arc<NotificationRelay>,
}

struct ListenCount {
    open: AtomicUsize,
    gauge: prometheus::IntGauge,
}

/// One admitted listen stream; dropping it frees the place.
pub struct ListenPlace(Weak<ListenCount>);

impl Drop for ListenPlace {
    fn drop(&mut self) {
        if let Some(count) = self.0.upgrade() {
            count.open.fetch_sub(1, Ordering::AcqRel);
            count.gauge.dec();
        }
    }
}

impl LongLived {
    /// `gauge` shows the listen streams open now.
    pub fn new(gauge: prometheus::IntGauge) -> LongLived {
        LongLived {
            relay: Arc::new(NotificationRelay::new()),
            shutdown: CancellationToken::new(),
            listen: Arc::new(ListenCount {
                open: AtomicUsize::new(0),
                gauge,
            }),
        }
    }

    /// Ends every long-lived response (idempotent).
    pub fn begin_shutdown(&self) {
        self.shutdown.cancel();
    }

    /// Fires once the shutdown has begun.
    pub fn shutdown(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// A place for one more listen stream, or `None` when `max` are open.
    pub fn admit_listen(&self, max: usize) -> Option<ListenPlace> {
        self.listen
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()?;
        self.listen.gauge.inc();
        Some(ListenPlace(Arc::downgrade(&self.listen)))
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_bounded_and_returned_on_drop() {
        let gauge = prometheus::IntGauge::new("g", "g").unwrap();
        let l = LongLived::new(gauge.clone());
        let a = l.admit_listen(2).unwrap();
        let _b = l.admit_listen(2).unwrap();
        assert!(l.admit_listen(2).is_none());
        assert_eq!((l.listen_streams(), gauge.get()), (2, 2));
        drop(a);
        assert_eq!((l.listen_streams(), gauge.get()), (1, 1));
        assert!(l.admit_listen(2).is_some());
        assert!(!l.shutdown().is_cancelled());
        l.begin_shutdown();
        l.begin_shutdown();
        assert!(l.shutdown().is_cancelled());
    }
}
