//! The legacy side: the gateway as a client of a 2024-11-05 … 2025-11-25 MCP server, over
//! Streamable HTTP, the 2024-11-05 HTTP+SSE transport, or stdio.

pub mod exchange;
pub mod h1;
pub mod handshake;
pub mod http;
pub mod http_conns;
pub mod http_sse;
pub mod http_stream;
pub mod pending;
pub mod pool;
pub mod relay;
pub mod roots_refresh;
pub mod server_request;
pub mod session;
pub mod spawn_backoff;
pub mod stdio;
pub mod stdio_upstream;
pub mod streamable_http;
pub mod upstream;
pub mod wire;
