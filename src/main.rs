//! The `mrtr-gateway` release binary: serve, keygen, check-config, inspect-state. It links no
//! test fixture (`tests/architecture.rs` checks), so `demo` only says where the demo is.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use mrtr_gateway_app::cli::{self, Cli};

fn main() -> ExitCode {
    cli::run(Cli::parse().command)
}
