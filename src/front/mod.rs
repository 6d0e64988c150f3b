//! The modern side: the 2026-07-28 Streamable HTTP endpoint.

pub mod handler;
pub mod ingress;
pub mod listener;
pub mod respond;
pub mod tls;
