//! What every configuration section is made of, below the sections themselves: the error
//! that names a key (and the environment variable it came from), durations, and per-call
//! rules. The leaves (`auth`, `single_use`, `policy`, …) validate their own sections with
//! these; `config` composes the sections and re-exports these names.

pub mod call_rule;
mod duration;

pub use duration::parse_duration;

/// A configuration problem, tied to the key it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Dotted key path, e.g. `state.ttl`, or `(file)` for problems with the file itself.
    pub key: String,
    /// The environment variable the value came from, when it did.
    pub env_var: Option<String>,
    pub message: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.env_var {
            Some(var) => write!(f, "{} (set by {var}): {}", self.key, self.message),
            None => write!(f, "{}: {}", self.key, self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

impl ConfigError {
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            key: key.into(),
            env_var: None,
            message: message.into(),
        }
    }
}
