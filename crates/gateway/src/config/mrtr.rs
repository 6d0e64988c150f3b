//! `[mrtr]`: how long the gateway gathers a legacy server's parallel questions into one
//! `input_required` round.

use std::time::Duration;

use super::check::duration;
use super::{ConfigError, raw::RawMrtr};

#[derive(Debug, Clone)]
pub struct MrtrConfig {
    pub gather_window: Duration,
    pub gather_quiet: Duration,
    /// Round shapes remembered per replica (`mrtr::round_shapes`); 0 turns learning off.
    pub learned_rounds_max: usize,
}

pub(super) fn mrtr_config(raw: &RawMrtr) -> Result<MrtrConfig, ConfigError> {
    Ok(MrtrConfig {
        gather_window: duration("mrtr.gather_window", &raw.gather_window)?,
        gather_quiet: {
            let q = duration("mrtr.gather_quiet", &raw.gather_quiet)?;
            let w = duration("mrtr.gather_window", &raw.gather_window)?;
            if q > w {
                return Err(ConfigError::new(
                    "mrtr.gather_quiet",
                    "must not exceed mrtr.gather_window",
                ));
            }
            q
        },
        learned_rounds_max: usize::try_from(raw.learned_rounds_max).unwrap_or(usize::MAX),
    })
}
