//! What the front (listener, request path, listen streams, legacy passthrough) is handed: its
//! own parts — request slots, long-lived responses, the authenticator — and the engine it
//! serves requests through.
//!
//! Built once by the composition root ([`crate::gateway::Gateway`]), which resizes the slots
//! and swaps the shared handles on reload.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use arc_swap::ArcSwap;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::auth::Authenticator;
use crate::config::Config;
use crate::metrics::{FrontMetrics, LimitHits};
use crate::mrtr::deps::Engine;
use crate::sessions::Sessions;
use crate::state::StateCodec;
use crate::tasks::Tasks;

use super::long_lived::LongLived;

pub struct Front {
    /// Where MRTR, forwarded and discover requests are served.
    pub engine: Arc<Engine>,
    pub config: Arc<ArcSwap<Config>>,
    pub auth: Arc<ArcSwap<Authenticator>>,
    /// Seals and opens the session ids of passed-through legacy clients.
    pub codec: Arc<StateCodec>,
    /// What the front records (requests, connections, bodies, streams, passthrough).
    pub metrics: Arc<FrontMetrics>,
    /// Where the limits the front enforces are counted.
    pub limits: LimitHits,
    pub sessions: Arc<Sessions>,
    /// Listen and legacy GET streams: their count, quotas and end.
    pub long_lived: Arc<LongLived>,
    /// Shared with every request's log context.
    pub instance_id: std::sync::Arc<str>,
    /// Bounds requests served at once (`listen.max_concurrent_requests`).
    pub request_slots: RequestSlots,
    /// Tool calls served as tasks, and `tasks/*`.
    pub tasks: Arc<Tasks>,
}

impl Front {
    /// The configuration in force (a snapshot: hold it for one request, not longer).
    pub fn config(&self) -> Arc<Config> {
        self.config.load_full()
    }

    pub fn auth(&self) -> Arc<Authenticator> {
        self.auth.load_full()
    }
}

/// The request slots: how many requests the front serves at once, resizable on reload.
pub struct RequestSlots {
    slots: Arc<Semaphore>,
    size: AtomicUsize,
}

impl RequestSlots {
    pub fn new(size: usize) -> RequestSlots {
        RequestSlots {
            slots: Arc::new(Semaphore::new(size)),
            size: AtomicUsize::new(size),
        }
    }

    /// A slot for one request, or `None` when all are taken.
    pub fn try_take(&self) -> Option<OwnedSemaphorePermit> {
        self.slots.clone().try_acquire_owned().ok()
    }

    /// A reload changed `listen.max_concurrent_requests`.
    pub fn resize(&self, want: usize) {
        let have = self.size.swap(want, Ordering::AcqRel);
        if want > have {
            self.slots.add_permits(want - have);
        } else if want < have {
            // Shrink by forgetting free permits now; the rest are forgotten as they return.
            let mut left = have - want;
            left -= self.slots.forget_permits(left);
            if left > 0 {
                let slots = self.slots.clone();
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
}
