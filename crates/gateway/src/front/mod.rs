//! The modern side: the 2026-07-28 Streamable HTTP endpoint.

pub mod accept;
pub mod admission;
pub mod conn_limits;
pub mod connection;
pub mod deps;
pub mod error_map;
pub mod handler;
pub mod ingress;
pub mod legacy_passthrough;
pub mod listen;
mod listen_filter;
pub mod listener;
pub mod long_lived;
pub mod passthrough_review;
pub mod request_body;
pub mod respond;
pub mod tls;
