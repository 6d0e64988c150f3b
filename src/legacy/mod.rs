//! The legacy side: the gateway as a client of a 2024-11-05 … 2025-11-25 MCP server.

pub mod capabilities;
pub mod http;
pub mod session;
pub mod sse;
pub mod streamable_http;
pub mod upstream;
