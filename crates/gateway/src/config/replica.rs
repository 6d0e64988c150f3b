//! `[replica]`: the instance id this process goes by (generated at start when unset).

use super::{ConfigError, raw::RawReplica, valid_key_id};

#[derive(Debug, Clone)]
pub struct ReplicaConfig {
    /// This process's instance id; `None` means generate one at start.
    pub id: Option<String>,
}

pub(super) fn replica_config(raw: &RawReplica) -> Result<ReplicaConfig, ConfigError> {
    Ok(ReplicaConfig {
        id: if raw.id.is_empty() {
            None
        } else if valid_key_id(&raw.id) {
            Some(raw.id.clone())
        } else {
            return Err(ConfigError::new(
                "replica.id",
                "must be 1-32 characters of A-Z a-z 0-9 _ - (or empty to generate one)",
            ));
        },
    })
}
