//! The modern side: the 2026-07-28 Streamable HTTP endpoint.

pub mod handler;
pub mod ingress;
pub mod legacy_passthrough;
pub mod listen;
pub mod listener;
pub mod long_lived;
pub mod respond;
pub mod tls;
