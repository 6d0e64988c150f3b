//! The subcommands of the `mrtr-gateway` binary.

pub mod check_config;
pub mod inspect_state;
pub mod serve;

pub use mrtr_gateway::config::new_key as keygen;

/// Exit status for configuration errors (EX_CONFIG is 78; the project uses EX_USAGE, 64,
/// for every bad-config exit so scripts have one number to check).
pub const EXIT_CONFIG: i32 = 64;
