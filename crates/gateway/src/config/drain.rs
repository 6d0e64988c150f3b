//! `[drain]`: how a stopping gateway leaves service, first unready and then closed.

use std::time::Duration;

use super::check::{duration, nonzero_duration};
use super::{ConfigError, raw::RawDrain};

#[derive(Debug, Clone)]
pub struct DrainConfig {
    /// After SIGTERM, how long `/readyz` reports 503 before the listener stops accepting.
    pub readiness_delay: Duration,
    /// How long in-flight requests may take to finish after that.
    pub deadline: Duration,
}

pub(super) fn drain_config(raw: &RawDrain) -> Result<DrainConfig, ConfigError> {
    Ok(DrainConfig {
        readiness_delay: duration("drain.readiness_delay", &raw.readiness_delay)?,
        deadline: nonzero_duration("drain.deadline", &raw.deadline)?,
    })
}
