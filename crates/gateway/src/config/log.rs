//! `[log]`: the log filter and the output format.

use super::{ConfigError, raw::RawLog};
use crate::telemetry::LogFormat;

#[derive(Debug, Clone)]
pub struct LogConfig {
    pub level: String,
    pub format: LogFormat,
}

pub(super) fn log_config(raw: &RawLog) -> Result<LogConfig, ConfigError> {
    Ok(LogConfig {
        level: {
            tracing_subscriber::EnvFilter::try_new(&raw.level)
                .map_err(|e| ConfigError::new("log.level", format!("not a log filter: {e}")))?;
            raw.level.clone()
        },
        format: match raw.format.as_str() {
            "json" => LogFormat::Json,
            "text" => LogFormat::Text,
            other => {
                return Err(ConfigError::new(
                    "log.format",
                    format!("must be \"json\" or \"text\", not {other:?}"),
                ));
            }
        },
    })
}
