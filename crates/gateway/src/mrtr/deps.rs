//! What the MRTR engine (and the forward and discover paths that share its sessions) is
//! handed: the parts it reads, and nothing of the front's.
//!
//! Built once by the composition root ([`crate::gateway::Gateway`]); the shared handles
//! (configuration, authenticator, single-use store) are the same `ArcSwap`s the root swaps on
//! reload, so the engine always reads what is in force.

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::auth::Authenticator;
use crate::clock::Clock;
use crate::config::Config;
use crate::legacy::relay::NotificationRelay;
use crate::metrics::{EngineMetrics, LimitHits};
use crate::sessions::Sessions;
use crate::single_use::SingleUseStore;
use crate::state::StateCodec;

use super::claimed_runs::ClaimedRuns;
use super::long_call::RunningCalls;
use super::parking::ParkingLot;
use super::round_shapes::RoundShapes;

pub struct Engine {
    pub config: Arc<ArcSwap<Config>>,
    pub codec: Arc<StateCodec>,
    /// What the engine records (rounds, retries, states, time upstream, the policy stage).
    pub metrics: Arc<EngineMetrics>,
    /// Where the limits the engine enforces are counted.
    pub limits: LimitHits,
    /// This replica's identity (parking references).
    pub instance_id: String,
    pub clock: Clock,
    /// Blocked legacy calls waiting for their retry on this replica.
    pub parking: Arc<ParkingLot>,
    pub sessions: Arc<Sessions>,
    pub auth: Arc<ArcSwap<Authenticator>>,
    pub single_use: Arc<ArcSwap<SingleUseStore>>,
    /// Session-wide notifications heard on a call's session go to the caller's listen streams.
    pub relay: Arc<NotificationRelay>,
    /// What each round of a call asked the last time (closes known rounds early).
    pub round_shapes: RoundShapes,
    /// Calls that ended their request with a state-only round and run on here.
    pub running: Arc<RunningCalls>,
    /// Claimed retries running on this replica (a drain waits for them).
    pub claimed_runs: Arc<ClaimedRuns>,
}

impl Engine {
    /// The configuration in force (a snapshot: hold it for one request, not longer).
    pub fn config(&self) -> Arc<Config> {
        self.config.load_full()
    }

    pub fn auth(&self) -> Arc<Authenticator> {
        self.auth.load_full()
    }

    pub fn single_use(&self) -> Arc<SingleUseStore> {
        self.single_use.load_full()
    }
}
