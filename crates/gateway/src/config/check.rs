//! The value checks the sections share (durations, counts and sizes within bounds), and
//! file paths resolved against the configuration file's directory.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{ConfigError, parse_duration};

pub(super) fn duration(key: &str, text: &str) -> Result<Duration, ConfigError> {
    parse_duration(text).map_err(|m| ConfigError::new(key, m))
}

/// A duration greater than zero and at most `max`.
pub(super) fn bounded_duration(
    key: &str,
    text: &str,
    max: Duration,
) -> Result<Duration, ConfigError> {
    let d = nonzero_duration(key, text)?;
    if d > max {
        return Err(ConfigError::new(
            key,
            format!("must be at most {}", humantime::format_duration(max)),
        ));
    }
    Ok(d)
}

/// A duration from zero to `max`, inclusive.
pub(super) fn duration_up_to(
    key: &str,
    text: &str,
    max: Duration,
) -> Result<Duration, ConfigError> {
    let d = duration(key, text)?;
    if d > max {
        return Err(ConfigError::new(
            key,
            format!(
                "must be between \"0s\" and \"{}\"",
                humantime::format_duration(max)
            ),
        ));
    }
    Ok(d)
}

/// A count between `min` and `max`, inclusive.
pub(super) fn in_range(key: &str, n: u64, min: u64, max: u64) -> Result<usize, ConfigError> {
    if n < min || n > max {
        return Err(ConfigError::new(
            key,
            format!("must be between {min} and {max}"),
        ));
    }
    usize::try_from(n).map_err(|_| ConfigError::new(key, "too large"))
}

pub(super) fn nonzero_duration(key: &str, text: &str) -> Result<Duration, ConfigError> {
    let d = duration(key, text)?;
    if d.is_zero() {
        return Err(ConfigError::new(key, "must be greater than zero"));
    }
    Ok(d)
}

pub(super) fn positive_size(key: &str, n: u64) -> Result<usize, ConfigError> {
    if n == 0 {
        return Err(ConfigError::new(key, "must be greater than zero"));
    }
    usize::try_from(n).map_err(|_| ConfigError::new(key, "too large"))
}

pub(super) fn resolve(base_dir: Option<&Path>, file: &str) -> PathBuf {
    let p = Path::new(file);
    match base_dir {
        Some(dir) if p.is_relative() => dir.join(p),
        _ => p.to_path_buf(),
    }
}
