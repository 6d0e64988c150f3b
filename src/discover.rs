//! The cached legacy `InitializeResult`, source of `server/discover` and of the identity
//! stamped on every result.
//!
//! Every legacy session the gateway opens refreshes the cache for free; when no call has
//! refreshed it within `discover.refresh`, the next reader opens a short session (declaring no
//! capabilities) just to read it. Only one such refresh runs at a time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use serde_json::Value;

use crate::error::Rejection;
use crate::gateway::Gateway;

pub struct Snapshot {
    pub init: Value,
    pub at: Instant,
}

pub struct DiscoverCache {
    snap: ArcSwapOption<Snapshot>,
    refresh: Duration,
    fetch_lock: tokio::sync::Mutex<()>,
}

impl DiscoverCache {
    pub fn new(refresh: Duration) -> Self {
        DiscoverCache {
            snap: ArcSwapOption::empty(),
            refresh,
            fetch_lock: tokio::sync::Mutex::new(()),
        }
    }

    /// Records an `InitializeResult` seen on any session.
    pub fn observe(&self, init: &Value) {
        self.snap.store(Some(Arc::new(Snapshot {
            init: init.clone(),
            at: Instant::now(),
        })));
    }

    /// The last snapshot, however old (for stamping identity without a round trip).
    pub fn peek(&self) -> Option<Arc<Snapshot>> {
        self.snap.load_full()
    }

    fn fresh(&self) -> Option<Arc<Snapshot>> {
        self.snap
            .load_full()
            .filter(|s| s.at.elapsed() < self.refresh)
    }

    /// A snapshot no older than the refresh interval, fetching one if needed.
    pub async fn get(&self, gw: &Gateway) -> Result<Arc<Snapshot>, Rejection> {
        if let Some(s) = self.fresh() {
            return Ok(s);
        }
        let _guard = self.fetch_lock.lock().await;
        if let Some(s) = self.fresh() {
            return Ok(s);
        }
        let (session, _inbound) = gw
            .open_session(&Default::default(), Default::default())
            .await?;
        let init = session.init_result().clone();
        session.close().await;
        self.observe(&init);
        Ok(self.snap.load_full().expect("just stored"))
    }
}
