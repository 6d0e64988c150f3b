//! Humane durations ("250ms", "30s", "10m", "1h 30m") for configuration values.

use std::time::Duration;

/// Parses a duration such as `"30s"` or `"10m"`; a bare number is refused so that a unit is
/// always explicit. `"0s"` is a valid zero.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    if t.is_empty() || t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "invalid duration {text:?}: give a number with a unit, e.g. \"30s\", \"10m\", \"250ms\""
        ));
    }
    humantime::parse_duration(t).map_err(|e| {
        format!("invalid duration {text:?} ({e}); expected e.g. \"30s\", \"10m\", \"250ms\"")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_are_required_and_understood() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("0s").unwrap(), Duration::ZERO);
        assert!(parse_duration("30").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("soon").is_err());
    }
}
