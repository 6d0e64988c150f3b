//! `[runtime]`: how many threads run the gateway's tasks.

use std::num::NonZeroUsize;

use super::{ConfigError, raw::RawRuntime};

/// The most worker threads a configuration may ask for.
pub const MAX_WORKER_THREADS: u32 = 256;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeConfig {
    /// `None`: one per CPU the process may use (a cgroup CPU limit counts).
    pub worker_threads: Option<NonZeroUsize>,
}

pub(super) fn runtime_config(raw: &RawRuntime) -> Result<RuntimeConfig, ConfigError> {
    if raw.worker_threads > MAX_WORKER_THREADS {
        return Err(ConfigError::new(
            "runtime.worker_threads",
            format!(
                "at most {MAX_WORKER_THREADS} (0 = one per CPU), not {}",
                raw.worker_threads
            ),
        ));
    }
    Ok(RuntimeConfig {
        worker_threads: NonZeroUsize::new(raw.worker_threads as usize),
    })
}
