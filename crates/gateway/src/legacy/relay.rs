//! Session-wide notifications heard on a caller's legacy sessions, handed to that caller's
//! `subscriptions/listen` streams only.
//!
//! Many legacy servers (FastMCP 1.x among them) announce a change only to the session whose
//! request caused it, which is a call's session (running, or idle in the pool), never a listen
//! stream's own. The gateway relays such notifications to the listen streams of this replica —
//! but only to those of the same [`CallerScope`]: another principal, or the same principal
//! presenting another forwarded credential, may see a different server (other tools, other
//! resources), and must not even learn that something changed for someone else.
//!
//! One broadcast channel per scope that has a listen stream open; a scope's channel is dropped
//! once its last stream is gone, so the map is bounded by the open streams
//! (`subscriptions.max_streams`). A slow stream lags only behind its own caller's changes.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::Value;
use tokio::sync::broadcast;

use crate::caller_scope::CallerScope;

/// Notifications a listen stream may carry, buffered per scope (a lagging stream skips ahead).
const PER_SCOPE_CAPACITY: usize = 64;

/// The session-wide notifications listen streams care about.
pub fn is_session_wide(method: &str) -> bool {
    matches!(
        method,
        "notifications/tools/list_changed"
            | "notifications/prompts/list_changed"
            | "notifications/resources/list_changed"
            | "notifications/resources/updated"
    )
}

#[derive(Default)]
pub struct NotificationRelay {
    scopes: Mutex<HashMap<CallerScope, broadcast::Sender<Value>>>,
}

impl NotificationRelay {
    pub fn new() -> NotificationRelay {
        NotificationRelay::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<CallerScope, broadcast::Sender<Value>>> {
        self.scopes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What sessions of `scope` relay from now on, for one listen stream.
    pub fn subscribe(&self, scope: &CallerScope) -> broadcast::Receiver<Value> {
        let mut map = self.lock();
        map.retain(|_, tx| tx.receiver_count() > 0);
        map.entry(scope.clone())
            .or_insert_with(|| broadcast::channel(PER_SCOPE_CAPACITY).0)
            .subscribe()
    }

    /// Offers `msg`, heard on a legacy session working for `scope`, to that scope's streams.
    pub fn publish(&self, scope: &CallerScope, msg: &Value) {
        let mut map = self.lock();
        let Some(tx) = map.get(scope) else {
            return;
        };
        if tx.send(msg.clone()).is_err() {
            // Every stream of this scope has gone.
            map.remove(scope);
        }
    }

    /// Scopes with a listen stream open (tests, metrics).
    pub fn scopes(&self) -> usize {
        let mut map = self.lock();
        map.retain(|_, tx| tx.receiver_count() > 0);
        map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_notification_reaches_only_the_streams_of_its_scope() {
        let relay = NotificationRelay::new();
        let alice = CallerScope::new("alice", "");
        let bob = CallerScope::new("bob", "");
        let alice_other_token = CallerScope::new("alice", "digest-2");
        let mut a = relay.subscribe(&alice);
        let mut b = relay.subscribe(&bob);
        let mut a2 = relay.subscribe(&alice_other_token);
        let msg = json!({"method": "notifications/tools/list_changed"});
        relay.publish(&alice, &msg);
        assert_eq!(a.try_recv().unwrap(), msg);
        assert!(b.try_recv().is_err());
        assert!(a2.try_recv().is_err());
        // Nobody listening for carol: nothing is kept for her.
        relay.publish(&CallerScope::new("carol", ""), &msg);
        assert_eq!(relay.scopes(), 3);
        drop((a, a2));
        assert_eq!(relay.scopes(), 1, "a scope goes with its last stream");
        relay.publish(&bob, &msg);
        assert_eq!(b.try_recv().unwrap(), msg);
    }
}
