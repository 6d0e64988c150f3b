//! The `mrtr-gateway` release binary: serve, keygen, check-config, inspect-state. It links no
//! test fixture (`tests/architecture.rs` checks), so `demo` only says where the demo is.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use mrtr_gateway_app::cli::{self, Cli};

/// The allocator of the shipped binary (see the `jemalloc` feature in Cargo.toml).
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    cli::run(Cli::parse().command)
}
