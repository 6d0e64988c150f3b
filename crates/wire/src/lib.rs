//! The bottom layer of mrtr-gateway: what travels on the wire, with no knowledge of the
//! gateway above it.
//!
//! - [`jsonrpc`]: JSON-RPC 2.0 framing (ids, requests, responses, error objects, codes);
//! - [`protocol`]: the 2026-07-28 request metadata, the method table, header value encoding and
//!   canonical JSON for the origin digest;
//! - [`sse`]: a bounded Server-Sent Events decoder (both framings legacy servers use).
#![forbid(unsafe_code)]

pub mod capabilities;
pub mod jsonrpc;
pub mod protocol;
pub mod sse;
