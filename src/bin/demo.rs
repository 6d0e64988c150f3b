//! `cargo run -- demo`: the release binary's commands plus the built-in demo, which needs the
//! in-repo legacy server and client from `mrtr-testkit` (see `mrtr_testkit::demo`). Built from
//! a source tree only; never shipped.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use mrtr_gateway_app::cli::{self, Cli, Command};

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Demo => {
            let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
            match cli::runtime(None).block_on(mrtr_testkit::demo::run()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("demo failed: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        other => cli::run(other),
    }
}
