//! The integration tests: one binary, one `support` module (gateways in front of the in-repo
//! legacy server, the Python and TypeScript SDK peers, nginx, Redis, TLS material, logs).
//!
//! Under nextest every test still runs in a process of its own. Run one area with a filter
//! on the module path, e.g. `cargo nextest run -E 'test(/^interop::/)'`.

#[macro_use]
mod support;

#[cfg(feature = "jemalloc")]
mod allocator;
mod architecture;
mod bridge;
mod client_errors;
mod demo;
mod deploy;
mod drain_claims;
mod dual_era;
mod fair_share;
mod faults;
mod front;
mod fuzz_h1;
mod fuzz_state;
mod image;
mod interop;
mod isolation;
mod listen;
mod long_calls;
mod ops;
mod policy;
mod pool;
mod readiness;
mod replicas;
mod rounds;
mod single_use_redis;
mod tasks;
mod traces;
mod transports;
mod trust;
mod trust_paths;
mod upstream_tls;
