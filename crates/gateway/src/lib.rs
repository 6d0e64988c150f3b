//! mrtr-gateway: a stateless MCP 2026-07-28 front for legacy MCP servers.
//!
//! See `docs/architecture.md` for how the parts fit together.
#![forbid(unsafe_code)]

pub mod admin;
pub mod auth;
pub mod caller_scope;
pub mod clock;
pub mod config;
pub mod descriptor_budget;
pub mod discover;
pub mod drain;
pub mod error;
pub mod fair_share;
pub mod front;
#[cfg(test)]
mod future_size;
pub mod gateway;
pub mod inherited_fds;
pub mod legacy;
pub mod metrics;
pub mod mrtr;
pub mod policy;
pub mod readiness;
pub mod reload;
pub mod request_id;
pub mod sessions;
pub mod setting;
pub mod single_use;
pub mod state;
pub mod tasks;
pub mod telemetry;
pub mod tls;
pub mod translate;
pub mod upstream_check;
pub mod upstream_error;
