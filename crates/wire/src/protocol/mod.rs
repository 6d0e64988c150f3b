//! The 2026-07-28 ("modern") side of the protocol: request metadata, the method table, and
//! header value encoding.

pub mod canonical;
pub mod header_value;
pub mod meta;
pub mod methods;

/// The only modern revision this gateway serves.
pub const MODERN_VERSION: &str = "2026-07-28";
pub const SUPPORTED_VERSIONS: &[&str] = &[MODERN_VERSION];
