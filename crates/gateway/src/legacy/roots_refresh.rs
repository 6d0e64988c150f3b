//! Making a reused legacy session ask its new client for roots.
//!
//! A legacy session's client is, for the legacy server, one client for the session's whole
//! life. A pooled session serves many modern requests in turn, each with roots of its own, and
//! a server that cached the first client's roots (the TypeScript reference server does, per
//! session) would answer the next client from that cache. The legacy protocol has a signal for
//! exactly this: the gateway declares `roots.listChanged` in `initialize`, and before reusing a
//! session whose server has asked `roots/list` before, for a request that declares roots, it
//! sends `notifications/roots/list_changed`.
//!
//! **The race.** A server reacts to the notification by sending `roots/list`, asynchronously;
//! a call sent right behind the notification may be answered from the stale cache first. So
//! the gateway waits (at most `pool.roots_refresh_wait`) for that `roots/list` before sending
//! the call, and the engine treats it as the call's own question ([`notify_and_wait`] hands it
//! back; everything else that arrives meanwhile is kept, in order, for the call).
//!
//! **Servers that never re-ask.** FastMCP 1.x ignores the notification: it asks `roots/list`
//! inside each tool that needs roots, so its sessions never serve stale roots, and waiting
//! would only add `roots_refresh_wait` to every reuse. [`RootsRefreshMemory`] learns this per
//! upstream: a server that has re-asked even once is always waited for (a later timeout is
//! load, not indifference); one that let `pool.roots_refresh_probes` waits in a row time out
//! without ever re-asking is no longer waited for (the notification is still sent, it costs
//! nothing). The memory starts over when a reload changes `[upstream]`, and on a restart (a
//! legacy server upgraded in place restarts its pod, and the sidecar with it). A server that caches roots *and* ignores the notification
//! cannot be protected by pooling: `docs/operations.md` says when to choose
//! `pool.mode = "per-call"`.

use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;

use super::exchange::{Event, Exchange};
use super::session::SessionError;
use mrtr_wire::jsonrpc::{self, MessageKind};

pub const ROOTS_LIST_CHANGED: &str = "notifications/roots/list_changed";

/// What one refresh saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    /// The server asked `roots/list` within the wait.
    Reasked,
    /// It did not.
    Timeout,
}

#[derive(Debug, Default)]
struct Learned {
    /// The server has re-asked after a notification at least once.
    reasked_ever: bool,
    /// Waits in a row that timed out (counted only while `reasked_ever` is false).
    misses_in_a_row: u32,
}

/// What the gateway has learned about how this upstream treats the notification.
#[derive(Debug, Default)]
pub struct RootsRefreshMemory {
    learned: Mutex<Learned>,
}

impl RootsRefreshMemory {
    fn lock(&self) -> std::sync::MutexGuard<'_, Learned> {
        self.learned.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the next refresh should wait for the server's `roots/list`, given
    /// `pool.roots_refresh_probes`.
    pub fn should_wait(&self, probes: u32) -> bool {
        let l = self.lock();
        l.reasked_ever || l.misses_in_a_row < probes
    }

    /// Records what a refresh saw. Returns `true` when this observation is the one that
    /// makes the gateway stop waiting (worth one log line).
    pub fn record(&self, observed: Observed, probes: u32) -> bool {
        let mut l = self.lock();
        match observed {
            Observed::Reasked => {
                l.reasked_ever = true;
                l.misses_in_a_row = 0;
                false
            }
            Observed::Timeout if l.reasked_ever => false,
            Observed::Timeout => {
                l.misses_in_a_row = l.misses_in_a_row.saturating_add(1);
                l.misses_in_a_row == probes
            }
        }
    }

    /// Forgets what was learned (a reload changed the upstream).
    pub fn reset(&self) {
        *self.lock() = Learned::default();
    }
}

/// Whether `msg` is the server asking for roots.
pub fn is_roots_request(msg: &Value) -> bool {
    jsonrpc::classify(msg) == MessageKind::Request
        && msg.get("method").and_then(Value::as_str) == Some("roots/list")
}

/// Sends `notifications/roots/list_changed` on the exchange's session, then, unless `wait` is
/// zero, reads until the server asks `roots/list` (returned) or `wait` has passed (`None`).
/// Everything else read meanwhile stays in the exchange, in order, for the call.
pub async fn notify_and_wait(
    exchange: &mut Exchange,
    wait: Duration,
) -> Result<Option<Value>, SessionError> {
    exchange.session().notify(ROOTS_LIST_CHANGED, None).await?;
    if wait.is_zero() {
        return Ok(None);
    }
    let deadline = tokio::time::Instant::now() + wait;
    let asked = exchange
        .wait_for(
            |e| matches!(e, Event::Request(msg) if is_roots_request(msg)),
            deadline,
        )
        .await
        .map_err(|_| {
            SessionError::Gone(
                "the legacy session ended while its roots were being refreshed".into(),
            )
        })?;
    Ok(match asked {
        Some(Event::Request(msg)) => Some(msg),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_that_never_reasks_is_waited_for_probes_times_then_not_again() {
        let m = RootsRefreshMemory::default();
        assert!(m.should_wait(2));
        assert!(!m.record(Observed::Timeout, 2));
        assert!(m.should_wait(2));
        assert!(m.record(Observed::Timeout, 2), "the second miss decides");
        assert!(!m.should_wait(2));
        assert!(!m.record(Observed::Timeout, 2), "decided once");
        m.reset();
        assert!(m.should_wait(2), "a reload starts over");
    }

    #[test]
    fn a_server_that_reasked_once_is_always_waited_for() {
        let m = RootsRefreshMemory::default();
        m.record(Observed::Timeout, 2);
        m.record(Observed::Reasked, 2);
        for _ in 0..10 {
            assert!(!m.record(Observed::Timeout, 2));
        }
        assert!(
            m.should_wait(2),
            "a timeout after a re-ask is load, not indifference"
        );
    }

    #[test]
    fn only_a_roots_list_request_is_the_answer_to_the_notification() {
        let req = serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "roots/list"});
        assert!(is_roots_request(&req));
        let other = serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "ping"});
        assert!(!is_roots_request(&other));
        let note = serde_json::json!({"jsonrpc": "2.0", "method": "roots/list"});
        assert!(!is_roots_request(&note));
    }
}
