//! `[state]`: how long a requestState lives and how large it may grow, and the key ring that
//! seals it, from `[[state.keys]]` or from a directory of key files.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;

use super::ConfigError;
use super::check::{duration, nonzero_duration, positive_size, resolve};
use super::raw::{RawState, RawStateKey};
use crate::state::{StateKeySpec, valid_key_id};

#[derive(Debug, Clone)]
pub struct StateConfig {
    pub ttl: Duration,
    pub max_bytes: usize,
    pub max_rounds: u32,
    /// Tolerated clock difference between replicas for `exp` / `iat` checks.
    pub clock_skew: Duration,
    /// When set, the key ring is (re)loaded from this directory instead of `state.keys`.
    pub keys_dir: Option<PathBuf>,
    pub keys: Vec<StateKeySpec>,
}

pub(super) fn state_config(
    raw: &RawState,
    base_dir: Option<&Path>,
) -> Result<StateConfig, ConfigError> {
    Ok(StateConfig {
        ttl: nonzero_duration("state.ttl", &raw.ttl)?,
        max_bytes: {
            let n = positive_size("state.max_bytes", raw.max_bytes)?;
            if n < 256 {
                return Err(ConfigError::new("state.max_bytes", "must be at least 256"));
            }
            n
        },
        max_rounds: {
            if raw.max_rounds == 0 {
                return Err(ConfigError::new("state.max_rounds", "must be at least 1"));
            }
            raw.max_rounds
        },
        clock_skew: duration("state.clock_skew", &raw.clock_skew)?,
        keys_dir: raw.keys_dir.as_ref().map(|d| resolve(base_dir, d)),
        keys: match (&raw.keys_dir, raw.keys.is_empty()) {
            (Some(_), false) => {
                return Err(ConfigError::new(
                    "state.keys_dir",
                    "set either state.keys_dir or [[state.keys]], not both",
                ));
            }
            (Some(dir), true) => load_keys_dir(&resolve(base_dir, dir))?,
            (None, _) => load_keys(&raw.keys, base_dir)?,
        },
    })
}

/// Decodes a 32-byte secret written as base64 (standard or URL-safe alphabet, padding optional).
pub fn decode_secret(text: &str) -> Result<[u8; 32], String> {
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    let cfg = GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
    let text = text.trim();
    let bytes = if text.contains(['-', '_']) {
        GeneralPurpose::new(&base64::alphabet::URL_SAFE, cfg).decode(text)
    } else {
        GeneralPurpose::new(&base64::alphabet::STANDARD, cfg).decode(text)
    }
    .map_err(|e| format!("not valid base64: {e}"))?;
    <[u8; 32]>::try_from(bytes.as_slice())
        .map_err(|_| format!("must decode to exactly 32 bytes, got {}", bytes.len()))
}

fn load_keys(
    raw: &[RawStateKey],
    base_dir: Option<&Path>,
) -> Result<Vec<StateKeySpec>, ConfigError> {
    if raw.is_empty() {
        return Err(ConfigError::new(
            "state.keys",
            "at least one key is required (generate one with `mrtr-gateway keygen`)",
        ));
    }
    let mut keys: Vec<StateKeySpec> = Vec::with_capacity(raw.len());
    for (i, k) in raw.iter().enumerate() {
        let key_path = format!("state.keys[{i}]");
        if !valid_key_id(&k.id) {
            return Err(ConfigError::new(
                format!("{key_path}.id"),
                "must be 1-32 characters of A-Z a-z 0-9 _ -",
            ));
        }
        if keys.iter().any(|seen| seen.id == k.id) {
            return Err(ConfigError::new(
                format!("{key_path}.id"),
                format!("duplicate key id {:?}", k.id),
            ));
        }
        let secret = match (&k.secret, &k.secret_file) {
            (Some(s), None) => {
                decode_secret(s).map_err(|m| ConfigError::new(format!("{key_path}.secret"), m))?
            }
            (None, Some(file)) => {
                let path = resolve(base_dir, file);
                let text = std::fs::read_to_string(&path).map_err(|e| {
                    ConfigError::new(
                        format!("{key_path}.secret_file"),
                        format!("cannot read {}: {e}", path.display()),
                    )
                })?;
                decode_secret(&text)
                    .map_err(|m| ConfigError::new(format!("{key_path}.secret_file"), m))?
            }
            _ => {
                return Err(ConfigError::new(
                    key_path,
                    "set exactly one of `secret` or `secret_file`",
                ));
            }
        };
        keys.push(StateKeySpec {
            id: k.id.clone(),
            secret,
        });
    }
    Ok(keys)
}

/// Loads a key ring from a directory (a mounted Kubernetes Secret, typically).
///
/// Every regular file whose name is a valid key id holds one base64 secret. The optional file
/// `primary` names the sealing key; without it the greatest id (by byte order) seals, so
/// date-like ids (`k2026-12-02`) rotate by simply adding a newer file. Names starting with
/// `.` are skipped (Kubernetes keeps `..data` and timestamped directories there).
pub fn load_keys_dir(dir: &Path) -> Result<Vec<StateKeySpec>, ConfigError> {
    let key = "state.keys_dir";
    let entries = std::fs::read_dir(dir)
        .map_err(|e| ConfigError::new(key, format!("cannot read {}: {e}", dir.display())))?;
    let mut keys: Vec<StateKeySpec> = Vec::new();
    let mut primary: Option<String> = None;
    for entry in entries {
        let entry = entry
            .map_err(|e| ConfigError::new(key, format!("cannot list {}: {e}", dir.display())))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        if !path.is_file() {
            continue;
        }
        let text = std::fs::read_to_string(&path)
            .map_err(|e| ConfigError::new(key, format!("cannot read {}: {e}", path.display())))?;
        if name == "primary" {
            primary = Some(text.trim().to_string());
            continue;
        }
        if !valid_key_id(&name) {
            return Err(ConfigError::new(
                key,
                format!(
                    "{name:?}: a key file's name is its key id (1-32 characters of A-Z a-z 0-9 _ -)"
                ),
            ));
        }
        let secret =
            decode_secret(&text).map_err(|m| ConfigError::new(key, format!("{name}: {m}")))?;
        keys.push(StateKeySpec { id: name, secret });
    }
    if keys.is_empty() {
        return Err(ConfigError::new(
            key,
            format!("no key files in {}", dir.display()),
        ));
    }
    keys.sort_by(|a, b| b.id.cmp(&a.id));
    if let Some(p) = primary {
        let pos = keys.iter().position(|k| k.id == p).ok_or_else(|| {
            ConfigError::new(key, format!("primary names {p:?}, which has no key file"))
        })?;
        let k = keys.remove(pos);
        keys.insert(0, k);
    }
    Ok(keys)
}
