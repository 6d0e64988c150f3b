//! Fixtures for mrtr-gateway's tests, benchmarks and demo; never part of the release binary.
//!
//! - [`legacy_server`]: a 2025-11-25 (and 2024-11-05 HTTP+SSE) legacy MCP server with scripted
//!   tools and fault injection;
//! - [`client`]: a small 2026-07-28 client that walks MRTR rounds;
//! - [`demo`]: the scripted end-to-end flow behind `cargo run -- demo`;
//! - [`nginx`]: Debian's nginx as a reverse proxy (tests, the load bench);
//! - [`proc`]: a process's memory and CPU time from `/proc` (the benchmarks).
#![forbid(unsafe_code)]

pub mod client;
pub mod demo;
pub mod legacy_server;
pub mod nginx;
pub mod proc;
