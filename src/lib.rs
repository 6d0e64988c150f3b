//! The `mrtr-gateway` binaries' library: the command line and its subcommands. The gateway
//! itself is `mrtr_gateway` (crates/gateway); see `docs/architecture.md` for the layers.
#![forbid(unsafe_code)]

pub mod cli;
pub mod commands;
